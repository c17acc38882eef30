"""Completions of a run of acked offsets in one row, so that a batch that closes all
its trees reports O(partitions) rows, not one per root.

A batch that read offsets ``a..b`` of a partition and closed every tree writes
one completion with ``offset`` a and ``end_offset`` b + 1 (exclusive), ``attempt``
0, ``status`` acked, ``root`` the root id of offset a and ``ids`` the namespace
every root of the run was minted under (``ackstream.ids.root_ids``); a root with
another outcome cuts its run in two (``ackstream.sources.offsets.PlannedRoots``). The source
applies such a row as a whole (:meth:`ackstream.sources.tracking.Tracker.complete`);
every other reader gets one row per root back from the channel (:func:`expand`),
so a run is a transport form, not a second meaning of a completion.

Only roots read anew (attempt 0) run together: a replay, a fail or a root the
acker settled stays a row of its own.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ackstream import ids
from ackstream.records import COMPLETION_SCHEMA

__all__ = ["expand", "is_run"]


def is_run(completions: pa.Table) -> np.ndarray:
    """Mask of the rows of ``completions`` that stand for a run of roots."""
    return completions.column("end_offset").is_valid().to_numpy(zero_copy_only=False)


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
