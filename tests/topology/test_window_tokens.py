"""A tracked time window of aggregates that merge holds partial aggregates and its
batches' roots by token (``ackstream.topology.hold_tokens``), in a started topology on
the generator and a local channel: every record is acked once its window closed,
a record failed elsewhere is counted again after its replay (Storm's windowed bolts:
at least once), and a window whose output is rejected dead-letters the records in it."""

import os

import pytest
from pyspark.sql import functions as F

from ackstream import read_dead_letters
from ackstream.channels.local import LocalChannel
from ackstream.sinks.memory import MemorySink
from ackstream.testing import wait_until_settled
from ackstream.topology import Topology
from ackstream.vocabulary.records import ACKED, FAILED, REJECTED

from helpers import commits

pytestmark = pytest.mark.spark


def started(spark, tmp_path, name, declare, count=6, retries="3"):
    channel_dir = str(tmp_path / "channel")
    channel = LocalChannel(channel_dir)
    sink = MemorySink()
    topology = declare(Topology(name, spark, channel, message_timeout_ms=20_000), sink)
    stream = topology.read_stream(
        {
            "ackstream.upstream": "generator",
            "ackstream.generator.count": str(count),
            "ackstream.generator.partitions": "1",
            "ackstream.maxRetries": retries,
            "ackstream.retryInitialDelay": "50ms",
        }
    )
    running = topology.start(stream, str(tmp_path / "ckpt"), trigger_ms=200)
    try:
        wait_until_settled(running, records=count, timeout_s=180)
    finally:
        running.stop()
    return channel, channel_dir, sink


def outcomes(channel):
    done = channel.completions_since(None)[0].to_pylist()
    return sorted((c["offset"], c["attempt"], c["status"]) for c in done)


def counted(sink):
    return sum(r["n"] for r in sink.rows())


def test_a_tracked_count_window_acks_its_records_when_the_window_closes(spark, tmp_path):
    """Six records counted in 1 s windows: each acked once at its first attempt, every
    offset committed, the counts over all windows six; the held store holds partial
    rows (no row of the input, no root)."""

    def declare(topology, sink):
        return topology.window("k", F.count("*").alias("n"), duration="1s").sink(sink)

    def keyed(topology, sink):
        return declare(topology.map(lambda df: df.withColumn("k", F.lit("all"))), sink)

    channel, channel_dir, sink = started(spark, tmp_path, "tokens-ok", keyed)
    assert outcomes(channel) == [(o, 0, ACKED) for o in range(6)]
    assert commits(channel_dir) == {"generator/0": 6}
    assert counted(sink) == 6
    held = tmp_path / "ckpt" / "topology" / "ackstream-held"
    assert (held / "_tokens").is_dir()


def test_a_record_failed_elsewhere_stays_counted_and_its_replay_counts_again(spark, tmp_path):
    """A branch fails offset 2 at its first attempt: the window keeps what that attempt
    contributed (a held contribution is not dropped), the replay is counted too: seven
    over six records, at least once, as Storm's windowed bolts count."""

    def declare(topology, sink):
        return (
            topology.map(lambda df: df.withColumn("k", F.lit("all")))
            .window("k", F.count("*").alias("n"), duration="1s", name="w")
            .sink(sink)
            .fail_where("offset = 2 AND _attempt = 0", "elsewhere", name="other", after="spout")
            .sink(MemorySink())
        )

    channel, _, sink = started(spark, tmp_path, "tokens-elsewhere", declare)
    expected = [(o, 0, ACKED) for o in range(6) if o != 2] + [(2, 0, FAILED), (2, 1, ACKED)]
    assert outcomes(channel) == sorted(expected)
    assert counted(sink) == 7


def test_a_rejected_window_row_dead_letters_every_record_it_held(spark, tmp_path):
    """Every window row is rejected downstream: each record the windows held is
    dead-lettered at once, its reason naming the window and the rejection's."""

    def declare(topology, sink):
        return (
            topology.map(lambda df: df.withColumn("k", F.lit("all")))
            .window("k", F.count("*").alias("n"), duration="1s", name="w")
            .reject_where("n > 0", "no counts wanted")
            .sink(sink)
        )

    channel, channel_dir, sink = started(spark, tmp_path, "tokens-rejected", declare)
    assert outcomes(channel) == [(o, 0, REJECTED) for o in range(6)]
    letters = read_dead_letters(os.path.join(channel_dir, "dead_letters")).to_pylist()
    assert sorted(d["offset"] for d in letters) == list(range(6))
    assert all("was rejected: no counts wanted" in d["reason"] for d in letters)
    assert sink.rows() == []
