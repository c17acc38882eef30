"""Completions of a run of acked offsets in one row, so that a batch that closes all
its trees reports O(partitions) rows, not one per root.

A batch that read offsets ``a..b`` of a partition and closed every tree writes
one completion with ``offset`` a and ``end_offset`` b + 1 (exclusive), ``attempt``
0, ``status`` acked, ``root`` the root id of offset a and ``ids`` the namespace
every root of the run was minted under (``ackstream.ids.root_ids``). The source
applies such a row as a whole (:meth:`ackstream.sources.tracking.Tracker.complete`);
every other reader gets one row per root back from the channel (:func:`expand`),
so a run is a transport form, not a second meaning of a completion.

Only acked roots at attempt 0 with the same latency and completion time run
together: a replay, a fail or a root the acker settled stays a row of its own.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ackstream import ids
from ackstream.records import ACKED, COMPLETION_SCHEMA

__all__ = ["compact", "expand", "is_run"]

#: Columns that must agree between neighbours for them to share a run.
_SAME = ("partition", "latency_ms", "completed_ms")


def is_run(completions: pa.Table) -> np.ndarray:
    """Mask of the rows of ``completions`` that stand for a run of roots."""
    return completions.column("end_offset").is_valid().to_numpy(zero_copy_only=False)


def compact(done: pa.Table, namespace: str) -> pa.Table:
    """``done`` (completions, one row per root, ``COMPLETION_SCHEMA``) with every run of
    two or more acked attempt-0 offsets of one partition in one row. The caller vouches
    that their roots were minted under ``namespace`` (a batch's planned inits are);
    the first of each run is checked, the rest are not hashed again."""
    if done.num_rows < 2:
        return done
    status, attempt = done.column("status"), done.column("attempt")
    candidate = pc.and_(pc.equal(status, ACKED), pc.equal(attempt, 0))
    for name in ("topic", "partition", "offset", "latency_ms", "completed_ms"):
        candidate = pc.and_(candidate, done.column(name).is_valid())
    candidate = pc.and_(candidate, done.column("end_offset").is_null())
    mask = pc.fill_null(candidate, False).to_numpy(zero_copy_only=False)
    if mask.sum() < 2:
        return done
    rows = done.filter(pa.array(mask))
    topic = pc.dictionary_encode(rows.column("topic")).combine_chunks()
    columns = {name: rows.column(name).to_numpy() for name in ("offset", *_SAME)}
    columns["topic"] = topic.indices.to_numpy()
    order = np.lexsort([columns[k] for k in ("offset", "partition", "topic")])
    columns = {k: v[order] for k, v in columns.items()}
    offset = columns["offset"]
    joined = offset[1:] == offset[:-1] + 1  # row i+1 continues the run of row i
    for name in ("topic", *_SAME):
        joined &= columns[name][1:] == columns[name][:-1]
    starts = np.flatnonzero(np.concatenate([[True], ~joined]))
    ends = np.append(starts[1:], len(offset))  # exclusive, in rows
    long = ends - starts >= 2
    first = rows.take(pa.array(order[starts[long]]))
    end_offset = offset[ends[long] - 1] + 1
    mine = _minted_under(first, namespace)
    runs = first.filter(pa.array(mine)).set_column(
        COMPLETION_SCHEMA.get_field_index("end_offset"),
        COMPLETION_SCHEMA.field("end_offset"),
        pa.array(end_offset[mine], pa.int64()),
    )
    runs = runs.set_column(
        COMPLETION_SCHEMA.get_field_index("ids"),
        COMPLETION_SCHEMA.field("ids"),
        pa.array([namespace] * runs.num_rows, pa.string()),
    )
    in_runs = np.zeros(len(offset), bool)
    for lo, hi in zip(starts[long][mine].tolist(), ends[long][mine].tolist()):
        in_runs[lo:hi] = True
    kept_candidates = np.zeros(done.num_rows, bool)
    kept_candidates[np.flatnonzero(mask)[order[~in_runs]]] = True
    singles = done.filter(pa.array(~mask | kept_candidates))
    return pa.concat_tables([singles, runs])


def _minted_under(first: pa.Table, namespace: str) -> np.ndarray:
    """Whether each row's root is the id ``namespace`` mints for its coordinates."""
    expected = ids.root_ids(
        namespace,
        first.column("topic").to_numpy(zero_copy_only=False),
        first.column("partition").to_numpy(),
        first.column("offset").to_numpy(),
        first.column("attempt").to_numpy(),
    )
    return np.asarray(expected == first.column("root").to_numpy(), bool)


def expand(completions: pa.Table) -> pa.Table:
    """``completions`` with every run (see the module doc) as one row per root, in its
    place: what every reader but the source sees."""
    run = is_run(completions)
    if not run.any():
        return completions
    offset = _filled(completions, "offset")
    sizes = np.where(run, _filled(completions, "end_offset") - offset, 1).clip(1)
    take = np.repeat(np.arange(completions.num_rows), sizes)
    step = np.arange(len(take)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    rows = completions.take(pa.array(take))
    from_run = run[take]
    new_offset = np.where(from_run, offset[take] + step, offset[take])
    root = _filled(rows, "root").copy()
    namespaces = rows.column("ids").to_numpy(zero_copy_only=False)
    for namespace in set(namespaces[from_run].tolist()):
        at = from_run & (namespaces == namespace)
        root[at] = ids.root_ids(
            namespace,
            rows.column("topic").to_numpy(zero_copy_only=False)[at],
            _filled(rows, "partition")[at],
            new_offset[at],
            _filled(rows, "attempt")[at],
        )
    replaced = {
        "root": pa.array(root, pa.int64(), mask=_nulls(rows, "root")),
        "offset": pa.array(new_offset, pa.int64(), mask=_nulls(rows, "offset")),
        "end_offset": pa.nulls(rows.num_rows, pa.int64()),
        "ids": pa.nulls(rows.num_rows, pa.string()),
    }
    for name, values in replaced.items():
        at = COMPLETION_SCHEMA.get_field_index(name)
        rows = rows.set_column(at, COMPLETION_SCHEMA.field(name), values)
    return rows


def _filled(table: pa.Table, name: str) -> np.ndarray:
    """Column ``name`` as int64 numpy, nulls as 0."""
    return pc.fill_null(table.column(name), 0).to_numpy().astype(np.int64)


def _nulls(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).is_null().to_numpy(zero_copy_only=False)
