"""The live view's server and the metrics endpoint, over a local channel: what the page
is given is what ``ackstream status`` reads, and ``/metrics`` is Prometheus text.
(tests/test_ui_browser.py opens the page itself in Chromium against a broker.)"""

import json
import os
import re
import urllib.error
import urllib.request

import pytest

from ackstream.sinks.dead_letters import read_dead_letters
from ackstream.ui.metrics import Statuses, serve_metrics
from ackstream.ui.status_sources import StatusSource, local_status
from ackstream.ui.view import serve_view

from test_status import EXPECTED, fill_channel


@pytest.fixture
def channel(tmp_path):
    fill_channel(tmp_path / "ch")
    return str(tmp_path / "ch")


def statuses_of(channel, **kw) -> Statuses:
    source = StatusSource("words", channel=channel)
    return Statuses(lambda: [source], **kw)


class Client:
    """The live view served on a free loopback port, asked over HTTP."""

    def __init__(self, statuses: Statuses):
        self.served = serve_view(statuses, 0)

    def get(self, path: str):
        return urllib.request.urlopen(self.served.url + path.lstrip("/"), timeout=30)

    def text(self, path: str) -> str:
        return self.get(path).read().decode()

    def json(self, path: str):
        return json.load(self.get(path))

    def page_token(self) -> str:
        found = re.search(r'<meta name="ackstream-token" content="([^"]+)">', self.text("/"))
        assert found, "the page carries no token"
        return found.group(1)

    def post(self, path: str, body, headers: dict | None = None) -> tuple[int, dict]:
        """POST ``body`` (JSON unless bytes) as the page does: its origin, its token,
        a JSON content type; ``headers`` replace those (a value None drops one)."""
        sent = {
            "content-type": "application/json",
            "origin": self.served.url.rstrip("/"),
            "x-ackstream-token": self.page_token(),
            **(headers or {}),
        }
        request = urllib.request.Request(
            self.served.url + path.lstrip("/"),
            data=body if isinstance(body, bytes) else json.dumps(body).encode(),
            headers={k: v for k, v in sent.items() if v is not None},
        )
        try:
            answer = urllib.request.urlopen(request, timeout=30)
        except urllib.error.HTTPError as refused:
            return refused.code, json.load(refused)
        return answer.status, json.load(answer)


@pytest.fixture
def client(channel):
    client = Client(statuses_of(channel))
    yield client
    client.served.close()


def test_the_page_is_given_what_status_reads(client, channel):
    shown = client.json("/api/topologies")
    (words,) = shown["topologies"]
    assert words["name"] == "words" and words["error"] is None
    assert {k: words["status"][k] for k in EXPECTED} == EXPECTED
    assert words["status"] == json.loads(json.dumps(local_status(channel, "words").to_dict()))
    letters = words["dead_letters"]
    assert (letters["count"], letters["where"]) == (1, f"{channel}/dead_letters")
    (letter,) = letters["rows"]
    assert (letter["letter"], letter["attempts"], letter["replayed_ms"]) == ("t:0:6", 2, None)
    assert words["can_replay"] is False  # a local channel with no broker known


def test_the_page_and_plotly_are_served_from_the_package(client):
    page = client.text("/")
    assert '<script src="/static/plotly.min.js">' in page
    assert "http" not in page  # nothing is loaded from elsewhere
    assert "plotly.js" in client.text("/static/plotly.min.js")[:2000]
    assert "Plotly.react" in client.text("/static/view.js")


def test_metrics_on_the_view_s_server_are_prometheus_text(client):
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None  # a 3xx is then raised, not followed

    answer = urllib.request.build_opener(NoRedirect).open(client.served.url + "metrics")
    assert answer.status == 200
    assert answer.headers["Content-Type"].startswith("text/plain")
    text = answer.read().decode().splitlines()
    assert "# TYPE ackstream_roots_total counter" in text
    assert "# TYPE ackstream_complete_latency_seconds histogram" in text
    assert (
        f'ackstream_roots_total{{outcome="acked",topology="words"}} {EXPECTED["acked"]}.0' in text
    )


def test_a_replay_must_be_confirmed_and_needs_the_source_s_brokers(client):
    asked = {"topology": "words", "letters": ["t:0:6"]}
    assert client.post("/api/replay", asked) == (400, {"error": "a replay must be confirmed"})
    code, said = client.post("/api/replay", {**asked, "confirmed": True})
    assert code == 400 and "dead-letters" in said["error"]
    assert client.post("/api/replay", {**asked, "topology": "other"})[0] == 404


def test_statuses_are_read_at_most_every_interval_and_a_failed_read_keeps_the_last(channel):
    reads = []

    class Source(StatusSource):
        def read(self, window_s=60.0):
            reads.append(window_s)
            if len(reads) > 1:
                raise OSError("the channel is gone")
            return super().read(window_s)

    statuses = Statuses(lambda: [Source("words", channel=channel)], min_interval_s=3600)
    first = statuses()
    assert statuses() == first and len(reads) == 1  # within the interval: no second read
    statuses.min_interval_s = 0
    assert statuses() == first and statuses.errors == {"words": "OSError: the channel is gone"}


def test_both_servers_answer_over_http_on_a_port_of_their_own(channel):
    statuses = statuses_of(channel)
    servers = [serve_metrics(statuses, 0), serve_view(statuses, 0)]
    try:
        metrics = urllib.request.urlopen(servers[0].url + "metrics", timeout=30)
        assert metrics.headers["Content-Type"].startswith("text/plain")
        assert b"# TYPE ackstream_complete_latency_seconds histogram" in metrics.read()
        page = urllib.request.urlopen(servers[1].url + "api/topologies", timeout=30)
        assert json.load(page)["topologies"][0]["status"]["acked"] == EXPECTED["acked"]
    finally:
        for server in servers:
            server.close()


def test_the_page_is_given_the_declared_graph_without_stage_counts(channel, tmp_path):
    from test_status import a_checkpoint

    source = StatusSource("words", channel=channel, checkpoint=a_checkpoint(tmp_path))
    client = Client(Statuses(lambda: [source]))
    try:
        (words,) = client.json("/api/topologies")["topologies"]
    finally:
        client.served.close()
    assert words["status"]["stages"] == {}
    graph = words["graph"]
    assert graph["nodes"] == ["spout", "parse", "check", "cents", "sink#1"]
    assert graph["edges"] == [
        ["spout", "parse"],
        ["parse", "check"],
        ["check", "cents"],
        ["cents", "sink#1"],
    ]
    assert graph["kinds"]["check"] == "fail_where"
    (letter,) = words["dead_letters"]["rows"]
    assert {k: letter[k] for k in ("key", "value", "timestamp_ms")} == {
        "key": None,
        "value": None,
        "timestamp_ms": None,
    }
    # when it died, as its file has it (the record's own time is not known here)
    (kept,) = read_dead_letters(os.path.join(channel, "dead_letters")).to_pylist()
    assert letter["written_ms"] == kept["written_ms"] is not None


def test_a_letter_s_key_and_value_are_shown_cut():
    from ackstream.ui.view import SHOWN_CHARS, letter_text

    assert letter_text(b"abc") == "abc" and letter_text(None) is None
    long = letter_text(b"x" * 500)
    assert len(long) == SHOWN_CHARS and long.endswith("…")
    assert letter_text(b"\xff-3") == "\ufffd-3"


def test_a_cross_site_form_post_is_refused(client):
    # what a form on another site sends: text/plain, that site's origin, no token
    form = b'{"topology": "words", "letters": ["t:0:6"], "confirmed": true}'
    foreign = {"origin": "http://127.0.0.1:9", "content-type": "text/plain"}
    code, said = client.post("/api/replay", form, {**foreign, "x-ackstream-token": None})
    assert code == 403 and "cross-site" in said["error"]
    # the same origin does not make a form's text/plain body acceptable
    code, said = client.post("/api/replay", form, {"content-type": "text/plain"})
    assert code == 403 and "application/json" in said["error"]
    code, said = client.post("/api/replay", form, {"origin": None})
    assert code == 403 and "Origin" in said["error"]


def test_a_replay_without_the_page_s_token_is_refused(client):
    asked = {"topology": "words", "letters": ["t:0:6"], "confirmed": True}
    for token in (None, "", "a-guess"):
        code, said = client.post("/api/replay", asked, {"x-ackstream-token": token})
        assert code == 403 and "x-ackstream-token" in said["error"], token


def test_a_referer_stands_for_a_missing_origin(client):
    asked = {"topology": "other", "letters": [], "confirmed": True}
    page = client.served.url + "?every=1000"
    assert client.post("/api/replay", asked, {"origin": None, "referer": page})[0] == 404
    code, _ = client.post("/api/replay", asked, {"origin": None, "referer": "http://x.test/"})
    assert code == 403


def test_with_the_page_s_token_the_replay_happens(channel, monkeypatch):
    import ackstream.ui.view as view

    replays = []
    monkeypatch.setattr(view, "_replay", lambda source, names: replays.append(names) or 1)
    source = StatusSource("words", channel=channel, upstream_bootstrap="127.0.0.1:9")
    client = Client(Statuses(lambda: [source]))
    try:
        asked = {"topology": "words", "letters": ["t:0:6"], "confirmed": True}
        assert client.post("/api/replay", asked) == (200, {"replayed": 1})
        assert replays == [{"t:0:6"}]
        assert client.post("/api/replay", asked, {"x-ackstream-token": "x"})[0] == 403
        assert len(replays) == 1
    finally:
        client.served.close()


def test_a_name_that_is_not_loopback_is_refused_on_a_loopback_view(client):
    # a site whose name resolves to this machine (DNS rebinding) is not the page
    request = urllib.request.Request(
        client.served.url + "api/topologies", headers={"host": "rebound.example:8050"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 403


def test_beyond_loopback_the_view_needs_an_access_token(channel):
    from ackstream.errors import OptionError

    with pytest.raises(OptionError, match="--access-token"):
        serve_view(statuses_of(channel), 0, host="0.0.0.0")
    # served with a token (on loopback here), every request must carry it
    served = serve_view(statuses_of(channel), 0, access_token="s3cret")
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(served.url + "metrics", timeout=30)
        assert refused.value.code == 401
        bearer = urllib.request.Request(
            served.url + "metrics", headers={"authorization": "Bearer s3cret"}
        )
        assert urllib.request.urlopen(bearer, timeout=30).status == 200
        first = urllib.request.urlopen(served.url + "?token=s3cret", timeout=30)
        cookie = first.headers["set-cookie"].split(";", 1)[0]
        with_cookie = urllib.request.Request(
            served.url + "api/topologies", headers={"cookie": cookie}
        )
        assert json.load(urllib.request.urlopen(with_cookie, timeout=30))["topologies"]
        wrong = urllib.request.Request(served.url, headers={"authorization": "Bearer guess"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(wrong, timeout=30)
        assert refused.value.code == 401
    finally:
        served.close()


def test_the_stage_label_over_http_is_bounded_however_many_reasons(channel):
    import dataclasses

    from ackstream.ui.metrics import MAX_STAGE_LABEL_CHARS, MAX_STAGE_LABELS, OTHER_STAGES

    reasons = {f"amount {i} is negative " + "x" * 100: 1 for i in range(3 * MAX_STAGE_LABELS)}
    status = dataclasses.replace(
        local_status(channel, "words"), failed_by_stage={"parse": 5, **reasons}
    )

    class Read(Statuses):
        def __call__(self):
            return [status]

    statuses = Read(lambda: [StatusSource("words", channel=channel)])
    servers = [serve_metrics(statuses, 0), serve_view(statuses, 0)]
    try:
        for served in servers:
            text = urllib.request.urlopen(served.url + "metrics", timeout=30).read().decode()
            stages = re.findall(r'^ackstream_failed_by_stage_total\{stage="([^"]*)"', text, re.M)
            assert len(stages) == MAX_STAGE_LABELS + 1 and "parse" in stages
            assert OTHER_STAGES in stages
            assert max(map(len, stages)) <= MAX_STAGE_LABEL_CHARS
            total = sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("ackstream_failed_by_stage_total{")
            )
            assert total == 5 + len(reasons)  # none lost, the rest under (other)
    finally:
        for served in servers:
            served.close()
