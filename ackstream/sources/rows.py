"""The rows the ``ackstream`` source emits: Spark's Kafka columns plus root, edge, attempt.

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

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from ackstream import ids
from ackstream.lineage import ATTEMPT, EDGE, NO_RECORD, REASON, ROOT

__all__ = [
    "NO_RECORD",  # re-exported: the source's rows carry it
    "SOURCE_DDL",
    "SOURCE_SCHEMA",
    "TP",
    "ReadTask",
    "held_batch",
    "spout_batch",
]

TP = tuple[str, int]  #: an upstream partition: (topic, partition)

SOURCE_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field(ROOT, pa.int64()),
        pa.field(EDGE, pa.int64()),
        pa.field(ATTEMPT, pa.int64()),
        pa.field(REASON, pa.string()),
    ]
)
SOURCE_DDL = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    f"{ROOT} long, {EDGE} long, {ATTEMPT} long, {REASON} string"
)


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
    source: str, topic: str, partition: int, offsets, attempts, keys, values, timestamps_ms
) -> pa.RecordBatch:
    """One Arrow batch of spout tuples; ids by hash, so a re-read gives the same rows."""
    offsets = np.asarray(offsets, dtype=np.int64)
    attempts = np.asarray(attempts, dtype=np.int64)
    roots = ids.root_ids(source, topic, partition, offsets, attempts)
    n = len(offsets)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array([topic] * n, pa.string()),
            pa.array(np.full(n, partition, dtype=np.int32)),
            pa.array(offsets),
            pa.array(
                np.asarray(timestamps_ms, dtype=np.int64) * 1000, pa.timestamp("us", tz="UTC")
            ),
            pa.array(roots),
            pa.array(ids.spout_edges(roots)),
            pa.array(attempts),
            pa.nulls(n, pa.string()),
        ],
        schema=SOURCE_SCHEMA,
    )


def held_batch(source: str, topic: str, partition: int, offsets, attempts, reasons):
    """One Arrow batch of held-back rows (see the module doc): no key, value or time."""
    n = len(offsets)
    rows = spout_batch(source, topic, partition, offsets, attempts, [None] * n, [None] * n, [0] * n)
    for name, column in (("timestamp", None), (REASON, reasons)):
        field = SOURCE_SCHEMA.field(name)
        column = pa.array(column, field.type) if column else pa.nulls(n, field.type)
        rows = rows.set_column(SOURCE_SCHEMA.get_field_index(name), field, column)
    return rows
