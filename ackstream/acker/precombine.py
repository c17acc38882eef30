"""Pre-combine a batch's ack records per root, and settle the trees the batch closed.

XOR is associative, so all records of one root in a batch fold into one: values
by XOR, fail/reset bits by OR, and the init bit by parity, so that a record
delivered twice still cancels itself after combination. The init's coordinates
and timestamp survive because they are taken from the init row. (An init
delivered twice in one batch cancels: that root times out, and the source, which
knows its roots, replays it.) It is the ledger's own ``combine``, run on the
driver: a batch's records are few (one init per root plus fails with the
default ``ack_mode``), so collecting them costs less than a shuffle in Spark.

:func:`settle` then runs the ledger's ``step`` over a batch's records, from an
empty table: a tree whose init and every ack are in the batch is finished right
there (acked at value 0, or failed, or rejected), and the topology reports it
itself. Only what stays open goes to the acker query: a tree with an edge that
another process acks, or a root whose init came twice. Nothing else can reach
those roots: in Storm only the holder of a tuple of a tree can ack or fail it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ackstream.acker.ledger import MAX_TIMEOUT_MS, Pending, combine, step
from ackstream.vocabulary.records import (
    ACK_RECORD_SCHEMA,
    ACKED,
    COMPLETION_SCHEMA,
    INIT,
    as_table,
    completion_table,
)

__all__ = ["precombine", "settle"]


def precombine(records: pa.Table) -> pa.Table:
    """One ack record per root of ``records`` (``ACK_RECORD_SCHEMA`` columns, any order)."""
    if not records.num_rows:
        return ACK_RECORD_SCHEMA.empty_table()
    c = combine(records.select(ACK_RECORD_SCHEMA.names).to_pandas())
    known = (c.kind & INIT) != 0  # coordinates come from an init row
    kind = (c.kind & ~INIT) | np.where(c.init_odd, INIT, 0)
    return pa.table(
        {
            "root": c.root,
            "value": c.value,
            "kind": kind.astype(np.int8),
            "topic": pa.array(c.topic, pa.string()),
            "partition": pa.array(c.partition, pa.int32(), mask=~known),
            "offset": pa.array(c.offset, pa.int64(), mask=~known),
            "attempt": pa.array(c.attempt, pa.int32(), mask=~known),
            "ts": c.ts,
            "reason": pa.array(c.reason, pa.string()),
        },
        schema=ACK_RECORD_SCHEMA,
    )


def settle(records: pa.Table, now_ms: int) -> tuple[pa.Table, pa.Table]:
    """Split a batch's ack records (pre-combined or not: the ledger combines them)
    into the completions of the trees they close (``COMPLETION_SCHEMA``, latency up
    to ``now_ms``) and the records of the trees they leave open, for the acker.
    Nothing times out here: the acker owns timeouts."""
    if not records.num_rows:
        return COMPLETION_SCHEMA.empty_table(), records
    done = _all_acked(records, now_ms)
    if done is not None:
        return done, records.slice(0, 0)
    _, done = step(Pending.empty(now_ms), records.to_pandas(), now_ms, MAX_TIMEOUT_MS)
    done = as_table(done, COMPLETION_SCHEMA)
    still_open = records.filter(pc.invert(pc.is_in(records.column("root"), done.column("root"))))
    return done, still_open


def _all_acked(records: pa.Table, now_ms: int) -> pa.Table | None:
    """The completions of ``records`` when they are value-0 inits of distinct roots and
    nothing else (a telescoped batch in which no tuple failed): every tree is acked,
    as the ledger would say, without its round trips through pandas. None otherwise."""
    coordinates = ("topic", "partition", "offset", "attempt", "ts")
    if any(records.column(c).null_count for c in ("root", "value", "kind") + coordinates):
        return None
    kind, value = records.column("kind").to_numpy(), records.column("value").to_numpy()
    if (kind != INIT).any() or value.any():
        return None
    order = np.argsort(records.column("root").to_numpy())
    inits = records.take(order)
    root = inits.column("root").to_numpy()
    if (root[1:] == root[:-1]).any():  # an init twice cancels itself: the ledger's case
        return None
    return completion_table(
        root,
        ACKED,
        topic=inits.column("topic"),
        partition=inits.column("partition"),
        offset=inits.column("offset"),
        attempt=pc.min_element_wise(inits.column("attempt"), 255),  # the ledger's cap
        latency_ms=pc.subtract(now_ms, inits.column("ts")),
        completed_ms=now_ms,
    )
