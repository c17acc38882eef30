"""A topology as real streaming queries: the stages' query and the acker on a local channel."""

import json
import os

import pytest
from conftest import wait_for
from pyspark.sql import functions as F

from ackstream import ACKED, FAILED
from ackstream.sinks.channel import LocalChannel
from ackstream.sinks.memory import MemorySink
from ackstream.testing import with_lineage
from ackstream.topology import Topology

pytestmark = pytest.mark.spark

LINES = ["the quick fox", "jumps over", "the boom dog", "quick quick", "", "fox"]
SCHEMA = "key string, value string, topic string, partition int, offset long"


def line_stream(spark, directory, lines, tracked=True):
    """A file stream of ``lines`` at offsets 0, 1, ... of topic 'lines' (one JSON file)."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "part-0.json"), "w") as f:
        for offset, line in enumerate(lines):
            f.write(json.dumps({"key": None, "value": line, "topic": "lines", "partition": 0,
                                "offset": offset}) + "\n")
    stream = spark.readStream.schema(SCHEMA).json(str(directory))
    return with_lineage(stream, source="test") if tracked else stream


def word_count(spark, channel, sink, tracking=True):
    return (Topology("wordcount", spark, channel, tracking=tracking)
            .explode(F.split("value", " "), "word")
            .where(F.col("word") != "")
            .fail_where(F.col("word") == "boom")
            .aggregate("word", F.count("*").alias("n"))
            .sink(sink))


def test_stream_acks_every_root_and_fails_the_injected_one(spark, tmp_path):
    channel = LocalChannel(tmp_path / "channel")
    sink = MemorySink()
    topology = word_count(spark, channel, sink)
    running = topology.start(line_stream(spark, tmp_path / "in", LINES), str(tmp_path / "ckpt"),
                             trigger_ms=200, message_timeout_ms=120_000)
    seen, position = [], -1
    try:
        def all_done():
            nonlocal position
            table, position = channel.completions_since(position)
            seen.extend(table.to_pylist())
            return len(seen) >= len(LINES) or running.exception()

        wait_for(all_done, timeout=150, what="a completion for every line")
        assert running.exception() is None
    finally:
        running.stop()
    status = {c["offset"]: c["status"] for c in seen}
    assert status == {i: (FAILED if "boom" in line else ACKED) for i, line in enumerate(LINES)}
    counts = {r["word"]: r["n"] for r in sink.rows()}
    assert counts == {"the": 2, "quick": 3, "fox": 2, "jumps": 1, "over": 1, "dog": 1}


def test_tracking_off_writes_no_ack_records(spark, tmp_path):
    channel = LocalChannel(tmp_path / "channel")
    sink = MemorySink()
    topology = word_count(spark, channel, sink, tracking=False)
    stream = line_stream(spark, tmp_path / "in", LINES, tracked=False)
    running = topology.start(stream, str(tmp_path / "ckpt"), trigger_ms=200)
    try:
        assert running.acker is None
        running.process_all_available()
    finally:
        running.stop()
    assert {r["word"] for r in sink.rows()} == {"the", "quick", "fox", "jumps", "over", "dog"}
    assert os.listdir(channel.acks_dir) == []
