"""The XOR ledger on worked examples and Storm's rules, without Spark."""

import numpy as np
import pandas as pd
import pytest

from ackstream.acker.ledger import PENDING_DTYPE, Pending, step
from ackstream.testing import FakeClock, TupleGraph, ack, ack_records, fail, init, reject, reset
from ackstream.vocabulary.records import ACKED, FAILED, REJECTED, TIMED_OUT, UNKNOWN

TIMEOUT = 30_000
ROOT = 99


def run(batches, clock=None, pending=None):
    """Feed batches of record dicts one step each; return (pending, completions list)."""
    clock = clock or FakeClock()
    pending = pending or Pending.empty(clock())
    seen = []
    for batch in batches:
        pending, done = step(pending, ack_records(batch), clock(), TIMEOUT)
        seen += done.to_dict("records")
    return pending, seen


def test_four_bit_example_ack_before_init():
    # spout tuples 1001 and 1010 of one root; children 1110 (of 1001) and 1111 (of 1010).
    # The bolt's ack of 1001 (emitting 1110) reaches the acker before the spout's init.
    a, b, c, d = 0b1001, 0b1010, 0b1110, 0b1111
    records = [ack(ROOT, a ^ c), init(ROOT, a ^ b), ack(ROOT, b ^ d), ack(ROOT, c ^ d)]
    clock, pending, values = FakeClock(), None, []
    for record in records:
        pending, done = run([[record]], clock, pending)
        values.append(pending.values().get(ROOT, 0))
    assert values == [0b0111, 0b0100, 0b0001, 0]
    assert [(c["root"], c["status"]) for c in done] == [(ROOT, ACKED)]


def test_four_bit_example_is_not_acked_without_its_init():
    a, b, c, d = 0b1001, 0b1010, 0b1110, 0b1111
    pending, done = run([[ack(ROOT, a ^ c), ack(ROOT, b ^ d), ack(ROOT, c ^ d), ack(ROOT, a ^ b)]])
    assert done == [] and pending.values() == {ROOT: 0}  # value 0, but held for the init


def test_seven_record_example_completes_the_root():
    # spout -> bolt1/bolt2 -> bolt3 -> bolt4, with symbolic edge ids 1..5 drawn as 64-bit ids
    e = {i: int(x) for i, x in enumerate(np.random.default_rng(7).integers(1, 2**62, 6))}
    records = [
        init(ROOT, e[1] ^ e[2]),
        ack(ROOT, e[1] ^ e[3]),
        ack(ROOT, e[2] ^ e[4]),
        ack(ROOT, e[3] ^ e[5]),
        ack(ROOT, e[4] ^ e[5]),
        ack(ROOT, e[5]),
        ack(ROOT, e[5]),
    ]
    for order in (records, records[::-1], records[3:] + records[:3]):
        pending, done = run([order])
        assert [(c["root"], c["status"]) for c in done] == [(ROOT, ACKED)]
        assert len(pending) == 0


def test_seven_record_example_with_storm_drawn_edges_completes_at_the_last_record():
    # As Storm would draw them, bolt3's two emits get two edges (5 and 6): then no
    # proper prefix of the records XORs to 0, so the root completes at the seventh.
    e = {i: int(x) for i, x in enumerate(np.random.default_rng(8).integers(1, 2**62, 7))}
    records = [
        init(ROOT, e[1] ^ e[2]),
        ack(ROOT, e[1] ^ e[3]),
        ack(ROOT, e[2] ^ e[4]),
        ack(ROOT, e[3] ^ e[5]),
        ack(ROOT, e[4] ^ e[6]),
        ack(ROOT, e[5]),
        ack(ROOT, e[6]),
    ]
    clock, pending = FakeClock(), None
    for i, record in enumerate(records, start=1):
        pending, done = run([[record]], clock, pending)
        assert bool(done) == (i == 7), f"completion after record {i}"
    assert done[0]["status"] == ACKED


def test_0100_0010_example():
    # the spout tuple 0100 is acked by a bolt that emits 0010, then 0010 is acked
    clock, pending, values = FakeClock(), None, []
    for record in [init(ROOT, 0b0100), ack(ROOT, 0b0100 ^ 0b0010), ack(ROOT, 0b0010)]:
        pending, done = run([[record]], clock, pending)
        values.append(pending.values().get(ROOT, 0))
    assert values == [0b0100, 0b0010, 0]
    assert done[0]["status"] == ACKED


def test_completion_carries_coordinates_and_latency():
    clock = FakeClock(5_000)
    _, done = run(
        [
            [
                init(ROOT, 3, topic="orders", partition=2, offset=41, attempt=1, ts=4_000),
                ack(ROOT, 3),
            ]
        ],
        clock,
    )
    assert done == [
        dict(
            root=ROOT,
            status=ACKED,
            topic="orders",
            partition=2,
            offset=41,
            attempt=1,
            latency_ms=1_000,
            completed_ms=5_000,
            reason=None,
        )
    ]


def test_fail_wins_over_acks_in_the_same_batch_and_later():
    _, done = run([[init(ROOT, 5), ack(ROOT, 5), fail(ROOT)]])
    assert [c["status"] for c in done] == [FAILED]
    clock = FakeClock()
    pending, done = run([[init(ROOT, 5)], [fail(ROOT)], [ack(ROOT, 5)]], clock)
    assert [c["status"] for c in done] == [FAILED]


def test_fail_before_init_is_reported_when_the_init_arrives():
    clock = FakeClock()
    pending, done = run([[fail(ROOT)]], clock)
    assert done == [] and len(pending) == 1
    pending, done = run([[init(ROOT, 5, offset=3)]], clock, pending)
    assert [(c["status"], c["offset"]) for c in done] == [(FAILED, 3)]


def test_fail_reason_travels_with_its_completion():
    done = run([[init(ROOT, 5), fail(ROOT, reason="parse: bad JSON"), init(7, 1), fail(7)]])[1]
    assert {c["root"]: c["reason"] for c in done} == {ROOT: "parse: bad JSON", 7: None}


def test_a_fail_before_its_init_keeps_its_reason_until_the_init_comes():
    clock = FakeClock()
    pending, done = run([[fail(ROOT, reason="downstream: no such customer"), ack(7, 3)]], clock)
    assert done == [] and pending.reasons == {ROOT: "downstream: no such customer"}
    pending, done = run([[fail(ROOT, reason="a later fail")]], clock, pending)
    assert done == []
    pending, done = run([[init(ROOT, 5, offset=3), init(7, 3)]], clock, pending)
    got = {c["root"]: (c["status"], c["offset"], c["reason"]) for c in done}
    assert got == {ROOT: (FAILED, 3, "downstream: no such customer"), 7: (ACKED, 0, None)}
    assert len(pending) == 0 and pending.reasons == {}


def test_a_reject_before_its_init_keeps_its_reason_and_a_timeout_reports_it():
    clock = FakeClock()
    pending, _ = run([[reject(ROOT, reason="value over 1 MB"), fail(7, reason="gone")]], clock)
    pending, done = run([[init(ROOT, 5, offset=9)]], clock, pending)
    assert [(c["status"], c["reason"]) for c in done] == [(REJECTED, "value over 1 MB")]
    clock.advance(TIMEOUT)
    pending, done = run([[]], clock, pending)  # 7's init never came
    assert [(c["root"], c["status"], c["reason"]) for c in done] == [(7, UNKNOWN, "gone")]
    assert pending.reasons == {}


def test_reject_completes_as_rejected_even_before_the_init_and_with_acks_pending():
    _, done = run([[init(ROOT, 5), reject(ROOT, reason="value over 1 MB")]])
    assert [(c["status"], c["reason"]) for c in done] == [(REJECTED, "value over 1 MB")]
    clock = FakeClock()
    pending, done = run([[reject(ROOT)]], clock)
    assert done == []
    _, done = run([[init(ROOT, 5, offset=9)]], clock, pending)
    assert [(c["status"], c["offset"]) for c in done] == [(REJECTED, 9)]


def test_timeout_after_message_timeout_and_reset_extends_it():
    clock = FakeClock()
    pending, done = run([[init(1, 5), init(2, 6)]], clock)
    clock.advance(TIMEOUT - 1)
    pending, done = run([[reset(2)]], clock, pending)
    assert done == []
    clock.advance(1)
    pending, done = run([[]], clock, pending)
    assert [(c["root"], c["status"]) for c in done] == [(1, TIMED_OUT)]
    clock.advance(TIMEOUT - 2)
    pending, done = run([[]], clock, pending)
    assert done == []
    clock.advance(1)
    pending, done = run([[]], clock, pending)
    assert [(c["root"], c["status"]) for c in done] == [(2, TIMED_OUT)]
    assert len(pending) == 0


def test_a_record_delivered_twice_costs_a_timeout_not_a_false_ack():
    g = TupleGraph()
    s = g.spout(ROOT)
    child = g.emit([s])
    records = g.init_records() + g.ack(s) + g.ack(child)
    clock = FakeClock()
    pending, done = run([records + [records[1]]], clock)
    assert done == []
    clock.advance(TIMEOUT)
    _, done = run([[]], clock, pending)
    assert [c["status"] for c in done] == [TIMED_OUT]


def test_root_whose_init_never_came_is_unknown_at_its_deadline():
    clock = FakeClock()
    pending, _ = run([[ack(ROOT, 7)]], clock)
    clock.advance(TIMEOUT - 1)
    pending, done = run([[]], clock, pending)
    assert done == []  # the init may still come
    clock.advance(1)
    _, done = run([[]], clock, pending)
    (orphan,) = done
    assert orphan["status"] == UNKNOWN and orphan["topic"] is None
    assert all(pd.isna(orphan[k]) for k in ("partition", "offset", "attempt", "latency_ms"))


@pytest.mark.parametrize("tuples_per_root", [1, 1000])
def test_state_is_40_bytes_per_pending_root_whatever_the_tree_size(tuples_per_root):
    g, records = TupleGraph(), []
    for root in range(50):
        spout = g.spout(root, topic="t", offset=root)
        children = [g.emit([spout]) for _ in range(tuples_per_root)]
        records += g.ack(spout) + [r for c in children[:-1] for r in g.ack(c)]  # last one pending
    records = g.init_records() + records
    pending, done = run([records])
    assert done == [] and len(pending) == 50
    assert pending.nbytes == 50 * 40 == 50 * PENDING_DTYPE.itemsize
    epoch, topics, blob = pending.to_state()
    assert len(blob) == 50 * 40 and topics == "t"
    restored = Pending.from_state((epoch, topics, blob))
    assert restored.values() == pending.values() and restored.topics == ("t",)


def test_state_round_trip_keeps_deadlines_and_coordinates():
    clock = FakeClock()
    pending, _ = run([[init(1, 5, topic="a", offset=10), init(2, 6, topic="b", offset=20)]], clock)
    pending = Pending.from_state(pending.to_state())
    clock.advance(TIMEOUT)
    _, done = run([[ack(1, 5)]], clock, pending)
    got = {(c["topic"], c["offset"], c["status"]) for c in done}
    assert got == {("a", 10, ACKED), ("b", 20, TIMED_OUT)}


def test_epoch_moves_forward_without_changing_deadlines():
    clock = FakeClock(0)
    pending, _ = run([[init(1, 5, ts=0)]], clock)
    clock.advance((1 << 30) + 5)  # past the rebase point; the root is long overdue
    pending, done = run([[init(2, 6, ts=clock())]], clock, pending)
    assert [(c["root"], c["status"]) for c in done] == [(1, TIMED_OUT)]
    assert pending.epoch_ms == clock()
    clock.advance(TIMEOUT)
    _, done = run([[]], clock, pending)
    assert [(c["root"], c["status"]) for c in done] == [(2, TIMED_OUT)]


def test_a_duplicated_init_cancels_itself_instead_of_acking():
    clock = FakeClock()
    pending, done = run([[init(ROOT, 5)], [init(ROOT, 5)]], clock)
    assert done == [] and pending.values() == {ROOT: 0}
    pending, done = run([[ack(ROOT, 5)]], clock, pending)
    assert done == []  # value 5 again: the tree can no longer reach 0
    clock.advance(TIMEOUT)
    _, done = run([[]], clock, pending)
    assert [(c["status"], c["offset"]) for c in done] == [(TIMED_OUT, 0)]
