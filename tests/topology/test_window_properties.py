"""A property of held tuples' ack records, through the acker's ledger (no Spark).

A window stage with telescoped acks gives each tuple of a batch an id ``h``
(``Holding.stamp``: xxhash64 of the stage, the batch, the tuple's content, its root
included, and its rank among the tuples alike in it), sends ``ACK (root, h)`` for
each it still holds at the end of the batch, and again in the batch that releases it.
Whatever the mix of roots, tuples per root, batches and releases, a root is acked iff
every tuple of it that was held got released."""

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from ackstream.acker.ledger import Pending, step
from ackstream.testing import ack_records, init
from ackstream.vocabulary.ids import hash_longs
from ackstream.vocabulary.records import ACK, ACK_RECORD_SCHEMA, ACKED, ack_table, as_table

STAGE = 3


@st.composite
def holding(draw):
    """Roots read in batches 0..3, each with 1-4 tuples; each tuple is released in the
    batch it came (never held), in a later batch, or never (None)."""
    tuples = []  # (root, read in batch, released in batch or None)
    for root in range(1, draw(st.integers(1, 5)) + 1):
        read = draw(st.integers(0, 3))
        for _ in range(draw(st.integers(1, 4))):
            released = draw(st.one_of(st.none(), st.integers(read, 5)))
            tuples.append((root, read, released))
    return tuples


def batch_records(tuples, batch, holds):
    """What the window's batch ``batch`` sends: each new root's init (value 0, the
    telescoped batch), ``ACK (root, h)`` per tuple it holds past the batch, and the
    same again per tuple it releases that was held before."""
    rows = [init(r, 0, offset=r) for r in sorted({r for r, read, _ in tuples if read == batch})]
    tables = [as_table(ack_records(rows), ACK_RECORD_SCHEMA)] if rows else []
    newly = [i for i, (_, read, out) in enumerate(tuples) if read == batch and out != batch]
    if newly:
        roots = np.array([tuples[i][0] for i in newly], np.int64)
        ranks = [sum(tuples[j][:2] == tuples[i][:2] for j in range(i)) + 1 for i in newly]
        ids = hash_longs(STAGE, batch, roots, np.array(ranks, np.int64))
        holds.update(zip(newly, ids.tolist()))
        tables.append(ack_table(roots, ids, ACK, batch))
    back = [i for i, (_, read, out) in enumerate(tuples) if out == batch and read < batch]
    if back:
        roots = np.array([tuples[i][0] for i in back], np.int64)
        tables.append(ack_table(roots, np.array([holds[i] for i in back]), ACK, batch))
    return pa.concat_tables(tables).to_pandas() if tables else None


@settings(max_examples=300, deadline=None)
@given(holding())
def test_a_root_is_acked_iff_every_held_tuple_of_it_was_released(tuples):
    pending, outcome, holds = Pending.empty(0), {}, {}
    for batch in range(6):
        records = batch_records(tuples, batch, holds)
        if records is not None:
            pending, done = step(pending, records, batch, 60_000)
            outcome.update(zip(done["root"], done["status"]))
    for root in {r for r, _, _ in tuples}:
        released = all(out is not None for r, _, out in tuples if r == root)
        assert (outcome.get(root) == ACKED) == released, (root, tuples)
    assert set(outcome.values()) <= {ACKED}  # nothing else completes before the timeout
