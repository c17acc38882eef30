"""Properties of trees continued in another process, on the pure ledger: a root is
acked iff every message continuing it was acked downstream; a missing ack never acks
it (it times out, and the source replays it), and a duplicated ack either cancels the
first (a timeout) or comes after the root completed (a stray, reported unknown)."""

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from ackstream.acker.ledger import Pending, step
from ackstream.acker.precombine import precombine
from ackstream.sinks.continued import continued_acks, lineage_headers, lineage_of, mint_edges
from ackstream.testing import ack_records, init
from ackstream.vocabulary.records import ACK, ACK_RECORD_SCHEMA, ACKED, TIMED_OUT, ack_table

TIMEOUT = 30_000
T0 = 1_000_000


@st.composite
def continued_batches(draw):
    """An upstream batch whose sink continued 1-4 roots in 1-6 messages (each anchored
    to some of the roots, as an aggregate's rows are), and how often the downstream
    consumer acked each message: 0 (never), 1, or 2-3 (redelivered and acked again)."""
    roots = list(range(1, draw(st.integers(1, 4)) + 1))
    anchored = draw(st.lists(st.sets(st.sampled_from(roots), min_size=1), min_size=1, max_size=6))
    acks = draw(st.lists(st.integers(0, 3), min_size=len(anchored), max_size=len(anchored)))
    return roots, [tuple(sorted(a)) for a in anchored], acks


@settings(max_examples=200, deadline=None)
@given(continued_batches(), st.data())
def test_a_root_is_acked_iff_every_downstream_ack_arrived_once(batch, data):
    roots, anchored, acks = batch
    edges = mint_edges(len(anchored))
    messages = [(rs, int(e)) for rs, e in zip(anchored, edges)]
    # what the upstream batch reports, one record per root (it pre-combines them): the
    # init (telescoped: value 0) XOR the (root, edge) acks of the messages its sink wrote
    upstream = precombine(
        pa.concat_tables(
            [
                ack_records(
                    [init(r, 0, topic="t", partition=0, offset=r, ts=T0) for r in roots]
                ).pipe(pa.Table.from_pandas, schema=ACK_RECORD_SCHEMA, preserve_index=False),
                continued_acks(messages, ACK, T0),
            ]
        )
    )
    downstream = [
        continued_acks([m], ACK, T0 + 1) for m, n in zip(messages, acks) for _ in range(n)
    ]
    records = pa.concat_tables([upstream, *downstream]).to_pylist()
    order = data.draw(st.permutations(records))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(order)), max_size=4)))
    pending, reports, now = Pending.empty(T0), [], T0
    for lo, hi in zip([0, *cuts], [*cuts, len(order)]):
        pending, done = step(pending, ack_records(order[lo:hi]), now, TIMEOUT)
        reports += zip(done["root"], done["status"])
        now += 1
    _, done = step(pending, None, now + TIMEOUT, TIMEOUT)
    reports += zip(done["root"], done["status"])

    first = {}
    for root, status in reports:
        first.setdefault(root, status)
    assert sorted(first) == roots
    # anything after a root's outcome is an ack that came after it completed: a stray,
    # which the acker reports as unknown and every source ignores
    assert len(reports) == len(roots) + sum(1 for r, s in reports if s == "unknown")
    for root in roots:
        counts = [n for rs, n in zip(anchored, acks) if root in rs]
        if 0 in counts:  # a message never acked: never a false ack
            assert first[root] == TIMED_OUT
        elif set(counts) == {1}:
            assert first[root] == ACKED
        else:  # acked twice: the ack that came second cancels the first, or is a stray
            assert first[root] in (ACKED, TIMED_OUT)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=50),
    st.integers(-(2**63), 2**63 - 1),
)
def test_lineage_headers_round_trip(roots, edge):
    assert lineage_of(lineage_headers(roots, edge)) == (tuple(roots), edge)


def test_a_message_without_lineage_is_not_part_of_a_tree():
    assert lineage_of(None) is None
    assert lineage_of([("other", b"x")]) is None
    assert lineage_of([("ackstream.roots", b"1234567"), ("ackstream.edge", b"12345678")]) is None


def test_edges_are_random_and_never_zero():
    edges = mint_edges(100_000)
    assert edges.all() and len(set(edges.tolist())) == len(edges)
    assert not (mint_edges(8) == mint_edges(8)).all()  # fresh draws, not a fixed seed
    assert ack_table([1], [5], ACK, 0).schema == ACK_RECORD_SCHEMA
