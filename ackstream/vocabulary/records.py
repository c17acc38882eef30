"""The two record kinds that cross process boundaries: ack records and completions.

Ack records go from whoever processes tuples (the topology query, or any other
process) to the acker; completions go from the acker, and from topology batches
that settle their own trees, to the source. The schemas here are the contract
for both channel transports and for the acker query.

``kind`` is a bit mask, not an enum, so that every record of one root in a batch
can be pre-combined into one (``bit_xor`` of values, ``bit_or`` of kinds) without
losing an init, a fail or a timeout reset.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from ackstream.vocabulary.arrays import has_duplicates

if TYPE_CHECKING:
    import pandas as pd

#: A column of values as the tables here are made from: numpy, Arrow or a sequence.
Values: TypeAlias = "np.ndarray | pa.Array | pa.ChunkedArray | Sequence[Any]"
#: A completion's field: a column, one value for every row, or None (all null).
FieldValues: TypeAlias = "Values | npt.ArrayLike | None"

__all__ = [
    "ACK",
    "ACKED",
    "ALIVE",
    "BATCH_FAILED",
    "CAUGHT_UP",
    "ACK_RECORD_DDL",
    "ACK_RECORD_SCHEMA",
    "COMPLETION_DDL",
    "COMPLETION_SCHEMA",
    "FAIL",
    "FAILED",
    "INIT",
    "INVALID",
    "KINDS",
    "NOTICES",
    "REJECT",
    "REJECTED",
    "RESET",
    "STATUSES",
    "timed",
    "TICK",
    "TIMED_OUT",
    "UNKNOWN",
    "ack_table",
    "as_table",
    "caught_up_ms",
    "completion_table",
    "one_outcome_per_root",
    "tick",
]

# kind bits of an ack record
ACK = 0  #: plain XOR contribution
INIT = 1  #: the spout's record: its value is the XOR of the spout tuples' edge ids
FAIL = 2  #: fail the root now, whatever its value
RESET = 4  #: extend the root's deadline by one message timeout (Storm's resetTimeout)
#: the record itself is at fault (undecodable, too big): dead-letter it now, no replay
REJECT = 8
TICK = 16  #: no record at all: its arrival makes the acker run a batch (see :func:`tick`)
KINDS = INIT | FAIL | RESET | REJECT | TICK  #: every known bit; others make a record invalid

# completion statuses
ACKED = "acked"
FAILED = "failed"
TIMED_OUT = "timed_out"
REJECTED = "rejected"  #: a REJECT record: the source dead-letters it at once
#: the root's micro-batch failed as a whole (an error out of its Spark jobs, or the
#: batch deadline): the root is a suspect, not known to be at fault; the source
#: replays the batch's roots in smaller batches of their own until the record at
#: fault fails alone (``ackstream.sources.isolation``)
BATCH_FAILED = "batch_failed"
#: the acker never saw this root's init within the message timeout (a stray ack, or a
#: root of another source): reported, and ignored by every source not tracking it
UNKNOWN = "unknown"
#: an ack record the acker could not use (null root or value, unknown kind bits, a
#: message that is not ack records); ``reason`` says what, ``root`` is set if known
INVALID = "invalid"
#: not an outcome: the acker still holds this root and a reset extended its deadline
#: (Storm's resetTimeout); the source restarts its own timeout for the root
ALIVE = "alive"
#: not an outcome: the acker has read every ack record written before the tick of
#: ``completed_ms`` (a tick's echo, ``root`` 0); the source times a root out only
#: once the acker has caught up past its deadline
CAUGHT_UP = "caught_up"
STATUSES = (ACKED, FAILED, TIMED_OUT, REJECTED, BATCH_FAILED, UNKNOWN, INVALID, ALIVE, CAUGHT_UP)

# Every field is nullable on the Arrow side because Spark's DDL schemas are, and a
# Python data source must return exactly its declared schema.

#: One ack record. Source coordinates are set on init records and null elsewhere.
ACK_RECORD_SCHEMA = pa.schema(
    [
        pa.field("root", pa.int64()),
        pa.field("value", pa.int64()),
        pa.field("kind", pa.int8()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("attempt", pa.int32()),
        pa.field("ts", pa.int64()),  # ms since epoch, when written
        pa.field("reason", pa.string()),  # why, on FAIL and REJECT records
    ]
)

#: One finished root. Coordinates are null when the acker never saw the root's init.
COMPLETION_SCHEMA = pa.schema(
    [
        pa.field("root", pa.int64()),
        pa.field("status", pa.string()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("attempt", pa.int32()),
        pa.field("latency_ms", pa.int64()),  # completion time minus the init's ts
        pa.field("completed_ms", pa.int64()),
        pa.field("reason", pa.string()),  # the fail's, reject's or invalid record's reason
        # a run of roots in one row (``ackstream.vocabulary.ranges``): offsets ``offset`` up to
        # ``end_offset`` (exclusive) at ``attempt``, their roots minted under ``ids``
        # (``root`` is the first's); both null on a row of one root
        pa.field("end_offset", pa.int64()),
        pa.field("ids", pa.string()),
    ]
)

ACK_RECORD_DDL = (
    "root long, value long, kind byte, topic string, partition int, offset long, "
    "attempt int, ts long, reason string"
)
COMPLETION_DDL = (
    "root long, status string, topic string, partition int, offset long, attempt int, "
    "latency_ms long, completed_ms long, reason string, end_offset long, ids string"
)


#: Columns a writer may leave out; they are read as null.
OPTIONAL_COLUMNS = ("reason", "end_offset", "ids")


def as_table(records: pa.Table | pd.DataFrame, schema: pa.Schema) -> pa.Table:
    """``records`` (a pandas frame or an Arrow table with at least ``schema``'s columns,
    optional ones aside) as an Arrow table of exactly ``schema``."""
    if hasattr(records, "to_numpy"):  # pandas: typed by the schema, ids never pass via float
        fields = [field for field in schema if field.name in records.columns]
        records = pa.Table.from_pandas(
            records[[f.name for f in fields]],
            schema=pa.schema(fields),
            preserve_index=False,
            nthreads=1,
        )
    for name in OPTIONAL_COLUMNS:
        if name in schema.names and name not in records.column_names:
            field = schema.field(name)
            records = records.append_column(field, pa.nulls(records.num_rows, field.type))
    return records.select(schema.names).cast(schema)


def timed(records: pa.Table, now_ms: int) -> pa.Table:
    """``records`` with ``now_ms`` as the time (``ts``) of those that carry none."""
    if not records.column("ts").null_count:
        return records
    at = records.schema.get_field_index("ts")
    return records.set_column(at, "ts", pc.fill_null(records.column("ts"), now_ms))


def tick(now_ms: int) -> pa.Table:
    """Storm's tick tuple as an ack record. The acker runs a batch only when records
    arrive; it drops ticks unread, but the batch expires overdue roots. ``value`` is
    the time, so that every tick is a new record (the local channel names files by
    their content)."""
    return pa.Table.from_pylist(
        [{"root": 0, "value": now_ms, "kind": TICK, "ts": now_ms}], schema=ACK_RECORD_SCHEMA
    )


def completion_table(
    root: Values,
    status: FieldValues,
    *,
    topic: FieldValues = None,
    partition: FieldValues = None,
    offset: FieldValues = None,
    attempt: FieldValues = None,
    latency_ms: FieldValues = None,
    completed_ms: FieldValues = None,
    reason: FieldValues = None,
    end_offset: FieldValues = None,
    ids: FieldValues = None,
) -> pa.Table:
    """Completions as an Arrow table of ``COMPLETION_SCHEMA``. Each field is a column
    (array-like), a scalar repeated to the length of ``root``, or None (all null)."""
    n = len(root)
    columns = dict(
        root=root,
        status=status,
        topic=topic,
        partition=partition,
        offset=offset,
        attempt=attempt,
        latency_ms=latency_ms,
        completed_ms=completed_ms,
        reason=reason,
        end_offset=end_offset,
        ids=ids,
    )
    arrays = []
    for field in COMPLETION_SCHEMA:
        value = columns[field.name]
        if value is None:
            arrays.append(pa.nulls(n, field.type))
        elif isinstance(value, str | int | np.integer):
            arrays.append(pa.repeat(pa.scalar(value, field.type), n))
        elif isinstance(value, pa.Array | pa.ChunkedArray):
            arrays.append(value.cast(field.type))
        else:
            arrays.append(pa.array(value, field.type))
    return pa.Table.from_arrays(arrays, schema=COMPLETION_SCHEMA)


def completions_of(
    inits: pa.Table, status: str, now_ms: int, reason: FieldValues = None
) -> pa.Table:
    """A completion per init record of ``inits``, with ``status`` at ``now_ms``: its
    coordinates, and its latency from the init's ``ts``."""
    return completion_table(
        inits.column("root"),
        status,
        topic=inits.column("topic"),
        partition=inits.column("partition"),
        offset=inits.column("offset"),
        attempt=inits.column("attempt"),
        latency_ms=pc.subtract(pa.scalar(now_ms, pa.int64()), inits.column("ts")),
        completed_ms=now_ms,
        reason=reason,
    )


#: Completion statuses that are no outcome of their root.
NOTICES = (ALIVE, CAUGHT_UP)


def caught_up_ms(completions: pa.Table) -> int | None:
    """The latest tick the acker has caught up to in ``completions`` (None: no echo)."""
    echoes = completions.filter(pc.equal(completions.column("status"), CAUGHT_UP))
    return pc.max(echoes.column("completed_ms")).as_py() if echoes.num_rows else None


def one_outcome_per_root(completions: pa.Table) -> pa.Table:
    """One completion per root: of several, any outcome but an ack before an ack, else
    the first read. Two writers may report one root (a read task rejects a record of a
    batch that its topology acks whole), and a wrong ack loses a record where a wrong
    fail only replays it. Notices (``alive``, ``caught_up``) are not outcomes and are
    left out. Rows keep the order they had.

    >>> done = completion_table([7, 8, 7], ["acked", "acked", "rejected"])
    >>> one_outcome_per_root(done).column("status").to_pylist()
    ['acked', 'rejected']
    """
    notice = pc.is_in(completions.column("status"), value_set=pa.array(NOTICES))
    notice = pc.fill_null(notice, False)
    if pc.any(notice).as_py():
        completions = completions.filter(pc.invert(notice))
    if not completions.num_rows:
        return completions
    roots = pc.fill_null(completions.column("root"), 0).to_numpy()
    if not has_duplicates(roots):  # the usual case: nothing to choose
        return completions
    acked = pc.fill_null(pc.equal(completions.column("status"), ACKED), False)
    order = np.argsort(acked.to_numpy(zero_copy_only=False), kind="stable")
    order = order[np.argsort(roots[order], kind="stable")]  # by root, others first
    first = np.concatenate([[True], roots[order][1:] != roots[order][:-1]])
    return completions.take(pa.array(np.sort(order[first])))


def ack_table(
    roots: Values, values: Values, kind: int, now_ms: int, reason: str | None = None
) -> pa.Table:
    """Ack records ``(root, value)`` of one ``kind`` at ``now_ms``, with no source
    coordinates; ``reason`` goes on every record but plain acks."""
    n = len(roots)
    return pa.table(
        {
            "root": pa.array(roots, pa.int64()),
            "value": pa.array(values, pa.int64()),
            "kind": pa.array(np.full(n, kind, np.int8)),
            "topic": pa.nulls(n, pa.string()),
            "partition": pa.nulls(n, pa.int32()),
            "offset": pa.nulls(n, pa.int64()),
            "attempt": pa.nulls(n, pa.int32()),
            "ts": pa.array(np.full(n, now_ms, np.int64)),
            "reason": pa.array([reason if kind != ACK else None] * n, pa.string()),
        },
        schema=ACK_RECORD_SCHEMA,
    )
