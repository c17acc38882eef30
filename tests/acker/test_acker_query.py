"""The acker as a real Spark streaming query on the local channel."""

import time

import pytest

from ackstream.acker.query import start_acker
from ackstream.channels.local import LocalChannel
from ackstream.testing import TupleGraph, ack_records
from ackstream.vocabulary.records import ACKED, CAUGHT_UP, TIMED_OUT, tick

from helpers import start_two_shard_acker, wait_for

pytestmark = pytest.mark.spark


def trees(n_roots, first_root=1):
    """Per root: the init, then acks of a spout tuple with two children and a grandchild."""
    g = TupleGraph(seed=first_root)
    first, second = [], []
    for root in range(first_root, first_root + n_roots):
        spout = g.spout(root, topic="events", partition=root % 3, offset=root)
        a, b = g.emit([spout]), g.emit([spout])
        grandchild = g.emit([a, b])
        first += g.ack(spout) + g.ack(a)
        second += g.ack(b) + g.ack(grandchild)
    now = int(time.time() * 1000)
    return g.init_records(ts=now) + first, second


class Completions:
    """Everything the acker has written to the completion channel so far."""

    def __init__(self, channel):
        self.channel, self.position, self.rows = channel, -1, []

    def poll(self):
        table, self.position = self.channel.completions_since(self.position)
        self.rows += table.to_pylist()
        return self.rows


def test_restart_from_checkpoint_mid_tree_keeps_every_pending_root(spark, tmp_path):
    channel = LocalChannel(tmp_path / "channel")
    checkpoint = str(tmp_path / "checkpoint")
    first, second = trees(300)
    whole_first, whole_second = trees(20, first_root=1000)
    channel.write_acks(ack_records(first + whole_first + whole_second))
    completions = Completions(channel)

    query = start_acker(
        spark, channel, checkpoint=checkpoint, ackers=3, message_timeout_ms=120_000, trigger_ms=100
    )
    try:
        wait_for(lambda: len(completions.poll()) >= 20, what="the 20 complete trees")
        wait_for(
            lambda: (
                query.lastProgress
                and query.lastProgress["numInputRows"] == 0
                and query.lastProgress["batchId"] >= 1
            ),
            what="an idle batch",
        )
    finally:
        query.stop()
    assert sorted(c["root"] for c in completions.rows) == list(range(1000, 1020))

    # mid-tree: 300 roots pending in the shards' state; the rest of their records arrive
    channel.write_acks(ack_records(second))
    query = start_acker(
        spark, channel, checkpoint=checkpoint, ackers=3, message_timeout_ms=120_000, trigger_ms=100
    )
    try:
        wait_for(lambda: len(completions.poll()) >= 320, what="all 320 roots")
    finally:
        query.stop()
    rows = completions.poll()
    assert len(rows) == 320
    assert {c["status"] for c in rows} == {ACKED}
    assert sorted(c["root"] for c in rows) == list(range(1, 301)) + list(range(1000, 1020))
    by_root = {c["root"]: c for c in rows}
    assert (by_root[7]["topic"], by_root[7]["partition"], by_root[7]["offset"]) == ("events", 1, 7)
    assert all(c["latency_ms"] >= 0 for c in rows)


def test_idle_shards_tick_and_time_out_incomplete_trees(spark, tmp_path):
    channel = LocalChannel(tmp_path / "channel")
    first, second = trees(10)
    channel.write_acks(ack_records(first + second[:-1]))  # the last root misses one ack
    completions = Completions(channel)
    query = start_two_shard_acker(spark, channel, tmp_path / "checkpoint", 1_500)

    ticks = []

    def timed_out():
        ticks.append(int(time.time() * 1000))
        channel.write_acks(tick(ticks[-1]))  # as the source does, once a second
        return [c for c in completions.poll() if c["status"] == TIMED_OUT]

    try:
        rows = wait_for(timed_out, interval=1.0, what="a timeout without new records")
    finally:
        query.stop()
    assert [(c["root"], c["offset"]) for c in rows] == [(10, 10)]
    assert sorted(c["root"] for c in completions.rows if c["status"] == ACKED) == list(range(1, 10))
    # each batch with ticks echoes its latest: the source learns how far the acker has read
    echoes = [c["completed_ms"] for c in completions.rows if c["status"] == CAUGHT_UP]
    assert echoes and set(echoes) <= set(ticks) and echoes == sorted(echoes)


def test_unusable_records_and_stray_acks_are_reported_and_never_stop_the_acker(spark, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ackstream.testing import ack, init
    from ackstream.vocabulary.records import ACK_RECORD_SCHEMA, INVALID, UNKNOWN

    channel = LocalChannel(tmp_path / "channel")
    first, second = trees(5)
    channel.write_acks(ack_records(first))
    # bad records among good ones: null root (a whole batch's ids would turn float64),
    # null value, unknown kind bits, an init without coordinates; a stray ack
    bad = pa.Table.from_pylist(
        [
            {"root": None, "value": 1, "kind": 0},
            {"root": 3, "value": None, "kind": 0},
            {"root": 3, "value": 1, "kind": 64},
            {"root": 77, "value": 1, "kind": 1},
            ack(555, 9),
        ],
        schema=pa.schema([ACK_RECORD_SCHEMA.field(c) for c in ("root", "value", "kind", "ts")]),
    )
    pq.write_table(bad, tmp_path / "channel" / "acks" / "by-hand.parquet")
    pq.write_table(pa.table({"foo": [1]}), tmp_path / "channel" / "acks" / "foreign.parquet")
    (tmp_path / "channel" / "acks" / "junk.parquet").write_bytes(b"not parquet")
    channel.write_acks(ack_records(second + [init(88, 5, offset=88)]))
    completions = Completions(channel)
    query = start_two_shard_acker(spark, channel, tmp_path / "checkpoint", 2_000)

    def both_timed_out():
        channel.write_acks(tick(int(time.time() * 1000)))  # wakes the acker, as the source does
        return {555, 88} <= {c["root"] for c in completions.poll() if c["status"] != INVALID}

    try:
        wait_for(
            both_timed_out, interval=1.0, what="the stray ack and the unfinished init to time out"
        )
        assert query.isActive
    finally:
        query.stop()
    rows = completions.rows
    by_status = {}
    for c in rows:
        by_status.setdefault(c["status"], []).append(c)
    assert sorted(c["root"] for c in by_status[ACKED]) == [1, 2, 3, 4, 5]
    assert [(c["root"], c["offset"]) for c in by_status[TIMED_OUT]] == [(88, 88)]
    assert [c["root"] for c in by_status[UNKNOWN]] == [555]
    reasons = sorted((c["reason"], c["root"] or 0) for c in by_status[INVALID])
    assert reasons == [  # the foreign file's row and the null root; junk is skipped by Spark
        ("init record without topic, partition or offset", 77),
        ("kind 64 has unknown bits", 3),
        ("root is null", 0),
        ("root is null", 0),
        ("value is null", 3),
    ]
