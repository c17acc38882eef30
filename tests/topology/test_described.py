"""A started topology writes its declared graph and keeps its run's state beside its
checkpoint (``ackstream.topology.described``), where ``status`` and the view read them."""

import os
import time

import pytest
from pyspark.sql import functions as F

from ackstream.channels.local import LocalChannel
from ackstream.sinks.memory import MemorySink
from ackstream.topology import Topology
from ackstream.topology.described import read_graph, read_run, source_metrics

pytestmark = pytest.mark.spark


def until(check, timeout_s=120.0):
    """Poll ``check`` until it gives something true; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.2)
    pytest.fail(f"{check} gave nothing within {timeout_s} s")


def test_start_writes_the_graph_and_the_run_is_kept_until_it_stops(spark, tmp_path):
    topology = (
        Topology("described", spark, LocalChannel(str(tmp_path / "ch")))
        .sql("SELECT *, CAST(value AS STRING) AS text FROM tuples", name="decode")
        .reject_where(F.col("text").isNull(), "no text", name="parse")
        .fail_where(F.col("offset") % 7 == 3, name="poison")
        .fail_where("offset < 0", F.concat(F.lit("odd: "), F.col("text")), after="parse")
    )
    topology = topology.sink(MemorySink(), after="poison")
    stream = topology.read_stream({"ackstream.upstream": "generator"})
    listeners = spark._jsparkSession.streams().listListeners  # noqa: SLF001 - what Spark holds
    before = len(listeners())
    running = topology.start(stream, str(tmp_path / "ckpt"), trigger_ms=200)
    folder = str(tmp_path / "ckpt" / "topology")
    try:
        nodes = {n["name"]: n for n in read_graph(folder)["nodes"]}
        assert list(nodes) == ["spout", "decode", "parse", "poison", "fail_where#4", "sink#1"]
        assert nodes["poison"]["after"] == ["parse"] and nodes["sink#1"]["after"] == ["poison"]
        assert nodes["parse"]["reason"] == "no text"
        # the default reason names the stage and the condition's SQL, not pyspark's repr
        assert nodes["poison"]["reason"] == "poison: ((offset % 7) = 3)"
        assert nodes["fail_where#4"]["reason"] is None  # a column: no fixed text
        assert nodes["sink#1"]["kind"] == "sink: MemorySink"
        run = until(lambda: (r := read_run(folder)) and r["last_batch"] and r)
        assert run["state"] == "running" and run["stopped_ms"] is None
        assert run["last_batch"]["id"] >= 0 and run["last_batch"]["duration_ms"] >= 0
        assert run["spark_ui"] == spark.sparkContext.uiWebUrl
        assert len(listeners()) == before + 1
    finally:
        running.stop()
    run = until(lambda: (r := read_run(folder))["state"] == "stopped" and r)
    assert run["stopped_ms"] >= run["started_ms"] and run["error"] is None
    # the rows read are the source's own count, as its last progress had it
    assert run["read"] == source_metrics(running.query.lastProgress)["read"] > 0
    assert run["pid"] == os.getpid()
    assert os.path.exists(os.path.join(folder, "metadata"))  # when the checkpoint began
    until(lambda: len(listeners()) == before)  # the recorder is off the session again
