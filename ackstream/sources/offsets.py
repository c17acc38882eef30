"""The source's offsets: what one micro-batch reads, known from its offset alone.

An offset (:class:`~ackstream.vocabulary.batch_offset.BatchOffset`, and its JSON
there) is what the driver-side reader returns from ``latestOffset`` and Spark writes
to the query's offset log before the batch runs. Its new ranges and its replays name
every record of the batch, so its read tasks (:func:`read_tasks`) and its roots
(:class:`PlannedRoots`) come from the offset without touching the data. That is what
lets a topology batch report its trees without reading its input a second time: the
topology finds the offset in Spark's offset log (:mod:`ackstream.storage.offset_log`)
under its batch id.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ackstream.sources.rows import ReadTask
from ackstream.vocabulary import ids
from ackstream.vocabulary.batch_offset import BatchOffset, ReplayRun
from ackstream.vocabulary.partition import Partition
from ackstream.vocabulary.records import (
    ACK_RECORD_SCHEMA,
    ACKED,
    INIT,
    completion_table,
    completions_of,
)

__all__ = [
    "ROWS_PER_TASK",
    "covering",
    "REPLAY_COVER_GAP",
    "PlannedRoots",
    "read_tasks",
    "runs_of",
    "spark_reads_replays",
]

#: At most this many offsets of one partition per Spark task.
ROWS_PER_TASK = 100_000
#: Replays of one partition and attempt closer than this many offsets are read by
#: Spark's reader in one range (then filtered to them); farther apart, in ranges of
#: their own, so a record stuck far behind does not make a batch read all between.
REPLAY_COVER_GAP = 100_000


#: A run of new offsets a batch names: ``(namespace, topic, partition, from, to)``, ``to``
#: exclusive.
Run = tuple[str, str, int, int, int]


def spark_reads_replays(runs: Sequence[ReplayRun]) -> bool:
    """Whether Spark's Kafka reader reads replays logged as ``runs`` (with the batch's new
    records): any two records or more. A record replayed alone is read by the source's
    Python reader, which holds back an offset with no record and a value over
    ``ackstream.maxValueBytes`` instead of failing the batch on it."""
    return sum(r[3] - r[2] for r in runs) > 1


def covering(runs: list[tuple[str, int, int, int]]) -> list[tuple[str, int, int, int]]:
    """``(topic, partition, from, to)`` ranges that cover ``runs`` (of one attempt): a
    partition's runs less than :data:`REPLAY_COVER_GAP` apart share a range.

    >>> covering([("t", 0, 5, 9), ("t", 0, 20, 21), ("t", 1, 0, 3), ("t", 0, 500_000, 500_002)])
    [('t', 0, 5, 21), ('t', 0, 500000, 500002), ('t', 1, 0, 3)]
    """
    out: list[list[Any]] = []
    for topic, partition, start, end in sorted(runs):
        last = out[-1] if out else None
        if last and last[:2] == [topic, partition] and start - last[3] <= REPLAY_COVER_GAP:
            last[3] = max(last[3], end)
        else:
            out.append([topic, partition, start, end])
    return [tuple(r) for r in out]


def read_tasks(
    end: BatchOffset,
    min_partitions: int | None = None,
    max_records_per_partition: int | None = None,
) -> list[ReadTask]:
    """The Spark tasks of the batch that ends at ``end``: ranges of at most
    :data:`ROWS_PER_TASK` offsets (or ``max_records_per_partition``, the
    ``maxRecordsPerPartition`` option, if fewer), then the replays, per partition in
    pieces of that size. An offset whose new ranges Spark's Kafka connector reads
    leaves them to it: its tasks read the replays alone.

    With ``min_partitions`` (the ``minPartitions`` option) and fewer ranges than that,
    each range is cut into pieces in proportion to its share of the batch's offsets,
    as Spark's Kafka source does, so a batch of one big partition runs on many cores.
    """
    per_task = min(ROWS_PER_TASK, max_records_per_partition or ROWS_PER_TASK)
    spans = [] if end.spark_reads_new else end.new_ranges()
    total = sum(hi - lo for *_, lo, hi in spans)
    tasks = []
    for topic, p, lo, hi in spans:
        pieces = -(-(hi - lo) // per_task)  # ceiling
        if min_partitions and len(spans) < min_partitions:
            pieces = max(pieces, round((hi - lo) / total * min_partitions))
        pieces = min(max(pieces, 1), hi - lo)
        cuts = [lo + (hi - lo) * i // pieces for i in range(pieces + 1)]
        tasks += [ReadTask(topic, p, a, b) for a, b in zip(cuts, cuts[1:])]
    replays: dict[Partition, list[tuple[int, int]]] = {}
    for topic, p, lo, hi, att in () if end.spark_reads_replays else end.replays:
        replays.setdefault((topic, p), []).extend((off, att) for off in range(lo, hi))
    for (topic, p), pairs in sorted(replays.items()):
        pairs.sort()
        tasks += [
            ReadTask(topic, p, replays=tuple(pairs[i : i + per_task]))
            for i in range(0, len(pairs), per_task)
        ]
    return tasks


def runs_of(replays: Iterable[tuple[str, int, int, int]]) -> list[list[Any]]:
    """Replays given one per record, ``(topic, partition, offset, attempt)``, as the runs of
    consecutive offsets at one attempt an offset logs: a batch that replays a whole
    failed batch logs a run per partition, not an entry per record."""
    runs: list[list[Any]] = []
    for topic, p, off, att in sorted(replays, key=lambda r: (r[0], r[1], r[3], r[2])):
        last = runs[-1] if runs else None
        if last and last[0] == topic and last[1] == p and last[4] == att and last[3] == off:
            last[3] = off + 1
        else:
            runs.append([topic, p, off, off + 1, att])
    return runs


@dataclass
class PlannedRoots:
    """The roots of a batch as its offsets plan them: runs of new offsets (attempt 0),
    whose ids are minted only when their init records are asked for, and the init
    records of the rest (replays). A batch whose trees all close reports the runs as
    they are (:meth:`acked`, see :mod:`ackstream.vocabulary.ranges`), so the driver mints no id
    for them."""

    runs: list[Run]
    #: init records of the roots outside the runs
    singles: pa.Table
    #: when the roots were planned: their inits' ``ts``
    planned_ms: int

    @classmethod
    def of_inits(cls, inits: pa.Table) -> PlannedRoots:
        """Roots known by their init records alone."""
        return cls([], inits, 0)

    @classmethod
    def of_offsets(cls, offsets: Iterable[BatchOffset], now_ms: int) -> PlannedRoots:
        """The roots the ``ackstream`` offsets of a batch name. With tracking off the
        source waits for no root: none."""
        runs: list[Run] = []
        singles = []
        for end in offsets:
            namespace = end.namespace
            if namespace is None:
                continue
            runs += [(namespace, *span) for span in end.new_ranges()]
            replays = list(end.replays)
            if replays:  # scattered failures replay as many runs of one: one table
                singles.append(_inits_of_runs(namespace, replays, now_ms))
        table = pa.concat_tables(singles) if singles else ACK_RECORD_SCHEMA.empty_table()
        return cls(runs, table, now_ms)

    @property
    def num_rows(self) -> int:
        return sum(hi - lo for *_, lo, hi in self.runs) + int(self.singles.num_rows)

    @property
    def namespace(self) -> str | None:
        """The namespace of every run, when they share one."""
        names = {run[0] for run in self.runs}
        return names.pop() if len(names) == 1 else None

    @cached_property
    def inits(self) -> pa.Table:
        """The init record of every root (value 0, with coordinates)."""
        tables = [
            _inits(ns, topic, p, np.arange(lo, hi), 0, self.planned_ms)
            for ns, topic, p, lo, hi in self.runs
        ]
        return pa.concat_tables([*tables, self.singles])

    def inits_of(self, roots: pa.ChunkedArray | pa.Array) -> pa.Table:
        """The init records of those of ``roots`` that are planned here (every id is
        minted, unless ``roots`` is empty)."""
        if not len(roots):
            return ACK_RECORD_SCHEMA.empty_table()
        return self.inits.filter(pc.is_in(self.inits.column("root"), value_set=roots))

    def acked(self, now_ms: int, settled: pa.Table | None = None) -> pa.Table:
        """The completions of every root acked at ``now_ms`` but those whose init records
        are in ``settled`` (their outcome comes from the ledger): a row per run of
        offsets, a row per single root (``COMPLETION_SCHEMA``)."""
        runs, singles = self.runs, self.singles
        if settled is not None and settled.num_rows:
            runs = _cut(runs, settled)
            known = pc.is_in(singles.column("root"), value_set=settled.column("root"))
            singles = singles.filter(pc.invert(known))
        latency = now_ms - self.planned_ms
        return pa.concat_tables(
            [
                completion_table(
                    _first_roots(runs),
                    ACKED,
                    topic=[run[1] for run in runs],
                    partition=[run[2] for run in runs],
                    offset=[run[3] for run in runs],
                    attempt=0,
                    latency_ms=latency,
                    completed_ms=now_ms,
                    end_offset=[run[4] for run in runs],
                    ids=[run[0] for run in runs],
                ),
                completions_of(singles, ACKED, now_ms),
            ]
        )


def _cut(runs: list[Run], settled: pa.Table) -> list[Run]:
    """``runs`` without the attempt-0 offsets of ``settled`` (init records): each run
    split around them."""
    first = settled.filter(pc.equal(settled.column("attempt"), 0))
    cuts: dict[tuple[str, int], list[int]] = {}
    for topic, partition, offset in zip(
        *(first.column(c).to_pylist() for c in ("topic", "partition", "offset"))
    ):
        cuts.setdefault((topic, partition), []).append(offset)
    out = []
    for ns, topic, p, lo, hi in runs:
        at = np.sort(np.asarray(cuts.get((topic, p), []), np.int64))
        at = at[(at >= lo) & (at < hi)]
        bounds = zip(np.concatenate([[lo], at + 1]).tolist(), np.append(at, hi).tolist())
        out += [(ns, topic, p, a, b) for a, b in bounds if b > a]
    return out


def _first_roots(runs: list[Run]) -> np.ndarray:
    """The root id of each run's first offset (attempt 0), hashed a namespace at a time:
    runs cut around scattered failures are thousands a batch."""
    out = np.empty(len(runs), np.int64)
    for namespace in {run[0] for run in runs}:
        at = np.flatnonzero([run[0] == namespace for run in runs])
        _, topics, partitions, starts, _ = zip(*(runs[i] for i in at))
        out[at] = ids.root_ids(namespace, list(topics), partitions, starts, 0)
    return out


def _inits_of_runs(namespace: str, runs: Sequence[ReplayRun], now_ms: int) -> pa.Table:
    """Init records of every offset of ``runs`` (``(topic, partition, from, to,
    attempt)``), in one table."""
    topics, partitions, starts, ends, attempts = (np.asarray(c) for c in zip(*runs))
    sizes = ends - starts
    offsets = np.arange(sizes.sum()) + np.repeat(starts - (np.cumsum(sizes) - sizes), sizes)
    return _inits(
        namespace,
        np.repeat(topics.astype(object), sizes),
        np.repeat(partitions, sizes),
        offsets,
        np.repeat(attempts, sizes),
        now_ms,
    )


def _inits(
    namespace: str,
    topic: str | np.ndarray,
    partition: int | np.ndarray,
    offsets: np.ndarray,
    attempt: int | np.ndarray,
    now_ms: int,
) -> pa.Table:
    """Init records (value 0) of ``offsets``; ``topic``, ``partition`` and ``attempt``
    one for all or one per offset."""
    n = len(offsets)
    topics = [topic] * n if isinstance(topic, str) else topic
    return pa.table(
        {
            "root": ids.root_ids(namespace, topic, partition, offsets, attempt),
            "value": np.zeros(n, np.int64),
            "kind": np.full(n, INIT, np.int8),
            "topic": pa.array(topics, pa.string()),
            "partition": np.broadcast_to(np.asarray(partition, np.int32), n).copy(),
            "offset": np.asarray(offsets, np.int64),
            "attempt": np.broadcast_to(np.asarray(attempt, np.int32), n).copy(),
            "ts": np.full(n, now_ms, np.int64),
            "reason": pa.nulls(n, pa.string()),
        },
        schema=ACK_RECORD_SCHEMA,
    )
