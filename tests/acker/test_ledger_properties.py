"""Properties of the ledger over random tuple DAGs, record orders and batch splits."""

from hypothesis import given, settings
from hypothesis import strategies as st

from ackstream.acker.ledger import Pending, step
from ackstream.testing import FakeClock, TupleGraph, ack_records, fail
from ackstream.vocabulary.records import ACKED, FAILED, INIT, TIMED_OUT, UNKNOWN

TIMEOUT = 30_000


@st.composite
def tuple_dags(draw):
    """Ack records of 1-4 roots whose tuples form a random DAG, Storm-style: each
    processed tuple emits 0-3 children, some anchored to a second open tuple that may
    belong to another root (multi-anchoring), then is acked."""
    graph = TupleGraph(seed=draw(st.integers(0, 2**32)))
    roots = list(range(1, draw(st.integers(1, 4)) + 1))
    open_tuples = [graph.spout(r, offset=r) for r in roots for _ in range(draw(st.integers(1, 2)))]
    records = []
    for _ in range(draw(st.integers(0, 12))):
        if not open_tuples:
            break
        tup = open_tuples.pop(draw(st.integers(0, len(open_tuples) - 1)))
        children = []
        for _ in range(draw(st.integers(0, 3))):
            parents = [tup]
            if open_tuples and draw(st.booleans()):
                parents.append(open_tuples[draw(st.integers(0, len(open_tuples) - 1))])
            children.append(graph.emit(parents))
        records += graph.ack(tup)
        open_tuples += children
    for tup in open_tuples:
        records += graph.ack(tup)
    return roots, graph.init_records() + records


def feed(draw, records, clock, pending=None):
    """Shuffle ``records``, cut them into batches, step each; return pending, completions."""
    order = draw(st.permutations(records))
    cuts = sorted(draw(st.lists(st.integers(0, len(order)), max_size=5)))
    bounds = [0, *cuts, len(order)]
    pending = pending or Pending.empty(clock())
    seen = []
    for lo, hi in zip(bounds, bounds[1:]):
        pending, done = step(pending, ack_records(order[lo:hi]), clock(), TIMEOUT)
        seen += done.to_dict("records")
        clock.advance(1)
    return pending, seen


def expire(pending, clock):
    clock.advance(TIMEOUT)
    return step(pending, None, clock(), TIMEOUT)[1].to_dict("records")


@settings(max_examples=150, deadline=None)
@given(tuple_dags(), st.data())
def test_every_root_is_acked_exactly_once_when_every_record_arrives(dag, data):
    roots, records = dag
    pending, seen = feed(data.draw, records, FakeClock())
    assert sorted((c["root"], c["status"]) for c in seen) == [(r, ACKED) for r in roots]
    assert len(pending) == 0


@settings(max_examples=150, deadline=None)
@given(tuple_dags(), st.data())
def test_a_missing_record_means_no_ack_and_a_timeout(dag, data):
    roots, records = dag
    missing = records.pop(data.draw(st.integers(0, len(records) - 1)))
    clock = FakeClock()
    pending, seen = feed(data.draw, records, clock)
    seen += expire(pending, clock)
    status = {c["root"]: c["status"] for c in seen}
    # without its init the acker cannot tell the root from a stray ack
    assert status[missing["root"]] == (UNKNOWN if missing["kind"] & INIT else TIMED_OUT)
    assert all(status[r] == ACKED for r in roots if r != missing["root"])
    assert len(seen) == len(roots)


@settings(max_examples=150, deadline=None)
@given(tuple_dags(), st.data())
def test_a_duplicated_record_never_yields_a_false_ack(dag, data):
    roots, records = dag
    twice = records[data.draw(st.integers(0, len(records) - 1))]
    victim = twice["root"]
    own = [r for r in records if r["root"] == victim]
    # duplicate delivered in one batch with the root's records: the value cannot reach 0
    clock = FakeClock()
    batch = ack_records(data.draw(st.permutations(own + [twice])))
    pending, done = step(Pending.empty(clock()), batch, clock(), TIMEOUT)
    assert len(done) == 0
    assert [c["status"] for c in expire(pending, clock)] == [TIMED_OUT]
    # duplicate delivered at any point: an ack only ever follows the whole tree
    order = data.draw(st.permutations(records + [twice]))
    pending, delivered = Pending.empty(clock()), []
    for record in order:
        delivered.append(record)
        pending, done = step(pending, ack_records([record]), clock(), TIMEOUT)
        for c in done.to_dict("records"):
            if c["status"] == ACKED:
                assert all(r in delivered for r in records if r["root"] == c["root"])


@settings(max_examples=150, deadline=None)
@given(tuple_dags(), st.data())
def test_fail_wins_over_late_acks(dag, data):
    roots, records = dag
    victim = data.draw(st.sampled_from(roots))
    # the fail is delivered together with, or before, the victim's last record
    last = max(i for i, r in enumerate(records) if r["root"] == victim)
    early, late = records[: last + 1], records[last + 1 :]
    early.insert(data.draw(st.integers(0, len(early) - 1)), fail(victim))
    clock = FakeClock()
    first = data.draw(st.permutations(early))
    pending, seen = step(Pending.empty(clock()), ack_records(first), clock(), TIMEOUT)
    seen = seen.to_dict("records")
    pending, more = feed(data.draw, late, clock, pending)
    seen += more + expire(pending, clock)
    victim_statuses = [c["status"] for c in seen if c["root"] == victim]
    assert victim_statuses[0] == FAILED and ACKED not in victim_statuses
    assert all(c["status"] == ACKED for c in seen if c["root"] != victim)
