"""The rows the ``ackstream`` source emits: Spark's Kafka columns plus root, edge, attempt.

As Spark's Kafka source: key, value, topic, partition, offset, timestamp,
timestampType (0: the producer's create time, 1: the broker's log append time), and
with ``includeHeaders`` a ``headers`` column (array of key/value structs, null for a
record without headers); then the lineage columns and ``_reason``.

With tracking on, a read task holds back two kinds of offset from the bolts and says
why in ``_reason`` (null on every other row): an offset with no record
(:data:`NO_RECORD`: compacted away, a transaction marker), whose tree is simply
done, and a value over ``ackstream.maxValueBytes``, which is rejected (dead-lettered
with that reason, no replay). Such a row has no key, value or timestamp. The
topology settles held-back rows before any stage sees them
(``topology.batch.run_batch``); a plain ``foreachBatch`` must do the same (ack the
first kind, reject the second), or their roots time out and replay. They travel in
the batch's own rows, never through a side channel an executor writes: on a
cluster the driver may not see an executor's files."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from ackstream.vocabulary import ids
from ackstream.vocabulary.lineage import ATTEMPT, EDGE, NO_RECORD, REASON, ROOT

__all__ = [
    "NO_RECORD",  # re-exported: the source's rows carry it
    "SOURCE_DDL",
    "SOURCE_SCHEMA",
    "ReadTask",
    "kafka_columns",
    "held_batch",
    "source_schema",
    "spout_batch",
    "too_big_reason",
]

#: a record's Kafka headers: ``(key, value)`` pairs
Headers = Sequence[tuple[str, bytes | None]]

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
_KAFKA_FIELDS = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
]
_LINEAGE_FIELDS = [pa.field(name, pa.int64()) for name in (ROOT, EDGE, ATTEMPT)] + [
    pa.field(REASON, pa.string())
]
_KAFKA_DDL = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int"
)
_LINEAGE_DDL = f"{ROOT} long, {EDGE} long, {ATTEMPT} long, {REASON} string"


def source_schema(include_headers: bool = False) -> pa.Schema:
    """The source's Arrow schema, with the ``headers`` column or without."""
    headers = [pa.field("headers", HEADERS_TYPE)] if include_headers else []
    return pa.schema(_KAFKA_FIELDS + headers + _LINEAGE_FIELDS)


def kafka_columns(include_headers: bool = False) -> list[str]:
    """The columns Spark's Kafka source gives: the source's, lineage aside."""
    headers = ["headers"] if include_headers else []
    return [field.name for field in _KAFKA_FIELDS] + headers


def source_ddl(include_headers: bool = False) -> str:
    """The same schema as Spark DDL (what the data source declares)."""
    headers = "headers array<struct<key: string, value: binary>>, " if include_headers else ""
    return f"{_KAFKA_DDL}, {headers}{_LINEAGE_DDL}"


SOURCE_SCHEMA = source_schema()
SOURCE_DDL = source_ddl()


@dataclass(frozen=True)
class ReadTask:
    """What one Spark task reads: offsets ``[start, end)`` of one topic partition at
    attempt 0, and/or single replayed ``(offset, attempt)`` pairs of that partition.
    Everything ``read()`` needs is here: the executor knows nothing else."""

    topic: str
    partition: int
    start: int = 0
    end: int = 0
    replays: tuple[tuple[int, int], ...] = field(default=())


def spout_batch(
    source: str,
    topic: str,
    partition: int,
    offsets: npt.ArrayLike,
    attempts: npt.ArrayLike,
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None],
    timestamps_ms: npt.ArrayLike,
    timestamp_types: npt.ArrayLike | None = None,
    headers: Sequence[Headers | None] | None = None,
) -> pa.RecordBatch:
    """One Arrow batch of spout tuples; ids by hash, so a re-read gives the same rows.
    ``timestamp_types`` None: all create time; ``headers`` (a list per record of
    ``(key, value)`` pairs, or None) given: the batch has the ``headers`` column."""
    offsets = np.asarray(offsets, dtype=np.int64)
    attempts = np.asarray(attempts, dtype=np.int64)
    roots = ids.root_ids(source, topic, partition, offsets, attempts)
    n = len(offsets)
    types = np.zeros(n, np.int32) if timestamp_types is None else timestamp_types
    columns = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array([topic] * n, pa.string()),
        pa.array(np.full(n, partition, dtype=np.int32)),
        pa.array(offsets),
        pa.array(np.asarray(timestamps_ms, dtype=np.int64) * 1000, pa.timestamp("us", tz="UTC")),
        pa.array(np.asarray(types, dtype=np.int32)),
    ]
    if headers is not None:
        columns.append(
            pa.array(
                [
                    [{"key": k, "value": v} for k, v in pairs] if pairs else None
                    for pairs in headers
                ],
                HEADERS_TYPE,
            )
        )
    columns += [pa.array(roots), pa.array(ids.spout_edges(roots)), pa.array(attempts)]
    columns.append(pa.nulls(n, pa.string()))
    return pa.RecordBatch.from_arrays(columns, schema=source_schema(headers is not None))


def held_batch(
    source: str,
    topic: str,
    partition: int,
    offsets: Sequence[int],
    attempts: Sequence[int],
    reasons: Sequence[str],
    include_headers: bool = False,
) -> pa.RecordBatch:
    """One Arrow batch of held-back rows (see the module doc): no key, value or time."""
    n = len(offsets)
    none = [None] * n
    headers = none if include_headers else None
    rows = spout_batch(
        source, topic, partition, offsets, attempts, none, none, [0] * n, None, headers
    )
    schema = rows.schema
    for name, column in (("timestamp", None), (REASON, reasons)):
        field = schema.field(name)
        column = pa.array(column, field.type) if column else pa.nulls(n, field.type)
        rows = rows.set_column(schema.get_field_index(name), field, column)
    return rows


def too_big_reason(size: int | str, limit: int) -> str:
    """The ``_reason`` of a value of ``size`` bytes held back as over ``limit``
    (``ackstream.maxValueBytes``); both readers say the same."""
    return (
        f"value of {size} bytes is over ackstream.maxValueBytes "
        f"({limit}); raise that option to process it"
    )
