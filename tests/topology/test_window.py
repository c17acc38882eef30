"""Count windows: tuples held across micro-batches, acked when their window emits.

The batch-level tests run ``Topology.run_batch`` twice on a real session (the held
store in memory) and feed each batch's ack records through the acker's ledger, as
the acker query would; the started tests run the generator source, the topology and
acker queries on a local channel."""

import pytest
from pyspark.sql import functions as F

from ackstream.acker.ledger import Pending, step
from ackstream.errors import StageError
from ackstream.records import ACKED, FAILED
from ackstream.sinks.memory import MemorySink
from ackstream.testing import settle, tracked_frame
from ackstream.topology import Topology
from ackstream.topology.batch import ACK_MODES

pytestmark = pytest.mark.spark
MODES = pytest.mark.parametrize("ack_mode", sorted(ACK_MODES))


def ledger(batches):
    """Each batch's ack records through the acker's ledger in turn: the outcome per root
    that completed, and the roots still pending."""
    pending, outcome = Pending.empty(0), {}
    for i, records in enumerate(batches):
        pending, done = step(pending, records.to_pandas(), i, 60_000)
        outcome.update(zip(done["root"], done["status"]))
    return outcome, set(pending.values())


def roots(frame):
    return [r["_root"] for r in frame.orderBy("offset").collect()]


def windowed(spark, ack_mode, sink, fail=None):
    topology = Topology("win", spark, None, ack_mode=ack_mode).window(
        "value", F.sort_array(F.collect_list("offset")).alias("offsets"), count=3, name="w"
    )
    if fail is not None:
        topology = topology.fail_where(fail, "downstream")
    return topology.sink(sink)


@MODES
def test_held_tuples_keep_their_roots_open_until_the_window_emits(spark, ack_mode):
    """Batch 0 brings two "a" (held) and one "b" (held); batch 1 one more "a": the "a"
    window emits offsets from both batches and both batches' "a" roots are acked; the
    "b" root stays pending in the acker, its tuple held."""
    sink = MemorySink()
    topology = windowed(spark, ack_mode, sink)
    first = tracked_frame(spark, ["a", "b", "a"], partition=0)
    second = tracked_frame(spark, ["a"], partition=1)
    records0 = topology.run_batch(first, 0)
    assert set(settle(records0).values()) == {"pending"}  # nothing closes in batch 0
    assert sink.rows() == []
    records1 = topology.run_batch(second, 1)
    assert [r["offsets"] for r in sink.rows()] == [[0, 0, 2]]
    a0, b, a2 = roots(first)
    (a1,) = roots(second)
    outcome, pending = ledger([records0, records1])
    assert outcome == {a0: ACKED, a2: ACKED, a1: ACKED}
    assert pending == {b}


@MODES
def test_a_failed_window_row_fails_every_root_it_was_anchored_to(spark, ack_mode):
    """The window's row is anchored to tuples of two batches; a stage after it fails the
    row, and all three roots fail (their records replay); nothing is written."""
    sink = MemorySink()
    topology = windowed(spark, ack_mode, sink, fail=F.size("offsets") == 3)
    first = tracked_frame(spark, ["a", "a"], partition=0)
    second = tracked_frame(spark, ["a"], partition=1)
    records = [topology.run_batch(first, 0), topology.run_batch(second, 1)]
    outcome, pending = ledger(records)
    assert outcome == dict.fromkeys(roots(first) + roots(second), FAILED)
    assert pending == set()
    assert sink.rows() == []


@MODES
def test_a_batch_run_again_starts_from_the_held_tuples_before_it(spark, ack_mode):
    """Spark re-runs a batch after a crash: the window must not hold its tuples twice
    (two "a" held, then batch 1 run twice with one more "a": one window each time)."""
    sink = MemorySink()
    topology = windowed(spark, ack_mode, sink)
    topology.run_batch(tracked_frame(spark, ["a", "a"], partition=0), 0)
    again = tracked_frame(spark, ["a"], partition=1)
    topology.run_batch(again, 1)
    topology.run_batch(again, 1)
    assert [r["offsets"] for r in sink.rows()] == [[0, 0, 1], [0, 0, 1]]
    (stage,) = topology.stages
    assert stage.store(None).before(2).rows.num_rows == 0


def test_window_arguments_are_checked(spark):
    with pytest.raises(StageError, match="count=0: give a whole number"):
        Topology("w", spark, None).window("value", F.count("*"), count=0)
    with pytest.raises(StageError, match="at least one aggregate"):
        Topology("w", spark, None).window("value", count=2)
    after_aggregate = (
        Topology("w", spark, None)
        .aggregate("value", F.count("*").alias("n"))
        .window("value", F.sum("n"), count=2)
        .sink(MemorySink())
    )
    with pytest.raises(StageError, match="after an aggregate"):
        after_aggregate.run_batch(tracked_frame(spark, ["a"]))
