"""Pre-combining gives the ledger the same outcome as the raw records."""

import pytest

from ackstream.acker.ledger import Pending, step
from ackstream.acker.precombine import precombine
from ackstream.testing import TupleGraph, ack_records, fail
from ackstream.vocabulary.records import ACK_RECORD_DDL, ACK_RECORD_SCHEMA, ACKED, as_table

from helpers import logged_offset


def combined(frame):
    table = precombine(as_table(frame, ACK_RECORD_SCHEMA))
    assert table.schema == ACK_RECORD_SCHEMA
    return table.to_pandas()


def outcome(frame):
    pending, done = step(Pending.empty(0), frame, 0, 30_000)
    return sorted(zip(done["root"], done["status"])), pending.values()


def test_precombined_records_give_the_same_completions():
    g, records = TupleGraph(), []
    for root in range(1, 6):
        spout = g.spout(root, topic="t", partition=root % 2, offset=root)
        kids = [g.emit([spout]) for _ in range(3)]
        records += g.ack(spout) + [r for k in kids for r in g.ack(k)]
    joined = g.emit([g.spout(6, offset=6), g.spout(7, offset=7)])  # not acked: 6, 7 pending
    records = g.init_records() + records + [fail(3)] + [records[0]]  # root 1 duplicated
    raw = ack_records(records)
    once = combined(raw)
    assert len(once) == 7
    assert outcome(once) == outcome(raw)
    assert outcome(raw)[0] == [(2, ACKED), (3, "failed"), (4, ACKED), (5, ACKED)]
    assert joined.anchors.keys() == {6, 7}


def test_the_init_timestamp_survives_combination():
    from ackstream.testing import ack, init

    raw = ack_records([ack(1, 5, ts=900), init(1, 5, ts=100), ack(2, 3, ts=50), ack(2, 3, ts=70)])
    once = combined(raw)
    assert dict(zip(once["root"], once["ts"])) == {1: 100, 2: 70}
    assert once.set_index("root")["offset"].isna().tolist() == [False, True]  # no init: null


def test_an_init_delivered_twice_cancels_itself():
    from ackstream.testing import init

    done, pending = outcome(combined(ack_records([init(1, 0), init(1, 0), init(2, 0)])))
    assert done == [(2, ACKED)] and pending == {1: 0}  # root 1 times out and replays


def test_a_fail_reason_and_a_reject_survive_combination():
    from ackstream.testing import ack, init, reject

    raw = ack_records(
        [
            init(1, 5),
            ack(1, 5),
            fail(1, reason="bolt: ValueError"),
            init(2, 0),
            reject(2, reason="not JSON"),
            init(3, 0),
        ]
    )
    once = combined(raw).set_index("root")
    assert once["reason"].to_dict() == {1: "bolt: ValueError", 2: "not JSON", 3: None}
    _, done = step(Pending.empty(0), once.reset_index(), 0, 30_000)
    assert sorted(zip(done["root"], done["status"])) == [(1, "failed"), (2, "rejected"), (3, ACKED)]


def test_a_batch_settles_the_trees_it_closes_and_leaves_the_rest_to_the_acker():
    from ackstream.acker.precombine import settle
    from ackstream.testing import init, reject

    g, records = TupleGraph(), []
    closed = g.spout(1, offset=1)
    child = g.emit([closed])
    records += g.ack(closed) + g.ack(child)
    spout = g.spout(2, offset=2)
    handed_off = g.emit([spout])  # a tuple another process will ack
    records += g.ack(spout)
    raw = (
        g.init_records(ts=100)
        + records
        + [
            init(3, 0, offset=3, ts=100),
            fail(3, reason="x"),
            init(4, 0, offset=4),
            reject(4, reason="bad"),
            init(5, 0, offset=5),
            init(5, 0, offset=5),
        ]
    )
    done, still_open = settle(precombine(as_table(ack_records(raw), ACK_RECORD_SCHEMA)), 350)
    status = dict(zip(done.column("root").to_pylist(), done.column("status").to_pylist()))
    assert status == {1: ACKED, 3: "failed", 4: "rejected"}
    assert done.column("latency_ms").to_pylist()[0] == 250  # the init's ts to now
    assert dict(zip(done.column("root").to_pylist(), done.column("reason").to_pylist()))[4] == "bad"
    assert sorted(still_open.column("root").to_pylist()) == [2, 5]  # open tree, init twice
    # the acker finishes the open tree from the records left to it, and only then
    later = still_open.to_pandas()
    _, acker_done = step(Pending.empty(400), later, 400, 30_000)
    assert len(acker_done) == 0
    pending, acker_done = step(
        Pending.empty(400), ack_records(later.to_dict("records") + g.ack(handed_off)), 400, 30_000
    )
    assert acker_done["root"].tolist() == [2] and acker_done["status"].tolist() == [ACKED]
    assert pending.values() == {5: 0}  # a duplicated init times out and replays


def test_a_batch_of_inits_alone_settles_as_the_ledger_says():
    """A telescoped batch in which nothing failed is only inits: settle takes a short
    cut past the ledger, and must give what the ledger gives."""
    from ackstream.acker.ledger import MAX_TIMEOUT_MS
    from ackstream.acker.precombine import settle
    from ackstream.sources.offsets import PlannedRoots
    from ackstream.vocabulary.records import COMPLETION_SCHEMA

    end = logged_offset(
        source="topo",
        read={"a": {"0": [5, 9], "3": [0, 2]}, "b": {"1": [7, 8]}},
        replays=[["a", 0, 2, 1], ["b", 1, 3, 300]],
    )
    inits = PlannedRoots.of_offsets([end], 1_000).inits
    done, still_open = settle(inits, 1_250)
    _, by_ledger = step(Pending.empty(1_250), inits.to_pandas(), 1_250, MAX_TIMEOUT_MS)
    assert done.num_rows == 9 and still_open.num_rows == 0
    assert done.equals(as_table(by_ledger, COMPLETION_SCHEMA))
    assert set(done.column("latency_ms").to_pylist()) == {250}


@pytest.mark.spark
def test_acks_folded_in_spark_precombine_as_the_raw_records(spark):
    from ackstream.testing import ack, init, reject
    from ackstream.topology.modes import PER_STAGE
    from ackstream.vocabulary.records import timed

    g, records = TupleGraph(), []
    for root in range(1, 6):
        spout = g.spout(root, topic="t", partition=root % 2, offset=root)
        kids = [g.emit([spout]) for _ in range(3)]
        records += g.ack(spout) + [r for k in kids for r in g.ack(k)]
    extra = [init(8, 0), init(8, 0), init(9, 4, ts=100), ack(9, 4, ts=900), reject(9, reason="no")]
    records = g.init_records() + records + [fail(3, reason="bolt"), records[0], *extra]
    raw = as_table(ack_records(records), ACK_RECORD_SCHEMA)
    in_spark = PER_STAGE.collected(spark.createDataFrame(raw.to_pandas(), ACK_RECORD_DDL))
    folded = timed(as_table(in_spark.toArrow(), ACK_RECORD_SCHEMA), 1_000)  # as the batch does
    assert folded.num_rows < raw.num_rows
    got = precombine(folded).sort_by("root")
    assert got.to_pylist() == precombine(raw).sort_by("root").to_pylist()
    assert outcome(got.to_pandas()) == outcome(raw.to_pandas())
