"""The live view in a real browser: Debian's headless Chromium, driven by Playwright,
opens the page of a topology running on the test broker, finds the figures the
brokers themselves count, and replays a dead letter through the page's confirmation.

``make test-browser`` runs it (CI too): Chromium comes from Debian's ``chromium``
package at /usr/bin/chromium, never from Playwright's own download. With
``ACKSTREAM_UI_SCREENSHOT=PATH`` the page's screenshot is also saved there (the docs'
picture is made so)."""

import contextlib
import glob
import html
import http.server
import json
import os
import shutil
import threading
import uuid

import pytest

from helpers import consume, group_commits, produce

pytestmark = [pytest.mark.browser, pytest.mark.spark, pytest.mark.broker]

CHROMIUM = "/usr/bin/chromium"
#: Chromium's flags for a root user on a machine with no internet access: no sandbox,
#: no GPU, and none of its own background connections.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

#: Per partition: "abc" is rejected (a dead letter at once), "-3" fails every attempt
#: (a dead letter after its retry), the rest are acked and written to the sink.
VALUES = ["12.50", "7", "abc", "3.25", "-3", "40", "1", "2", "x9", "5"]
#: The headers of a dead letter that name its record, as its name has them.
WHERE = ("topic", "partition", "offset")


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (make test-browser)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@contextlib.contextmanager
def another_site(target: str, body: str):
    """A page on another loopback origin whose form posts ``body`` to ``target`` at once
    as a cross-site "simple" request (text/plain); yields the page's address."""
    page = (
        f'<form method="post" action="{html.escape(target)}" enctype="text/plain">'
        f'<input type="hidden" name="{html.escape(body)}" value=""></form>'
        "<script>document.forms[0].submit()</script>"
    ).encode()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def figure(page, name: str) -> str:
    return page.inner_text(f'[data-figure="{name}"]')


def number(text: str) -> int:
    return int(text.replace(",", ""))


def test_the_live_view_shows_the_brokers_counts_and_replays_a_dead_letter(
    spark, broker, new_topic, tmp_path, browser
):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from pyspark.sql import functions as F

    from ackstream import KafkaChannel, KafkaSink, Topology
    from ackstream.testing import wait_until_settled
    from ackstream.ui.metrics import Statuses
    from ackstream.ui.status_sources import StatusSource
    from ackstream.ui.view import serve_view

    source, sink, dead = new_topic(partitions=2), new_topic(), new_topic()
    for partition in (0, 1):
        produce(broker.bootstrap, source, VALUES, partition=partition)
    name = f"view-{uuid.uuid4().hex[:8]}"
    topology = (
        Topology(name, spark, KafkaChannel(broker.bootstrap, name), stage_counts=True)
        .sql("SELECT *, try_cast(CAST(value AS STRING) AS DOUBLE) AS amount FROM tuples")
        .reject_where("amount IS NULL", "not a number", name="parse")
        .fail_where("amount < 0", "negative amount", name="check")
        .map(lambda df: df.withColumn("value", F.format_string("%.0f", F.col("amount") * 100)))
        .sink(KafkaSink(broker.bootstrap, sink))
    )
    stream = topology.read_stream(
        {
            "kafka.bootstrap.servers": broker.bootstrap,
            "subscribe": source,
            "ackstream.deadLetterTopic": dead,
            "ackstream.maxRetries": "1",
            "ackstream.retryInitialDelay": "100ms",
            "maxOffsetsPerTrigger": "8",
            # the fast path: Spark's reader reads the new records in the JVM
            "ackstream.recordReader": "spark",
        }
    )
    checkpoint = str(tmp_path / "ckpt")
    running = topology.start(stream, checkpoint, trigger_ms=200)
    served = None
    try:
        wait_until_settled(running, records=2 * len(VALUES), timeout_s=300)
        statuses = Statuses(lambda: [StatusSource.of_topology(topology, checkpoint)])
        served = serve_view(statuses, 0)
        page = browser.new_page(viewport={"width": 1400, "height": 1200})
        page.goto(served.url + "?every=1000")
        page.wait_for_selector(f'section.topology[data-name="{name}"]')
        page.wait_for_function("document.querySelectorAll('.dead-letters tbody tr').length > 0")

        # the figures, against what the brokers hold: the sink's records are the acked
        # roots (one each), the dead-letter topic's the dead letters, the group's
        # commits the partitions' committed offsets
        written, letters = consume(broker.bootstrap, sink), consume(broker.bootstrap, dead)
        assert number(figure(page, "acked")) == len(written) == 2 * 7
        assert number(figure(page, "dead_lettered")) == len(letters) == 2 * 3
        assert number(figure(page, "rejected")) == 2 * 2
        assert number(figure(page, "lag")) == 0
        committed = group_commits(broker.bootstrap, name, source)
        for partition, offset in committed.items():
            row = page.locator(f'.partitions tr[data-partition="{source}[{partition}]"]')
            assert number(row.locator(".committed").inner_text()) == offset == len(VALUES)

        def stage(name: str, column: str) -> int:
            return number(page.inner_text(f'.stages tr[data-stage="{name}"] .{column}'))

        # tuples in and out of each stage (the rejected ones leave "parse"), and the
        # failed and rejected roots charged to the stage that gave their reason
        assert stage("parse", "in") - stage("parse", "out") == 4
        assert stage("sql#1", "in") == stage("sql#1", "out") == stage("parse", "in") >= 20
        assert stage("parse", "rejected") == 4
        assert stage("check", "failed") == 4  # both attempts of each "-3"
        check = page.inner_text('.stages tr[data-stage="check"] .reasons')
        assert check == "negative amount (4)"
        assert page.locator('.stages tr[data-stage="negative amount"]').count() == 0
        assert page.locator(".plot.rates .main-svg").count() > 0  # plotly drew the plots
        assert page.locator(".plot.graph .sankey").count() == 1
        drawn = page.get_attribute(".plot.graph", "data-nodes")
        assert drawn == '["spout", "sql#1", "parse", "check", "map#4", "sink#1"]'.replace(" ", "")
        assert "since the checkpoint began" in page.inner_text(".stages-span")

        # the header: running, since when, its last batch and rates, Spark's UI if on
        assert page.inner_text('[data-run="state"]') == "running"
        assert page.inner_text('[data-run="since"]').startswith("since ")
        batch = page.inner_text('[data-run="batch"]')
        assert batch.startswith("· last batch ") and " took " in batch, batch
        assert "input" in page.inner_text('[data-run="rates"]')
        # rows read, the source's own count on Spark's reader: every record the source
        # topic holds, and each "-3" once more (its one retry)
        assert len(consume(broker.bootstrap, source)) == 2 * len(VALUES)
        said_read = f"{2 * len(VALUES) + 2} read since it started"
        with contextlib.suppress(PlaywrightTimeout):  # the assert below says what it read
            page.wait_for_function(
                f"document.querySelector('[data-run=\"batch\"]').textContent"
                f".includes('{said_read}')"
            )
        assert said_read in page.inner_text('[data-run="batch"]'), page.inner_text(".run")
        ui = spark.sparkContext.uiWebUrl
        link = page.locator('[data-run="spark-ui"]')
        assert link.is_hidden() if ui is None else link.get_attribute("href") == ui

        # a batch waiting for a sink that does not answer: the header says which, since
        # when and that nothing is charged (the wait's pause file, written here beside
        # the run's file), and says running again once the file is gone
        from ackstream.topology.described import PAUSED_FILE, RUN_FILE
        from ackstream.vocabulary.clock import now_ms

        (run_file,) = glob.glob(os.path.join(checkpoint, "**", RUN_FILE), recursive=True)
        pause = os.path.join(os.path.dirname(run_file), PAUSED_FILE)
        with open(pause, "w") as f:
            said = {"sink": "KafkaSink to out", "error": "TimeoutException", "retry_s": 4}
            json.dump({**said, "since_ms": now_ms()}, f)
        state = "document.querySelector('[data-run=\"state\"]').textContent"
        page.wait_for_function(f"{state} === 'running, paused'")
        paused = page.inner_text('[data-run="paused"]')
        assert "sink KafkaSink to out unreachable since " in paused, paused
        assert "(TimeoutException)" in paused and "no record is charged" in paused
        os.remove(pause)
        page.wait_for_function(f"{state} === 'running'")
        assert page.inner_text('[data-run="paused"]') == ""

        # replay one dead letter: the page asks first, then the record is on its topic
        row = page.locator(".dead-letters tbody tr").first
        letter = row.get_attribute("data-letter")
        asked = []
        page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
        row.locator("button.replay").click()
        replayed = f'.dead-letters tr[data-letter="{letter}"] .replayed'
        page.wait_for_function(f"document.querySelector('{replayed}')?.textContent !== ''")
        assert asked and letter in asked[0] and name in asked[0]
        back = [
            m
            for m in consume(broker.bootstrap, source)
            if ("ackstream.replay_of", letter.encode()) in (m.headers or [])
        ]
        assert len(back) == 1, letter

        # declining the confirmation sends nothing: two reads of the page later, the
        # letter is still not replayed and the source topic holds no more records
        other = page.locator(".dead-letters tbody tr").nth(1)
        other_letter = other.get_attribute("data-letter")
        page.once("dialog", lambda dialog: dialog.dismiss())
        other.locator("button.replay").click()
        for _ in range(2):
            read = page.get_attribute("body", "data-loaded")
            page.wait_for_function(f"document.body.dataset.loaded !== '{read}'")
        cell = f'.dead-letters tr[data-letter="{other_letter}"] .replayed'
        assert page.inner_text(cell) == ""
        assert len(consume(broker.bootstrap, source)) == 2 * len(VALUES) + 1

        # the letters carry the record's key, value and time
        row = page.locator(f'.dead-letters tr[data-letter="{letter}"]')
        assert row.locator(".value").inner_text() in ("abc", "-3", "x9")
        assert row.locator(".time").inner_text() != ""
        # and when it died: its message's time on the dead-letter topic, in the
        # browser's locale
        (died,) = [
            m.timestamp
            for m in letters
            if letter == ":".join(dict(m.headers)[f"ackstream.{k}"].decode() for k in WHERE)
        ]
        said = page.evaluate("(t) => new Date(t).toLocaleString()", died)
        assert row.locator(".died").inner_text() == said

        # another site's page cannot replay: neither a form it posts (text/plain, its
        # own origin) nor a fetch without the page's token
        asked = {"topology": name, "letters": [other_letter], "confirmed": True}
        with another_site(served.url + "api/replay", json.dumps(asked)) as site:
            foreign = browser.new_page()
            with foreign.expect_response(served.url + "api/replay") as answer:
                foreign.goto(site)
            assert answer.value.status == 403 and "cross-site" in answer.value.json()["error"]
        tokenless = page.evaluate(
            """async (asked) => (await fetch("/api/replay", {method: "POST",
                headers: {"content-type": "application/json"},
                body: JSON.stringify(asked)})).status""",
            asked,
        )
        assert tokenless == 403
        assert len(consume(broker.bootstrap, source)) == 2 * len(VALUES) + 1

        shot = tmp_path / "live-view.png"
        page.screenshot(path=str(shot), full_page=True)
        if os.environ.get("ACKSTREAM_UI_SCREENSHOT"):
            shutil.copy(shot, os.environ["ACKSTREAM_UI_SCREENSHOT"])
    finally:
        if served is not None:
            served.close()
        running.stop()
