"""A join that waits at most ``within`` (Storm's JoinBolt over a window): a tuple with no
match when its bound passes is let go and acked; a left join (Storm's ``leftJoin``)
emits such a left tuple with nulls for the right side.

The batch-level tests run ``Topology.run_batch`` with the batch's time given, and feed
each batch's ack records through the acker's ledger, as the acker query would; one
started test runs the generator source, the topology and the acker on a local channel."""

import pytest
from pyspark.sql import functions as F

from ackstream.errors import StageError
from ackstream.sinks.memory import MemorySink
from ackstream.testing import tracked_frame
from ackstream.topology import Topology
from ackstream.topology.modes import ACK_MODES
from ackstream.vocabulary.records import ACKED, NOTICES

from helpers import start_on_generator, stop_once_settled
from helpers import through_ledger as ledger

pytestmark = pytest.mark.spark
MODES = pytest.mark.parametrize("ack_mode", sorted(ACK_MODES))
T = 1_000_000  # the first batch's time (ms)
WITHIN = 5_000


def roots(frame):
    return [r["_root"] for r in frame.orderBy("offset").collect()]


def joined(spark, ack_mode, sink, how="left", within=WITHIN, fail=None):
    """Clicks (left) and views (right), both read from the spout (``key`` says which),
    joined on ``value``."""
    topology = (
        Topology("bounded", spark, None, ack_mode=ack_mode)
        .filter("key = 'click'", name="clicks")
        .filter("key = 'view'", name="views", after="spout")
        .join("clicks", "views", on="value", how=how, within=within, name="j")
    )
    if fail is not None:
        topology = topology.fail_where(fail, "downstream")
    return topology.sink(sink)


def rows(sink):
    """Per output row: the key, the click's offset and the view's (None: no view)."""
    return sorted((r["value"], r["offset"], r["offset_right"]) for r in sink.rows())


@MODES
def test_a_left_tuple_without_a_match_is_emitted_with_nulls_once_its_bound_passes(spark, ack_mode):
    """Batch 0 (at T): a click "a", no view: held, its root pending. Batch 1, before the
    bound: still held, nothing written. Batch 2, at T + within: the click is emitted
    with nulls for the view's columns and its root acked."""
    sink = MemorySink()
    topology = joined(spark, ack_mode, sink)
    first = tracked_frame(spark, ["a"], keys=["click"], partition=0)
    records = [topology.run_batch(first, 0, now_ms=T)]
    nothing = tracked_frame(spark, ["z"], keys=["other"], partition=1)
    records.append(topology.run_batch(nothing, 1, now_ms=T + WITHIN - 1))
    outcome, pending = ledger(records)
    assert sink.rows() == [] and pending == set(roots(first))
    records.append(topology.run_batch(nothing.where("false"), 2, now_ms=T + WITHIN))
    (row,) = sink.rows()
    assert (row["value"], row["offset"], row["offset_right"], row["key_right"]) == (
        "a",
        0,
        None,
        None,
    )
    outcome, pending = ledger(records)
    assert outcome[roots(first)[0]] == ACKED and pending == set()


@MODES
def test_a_match_within_the_bound_is_a_pair_and_never_a_row_with_nulls(spark, ack_mode):
    """A click held at T meets its view at T + within - 1: one pair, both roots acked;
    when the bound would have passed, nothing more is emitted."""
    sink = MemorySink()
    topology = joined(spark, ack_mode, sink)
    first = tracked_frame(spark, ["a"], keys=["click"], partition=0)
    second = tracked_frame(spark, ["a"], keys=["view"], partition=1)
    records = [
        topology.run_batch(first, 0, now_ms=T),
        topology.run_batch(second, 1, now_ms=T + WITHIN - 1),
        topology.run_batch(second.where("false"), 2, now_ms=T + 2 * WITHIN),
    ]
    assert rows(sink) == [("a", 0, 0)]
    outcome, pending = ledger(records)
    assert outcome == dict.fromkeys(roots(first) + roots(second), ACKED) and pending == set()


@MODES
def test_a_match_after_the_bound_passed_finds_nothing(spark, ack_mode):
    """A click held at T, its view comes at T + within: the click's wait is over (it is
    emitted with nulls, acked) and the view, new, waits for a click of its own."""
    sink = MemorySink()
    topology = joined(spark, ack_mode, sink)
    first = tracked_frame(spark, ["a"], keys=["click"], partition=0)
    second = tracked_frame(spark, ["a"], keys=["view"], partition=1)
    records = [
        topology.run_batch(first, 0, now_ms=T),
        topology.run_batch(second, 1, now_ms=T + WITHIN),
    ]
    assert rows(sink) == [("a", 0, None)]
    outcome, pending = ledger(records)
    assert outcome == dict.fromkeys(roots(first), ACKED) and pending == set(roots(second))


@MODES
@pytest.mark.parametrize("how", ["inner", "left"])
def test_a_right_tuple_without_a_match_is_dropped_and_acked_when_its_bound_passes(
    spark, ack_mode, how
):
    """A view alone: held, then let go at T + within with nothing written (a right
    tuple has no row of its own in a left join), its root acked. In an inner join with
    a bound a click alone goes the same way."""
    sink = MemorySink()
    topology = joined(spark, ack_mode, sink, how=how)
    keys = ["view"] if how == "left" else ["view", "click"]
    first = tracked_frame(spark, ["a", "b"][: len(keys)], keys=keys, partition=0)
    later = first.where("false")
    records = [
        topology.run_batch(first, 0, now_ms=T),
        topology.run_batch(later, 1, now_ms=T + WITHIN),
    ]
    assert sink.rows() == []
    outcome, pending = ledger(records)
    assert outcome == dict.fromkeys(roots(first), ACKED) and pending == set()
    assert topology.stages[-1].holding.store(None).before(spark, 2).rows.count() == 0


@MODES
def test_a_left_tuple_with_a_null_key_is_emitted_with_nulls_at_once(spark, ack_mode):
    """A null key never matches: a left join emits the click at once, with nulls, and
    acks it; a view with a null key is dropped and acked, as in an inner join."""
    sink = MemorySink()
    topology = joined(spark, ack_mode, sink)
    batch = tracked_frame(spark, [None, None], keys=["click", "view"])
    outcome, pending = ledger([topology.run_batch(batch, 0, now_ms=T)])
    assert rows(sink) == [(None, 0, None)]
    assert outcome == dict.fromkeys(roots(batch), ACKED) and pending == set()


@MODES
def test_a_failed_row_with_nulls_fails_its_left_root(spark, ack_mode):
    """A stage after the join fails the rows that have no view: the click's root
    fails once its bound passed (and replays); a pair of the same batch is acked."""
    sink = MemorySink()
    topology = joined(spark, ack_mode, sink, fail=F.col("offset_right").isNull())
    first = tracked_frame(spark, ["a", "b"], keys=["click", "click"], partition=0)
    second = tracked_frame(spark, ["b"], keys=["view"], partition=1)
    records = [
        topology.run_batch(first, 0, now_ms=T),
        topology.run_batch(second, 1, now_ms=T + 1),
        topology.run_batch(second.where("false"), 2, now_ms=T + WITHIN),
    ]
    a_click, b_click = roots(first)
    outcome, pending = ledger(records)
    assert outcome == {a_click: "failed", b_click: ACKED, roots(second)[0]: ACKED}
    assert pending == set() and rows(sink) == [("b", 1, 0)]


def test_the_bound_is_checked_against_the_message_timeout_and_left_needs_it(spark):
    def topology(timeout_ms=30_000):
        return (
            Topology("b", spark, None, message_timeout_ms=timeout_ms)
            .filter("key = 'click'", name="clicks")
            .filter("key = 'view'", name="views", after="spout")
        )

    with pytest.raises(StageError, match=r"how='left' .*give within="):
        topology().join("clicks", "views", on="value", how="left")
    with pytest.raises(StageError, match="how='outer': give one of 'inner', 'left'"):
        topology().join("clicks", "views", on="value", how="outer", within="1s")
    with pytest.raises(StageError, match="within='soon': expected"):
        topology().join("clicks", "views", on="value", how="left", within="soon")
    with pytest.raises(StageError, match=r"within=20000 ms.*message timeout \(30000 ms\).*raise"):
        topology().join("clicks", "views", on="value", how="left", within="20s")
    fits = topology().join("clicks", "views", on="value", how="left", within="15s")
    assert fits.stages[-1].within_ms == 15_000 and fits.stages[-1].idle_batch_ms == 15_000
    untracked = Topology("u", spark, None, tracking=False, message_timeout_ms=1_000)
    untracked.filter("key = 'click'", name="c").join("c", "spout", on="value", within="1 min")


def test_the_source_runs_a_batch_every_bound_while_tuples_wait(spark, tmp_path):
    from ackstream.channels.local import LocalChannel

    channel = LocalChannel(str(tmp_path / "channel"))
    topology = (
        Topology("b", spark, channel)
        .filter("key = 'click'", name="clicks")
        .filter("key = 'view'", name="views", after="spout")
        .join("clicks", "views", on="value", how="left", within="4s")
        .sink(MemorySink())
    )
    assert topology.source_options()["ackstream.idleBatchInterval"] == "4000ms"


def test_a_left_tuple_alone_is_written_with_nulls_and_its_offset_committed(spark, tmp_path):
    """Started: the generator's one record is a click whose view never comes; the left
    join writes it with nulls once its 1 s bound passed (the source runs idle batches
    meanwhile), its root is acked once and its offset committed."""
    from ackstream.channels.local import LocalChannel

    from helpers import commits

    channel = LocalChannel(str(tmp_path / "channel"))
    sink = MemorySink()
    topology = (
        Topology("alone", spark, channel, message_timeout_ms=120_000)  # slow first batches
        .map(lambda df: df.withColumn("k", F.expr("offset div 2")), name="keyed")
        .filter("offset % 2 = 0", name="left")
        .filter("offset % 2 = 1", name="right", after="keyed")
        .join("left", "right", on="k", how="left", within="1s", name="j")
        .sink(sink)
    )
    stop_once_settled(start_on_generator(topology, tmp_path / "ckpt", 1), 1, timeout_s=120)
    assert [(r["k"], r["offset"], r["offset_right"]) for r in sink.rows()] == [(0, 0, None)]
    done = [c for c in channel.completions_since(None)[0].to_pylist() if c["status"] not in NOTICES]
    assert [(c["offset"], c["status"]) for c in done] == [(0, ACKED)]
    assert commits(str(tmp_path / "channel")) == {"generator/0": 1}
