"""A topology stopped while Spark wrote its first offset log entry starts again.

Spark writes each entry of a query's offset log to a hidden temporary file and renames
it into place. A stop landing between the two leaves the temporary file, and Spark then
refuses to start the query at batch 0 ("the checkpoint location .../offsets should be
empty on batch 0"). Stopping a plain Spark query at a random moment of its first trigger
does this about once in twenty; the tests here leave the same file where Spark does."""

import os

import pytest
from pyspark.sql import functions as F

from ackstream.channels.local import LocalChannel
from ackstream.sinks.memory import MemorySink
from ackstream.storage.offset_log import clear_unfinished_first_entry
from ackstream.testing import wait_until_settled
from ackstream.topology import Topology
from ackstream.vocabulary.records import ACKED, NOTICES

pytestmark = pytest.mark.spark

#: What a stopped first planning leaves in the offsets folder (a half-written entry).
LEFTOVER = ".0.4f1c2a9e-6b0d-4d55-9a57-3c1e8f0b7d21.tmp"


def leave_unfinished_entry(checkpoint: str) -> str:
    folder = os.path.join(checkpoint, "offsets")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, LEFTOVER)
    with open(path, "w") as f:
        f.write('v1\n{"batchWatermarkMs":0,')
    return path


def test_a_topology_whose_queries_stopped_in_their_first_planning_starts_and_acks(spark, tmp_path):
    channel = LocalChannel(str(tmp_path / "channel"))
    checkpoint = str(tmp_path / "ckpt")
    leftovers = [
        leave_unfinished_entry(os.path.join(checkpoint, query)) for query in ("topology", "acker")
    ]
    sink = MemorySink()
    topology = (
        Topology("restarts", spark, channel)
        .map(lambda df: df.withColumn("n", F.length("value")), name="measured")
        .sink(sink)
    )
    stream = topology.read_stream(
        {
            "ackstream.upstream": "generator",
            "ackstream.generator.count": "3",
            "ackstream.generator.partitions": "1",
        }
    )
    running = topology.start(stream, checkpoint, trigger_ms=200)
    try:
        wait_until_settled(running, records=3, timeout_s=120)
    finally:
        running.stop()
    done = [c for c in channel.completions_since(None)[0].to_pylist() if c["status"] not in NOTICES]
    assert sorted((c["offset"], c["status"]) for c in done) == [(o, ACKED) for o in range(3)]
    assert len(sink.rows()) == 3
    assert not any(os.path.exists(path) for path in leftovers)


def test_a_log_with_an_entry_keeps_its_files(spark, tmp_path):
    """Spark passes over a leftover once the log has an entry: nothing is removed then,
    so a log being written is never touched."""
    checkpoint = str(tmp_path)
    leftover = leave_unfinished_entry(checkpoint)
    entry = os.path.join(checkpoint, "offsets", "0")
    with open(entry, "w") as f:
        f.write("v1\n{}\n")
    clear_unfinished_first_entry(spark, checkpoint)
    assert os.path.exists(leftover) and os.path.exists(entry)


def test_a_leftover_at_a_url_is_removed_through_hadoop(spark, tmp_path):
    """A checkpoint given as a URL is listed and cleared through Spark's Hadoop file
    system; a file that is not an unfinished entry stays."""
    checkpoint = str(tmp_path)
    leftover = leave_unfinished_entry(checkpoint)
    other = os.path.join(checkpoint, "offsets", "notes.txt")
    with open(other, "w") as f:
        f.write("kept")
    clear_unfinished_first_entry(spark, f"file://{checkpoint}")
    assert not os.path.exists(leftover)
    assert os.path.exists(other)
