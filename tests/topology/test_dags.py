"""Fan-out DAGs: one stream read by several stages and sinks, and branches joining again."""

import pytest
from pyspark.sql import functions as F

from ackstream.errors import StageError
from ackstream.sinks.memory import MemorySink
from ackstream.testing import settle, tracked_frame
from ackstream.topology import Topology
from ackstream.topology.modes import ACK_MODES

MODES = pytest.mark.parametrize("ack_mode", sorted(ACK_MODES))
LINES = ["a b", "b boom", "", "c"]


def diamond(spark, ack_mode, sinks):
    """spout -> split -> count -> sink counts
    -> shout (fails "boom") -> sink loud
                            -> merge <- size <- spout -> sink merged"""
    return (
        Topology("dag", spark, None, ack_mode=ack_mode)
        .explode(F.split("value", " "), "word", name="split")
        .filter(F.col("word") != "")
        .aggregate("word", F.count("*").alias("n"), name="count")
        .sink(sinks["counts"])
        .map(lambda df: df.withColumn("word", F.upper("word")), name="shout", after="filter#2")
        .fail_where(F.col("word") == "BOOM", "boom in shout")
        .sink(sinks["loud"])
        .map(lambda df: df.withColumn("word", F.length("value").cast("string")), after="spout")
        .map(lambda df: df.select("*"), name="merge", after=("fail_where#5", "map#6"))
        .sink(sinks["merged"])
    )


@pytest.mark.spark
@MODES
def test_a_root_is_acked_when_every_branch_acked_and_failed_by_any_branch(spark, ack_mode):
    """Every root reaches two or three subscribers of a stream; with per-stage acks the
    XOR of its edges is 0 only if each subscriber acked its own copy (two subscribers
    acking one edge would cancel and leave the tree open)."""
    sinks = {name: MemorySink() for name in ("counts", "loud", "merged")}
    frame = tracked_frame(spark, LINES)
    roots = [r["_root"] for r in frame.orderBy("offset").collect()]
    records = diamond(spark, ack_mode, sinks).run_batch(frame)
    assert settle(records) == {r: "failed" if i == 1 else "acked" for i, r in enumerate(roots)}
    reasons = {r for r in records.column("reason").to_pylist() if r}
    assert reasons == {"boom in shout"}
    assert {r["word"]: r["n"] for r in sinks["counts"].rows()} == {
        "a": 1,
        "b": 2,
        "boom": 1,
        "c": 1,
    }
    assert sorted(r["word"] for r in sinks["loud"].rows()) == ["A", "B", "B", "C"]
    # the join: shout's words and the spout's line lengths, each row once
    assert sorted(r["word"] for r in sinks["merged"].rows()) == sorted(
        ["A", "B", "B", "C", "3", "6", "0", "1"]
    )


@pytest.mark.spark
@MODES
def test_a_sink_that_cannot_write_fails_the_roots_of_its_rows_only(spark, ack_mode):
    class Refusing(MemorySink):
        def write(self, outputs, batch_id):
            super().write(outputs, batch_id)
            return outputs.where(F.col("value") == "c")

    frame = tracked_frame(spark, ["a", "b", "c"])
    roots = [r["_root"] for r in frame.orderBy("offset").collect()]
    kept, refusing = MemorySink(), Refusing()
    topology = Topology("two-sinks", spark, None, ack_mode=ack_mode).sink(kept).sink(refusing)
    records = topology.run_batch(frame)
    assert settle(records) == {r: "failed" if i == 2 else "acked" for i, r in enumerate(roots)}
    assert sorted(r["value"] for r in kept.rows()) == ["a", "b", "c"]


def test_after_names_declared_streams_once():
    topology = Topology("dsl", None, None).filter("true", name="first")
    with pytest.raises(StageError, match=r"after='nowhere'.*\['spout', 'first'\]"):
        topology.filter("true", after="nowhere")
    with pytest.raises(StageError, match="name each stream it reads once"):
        topology.filter("true", after=("first", "first"))
    with pytest.raises(StageError, match="first.*has this name"):
        topology.filter("true", name="first")
    topology.sink(MemorySink())
    with pytest.raises(StageError, match="already ends in a sink: name the stream"):
        topology.filter("true")
    topology.filter("true", after="spout", name="second").sink(MemorySink())
    assert [s.after for s in topology.stages] == [("spout",), ("spout",)]
    assert [s.after for s in topology.sinks] == [("first",), ("second",)]


@pytest.mark.spark
@pytest.mark.parametrize(
    "ack_mode", ["telescoped", pytest.param("per_stage", marks=pytest.mark.long)]
)
def test_a_started_dag_replays_a_record_through_every_branch(spark, tmp_path, ack_mode):
    """Two branches of the spout on the generator: "first" fails offsets 1 and 6 once
    (replayed, then acked), "second" fails offset 3 always (dead-lettered after one
    retry); each replay runs through both branches."""
    import os

    from ackstream import read_dead_letters
    from ackstream.channels.local import LocalChannel
    from ackstream.vocabulary.records import ACKED, FAILED

    from helpers import commits, stop_once_settled

    channel_dir = str(tmp_path / "channel")
    channel = LocalChannel(channel_dir)
    first, second = MemorySink(), MemorySink()
    once = (F.col("offset") % 5 == 1) & (F.col("_attempt") == 0)
    topology = (
        Topology("dag-run", spark, channel, ack_mode=ack_mode, message_timeout_ms=60_000)
        .fail_where(once, "first: once", name="first")
        .sink(first)
        .fail_where(F.col("offset") == 3, "second: always", name="second", after="spout")
        .sink(second)
    )
    stream = topology.read_stream(
        {
            "ackstream.upstream": "generator",
            "ackstream.generator.count": "20",
            "ackstream.maxRetries": "1",
            "ackstream.retryInitialDelay": "50ms",
        }
    )
    running = topology.start(stream, str(tmp_path / "ckpt"), trigger_ms=200)
    stop_once_settled(running, 20, timeout_s=600)
    assert commits(channel_dir) == {"generator/0": 10, "generator/1": 10}
    done = channel.completions_since(None)[0].to_pylist()
    outcomes = sorted((c["partition"], c["offset"], c["attempt"], c["status"]) for c in done)
    expected = [(p, o, 0, ACKED) for p in (0, 1) for o in range(10) if o not in (1, 3, 6)]
    expected += [(p, o, 0, FAILED) for p in (0, 1) for o in (1, 3, 6)]
    expected += [(p, o, 1, ACKED) for p in (0, 1) for o in (1, 6)]
    expected += [(p, 3, 1, FAILED) for p in (0, 1)]
    assert outcomes == sorted(expected)
    letters = read_dead_letters(os.path.join(channel_dir, "dead_letters")).to_pylist()
    assert sorted((d["partition"], d["offset"], d["attempts"]) for d in letters) == [
        (0, 3, 2),
        (1, 3, 2),
    ]
    assert all("second: always" in d["reason"] for d in letters)

    def written(sink):
        return sorted((r["partition"], r["offset"], r["_attempt"]) for r in sink.rows())

    replays = [(p, o, 1) for p in (0, 1) for o in (1, 3, 6)]
    assert written(first) == sorted(
        [(p, o, 0) for p in (0, 1) for o in range(10) if o not in (1, 6)] + replays
    )
    assert written(second) == sorted(
        [(p, o, 0) for p in (0, 1) for o in range(10) if o != 3] + [r for r in replays if r[1] != 3]
    )
