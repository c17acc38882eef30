"""The acker's batches on their own (``Acker.run``): records in, completions out, no Spark."""

import pyarrow as pa

from ackstream.acker.batch import Acker, checked
from ackstream.testing import ack, init, reset
from ackstream.vocabulary.records import ACK_RECORD_SCHEMA, ACKED, ALIVE, INIT, INVALID, TICK

TIMEOUT = 10_000


def records(*rows):
    return pa.Table.from_pylist(list(rows), schema=ACK_RECORD_SCHEMA)


def statuses(table):
    return [(r["root"], r["status"]) for r in table.select(["root", "status"]).to_pylist()]


def test_a_reset_of_a_held_root_is_reported_alive_and_extends_its_deadline(tmp_path):
    acker = Acker(str(tmp_path), TIMEOUT)
    first = records(init(7, 5, partition=3, offset=42, attempt=1, ts=1_000))
    assert statuses(acker.run(first, 0, 1_000)) == []
    out = acker.run(records(reset(7, ts=9_000)), 1, 9_000)
    assert statuses(out) == [(7, ALIVE)]
    # the source finds the root by its record's coordinates, minting no id
    where = out.select(["topic", "partition", "offset", "attempt", "latency_ms"]).to_pylist()
    assert where == [{"topic": "t", "partition": 3, "offset": 42, "attempt": 1, "latency_ms": None}]
    assert statuses(acker.run(records(), 2, 15_000)) == []  # past the first deadline only
    assert statuses(acker.run(records(ack(7, 5)), 3, 19_500)) == [(7, ACKED)]


def test_a_reset_before_the_init_is_reported_alive_without_coordinates(tmp_path):
    out = Acker(str(tmp_path), TIMEOUT).run(records(reset(8, ts=1_000)), 0, 1_000)
    assert statuses(out) == [(8, ALIVE)]  # the source looks it up by its id
    assert out.select(["topic", "partition", "offset", "attempt"]).to_pylist() == [
        {"topic": None, "partition": None, "offset": None, "attempt": None}
    ]


def test_a_reset_that_comes_with_the_last_ack_reports_the_outcome_only(tmp_path):
    batch = records(init(9, 5, ts=1_000), {**reset(9, ts=1_000), "value": 5})
    assert statuses(Acker(str(tmp_path), TIMEOUT).run(batch, 0, 1_000)) == [(9, ACKED)]


def test_a_batch_run_again_after_a_restart_starts_from_the_table_before_it(tmp_path):
    acker = Acker(str(tmp_path), TIMEOUT)
    acker.run(records(init(1, 5, offset=10), init(2, 6, offset=20)), 0, 1_000)
    first = acker.run(records(ack(1, 5)), 1, 2_000)
    again = Acker(str(tmp_path), TIMEOUT).run(records(ack(1, 5)), 1, 2_000)  # a new process
    assert statuses(first) == statuses(again) == [(1, ACKED)]
    assert first.equals(again)
    later = Acker(str(tmp_path), TIMEOUT).run(records(ack(2, 6)), 2, 3_000)
    assert [(r["root"], r["offset"]) for r in later.to_pylist()] == [(2, 20)]


def test_ticks_are_dropped_and_unusable_records_say_why():
    batch = records(
        {"root": 0, "value": 123, "kind": TICK, "ts": 5},
        {"root": None, "value": 1, "kind": 0},
        {"root": 3, "value": 1, "kind": 64, "reason": "by hand"},
        {"root": 4, "value": 1, "kind": INIT},
        {"root": 5, "value": 1, "kind": 0},  # usable; no ts: the batch's time
    )
    usable, invalid = checked(batch, 777)
    assert usable.select(["root", "ts"]).to_pylist() == [{"root": 5, "ts": 777}]
    assert invalid.column("status").to_pylist() == [INVALID] * 3
    assert invalid.select(["root", "reason"]).to_pylist() == [
        {"root": None, "reason": "root is null"},
        {"root": 3, "reason": "kind 64 has unknown bits: by hand"},
        {"root": 4, "reason": "init record without topic, partition or offset"},
    ]
