"""The rows the ``ackstream`` source emits: Spark's Kafka columns plus root, edge, attempt."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from ackstream import ids
from ackstream.lineage import ATTEMPT, EDGE, ROOT

__all__ = ["SOURCE_DDL", "SOURCE_SCHEMA", "TP", "ReadTask", "spout_batch"]

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
    ]
)
SOURCE_DDL = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    f"{ROOT} long, {EDGE} long, {ATTEMPT} long"
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
        ],
        schema=SOURCE_SCHEMA,
    )
