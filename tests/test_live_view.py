"""The live view's server and the metrics endpoint, over a local channel: what the page
is given is what ``ackstream status`` reads, and ``/metrics`` is Prometheus text.
(tests/test_ui_browser.py opens the page itself in Chromium against a broker.)"""

import json
import urllib.error
import urllib.request

import pytest

from ackstream.ui.metrics import Statuses
from ackstream.ui.status import StatusSource, local_status
from ackstream.ui.view import serve_metrics, serve_view

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

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        request = urllib.request.Request(
            self.served.url + path.lstrip("/"),
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
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
    text = client.text("/metrics/").splitlines()
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


def test_a_letter_s_key_and_value_are_shown_cut():
    from ackstream.ui.view import SHOWN_CHARS, letter_text

    assert letter_text(b"abc") == "abc" and letter_text(None) is None
    long = letter_text(b"x" * 500)
    assert len(long) == SHOWN_CHARS and long.endswith("…")
    assert letter_text(b"\xff-3") == "\ufffd-3"
