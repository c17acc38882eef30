"""Completions of a run of acked offsets in one row, so that a batch that closes all
its trees reports O(partitions) rows, not one per root.

A batch that read offsets ``a..b`` of a partition and closed every tree writes
one completion with ``offset`` a and ``end_offset`` b + 1 (exclusive), ``attempt``
0, ``status`` acked, ``root`` the root id of offset a and ``ids`` the namespace
every root of the run was minted under (``ackstream.vocabulary.ids.root_ids``); a root with
another outcome cuts its run in two (``ackstream.sources.offsets.PlannedRoots``). The source
applies such a row as a whole (:meth:`ackstream.sources.tracking.Tracker.complete`);
every other reader gets one row per root back from the channel (:func:`expand`),
so a run is a transport form, not a second meaning of a completion.

Only roots read anew (attempt 0) run together: a replay, a fail or a root the
acker settled stays a row of its own.

A row claims its run's offsets: a reader that counts them first keeps only the runs
a partition can hold (:func:`checked`), so that what it expands is bounded by the
partitions' offsets, not by what a damaged or foreign row says.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ackstream.vocabulary import ids
from ackstream.vocabulary.records import COMPLETION_SCHEMA, INVALID

__all__ = ["checked", "expand", "is_run"]


def is_run(completions: pa.Table) -> np.ndarray:
    """Mask of the rows of ``completions`` that stand for a run of roots."""
    runs: np.ndarray = completions.column("end_offset").is_valid().to_numpy(zero_copy_only=False)
    return runs


def checked(completions: pa.Table, ends: Mapping[tuple[str, int], int]) -> pa.Table:
    """``completions`` with each run that its partition cannot hold turned into one
    ``invalid`` row, which :func:`expand` leaves whole and readers count apart: a run
    of a partition not in ``ends`` (``{(topic, partition): end offset}``, as far as the
    topology's source could have read), past that end, empty, or whose root is not the
    one its namespace mints for its first offset (the source ignores such a row too).

    >>> from ackstream.vocabulary.records import completion_table
    >>> first = int(ids.root_ids("topo", "t", [0], [0], 0)[0])
    >>> runs = completion_table([first, first], "acked", topic="t", partition=0, offset=0,
    ...                         attempt=0, end_offset=[4, 1_000_000], ids="topo")
    >>> checked(runs, {("t", 0): 4}).column("status").to_pylist()
    ['acked', 'invalid']
    >>> expand(checked(runs, {("t", 0): 4})).num_rows  # 4 roots, and the invalid row
    5
    """
    at = np.flatnonzero(is_run(completions))
    if not len(at):
        return completions
    rows = completions.take(pa.array(at))
    topic = rows.column("topic").to_numpy(zero_copy_only=False)
    namespace = rows.column("ids").to_numpy(zero_copy_only=False)
    part, first, end = (_filled(rows, c) for c in ("partition", "offset", "end_offset"))
    held = np.array([ends.get(tp, -1) for tp in zip(topic.tolist(), part.tolist())], np.int64)
    fits = (first >= 0) & (end > first) & (end <= held)
    good = fits & rows.column("ids").is_valid().to_numpy(zero_copy_only=False)
    for name in set(namespace[good].tolist()):
        mine = good & (namespace == name)
        minted = ids.root_ids(name, topic[mine], part[mine], first[mine], 0)
        good[mine] = minted == _filled(rows, "root")[mine]
    if good.all():
        return completions
    bad = np.zeros(completions.num_rows, bool)
    bad[at[~good]] = True
    why = np.full(completions.num_rows, None, object)
    for i, t, p, a, b, h, f in zip(
        at[~good], *(c[~good].tolist() for c in (topic, part, first, end, held, fits))
    ):
        why[i] = f"a run of offsets {a} to {b} of {t}[{p}]: " + (
            "its first root is not the one its namespace mints"
            if f
            else f"the partition ends at {h}"
            if h >= 0
            else "not a partition its source reads"
        )
    mask = pa.array(bad)
    replaced = {
        "status": pa.scalar(INVALID),
        "reason": pa.array(why, pa.string()),
        "end_offset": pa.scalar(None, pa.int64()),
        "ids": pa.scalar(None, pa.string()),
    }
    for name, value in replaced.items():
        index = COMPLETION_SCHEMA.get_field_index(name)
        column = pc.if_else(mask, value, completions.column(name))
        completions = completions.set_column(index, COMPLETION_SCHEMA.field(name), column)
    return completions


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
    values: np.ndarray = pc.fill_null(table.column(name), 0).to_numpy()
    return values.astype(np.int64)


def _nulls(table: pa.Table, name: str) -> np.ndarray:
    nulls: np.ndarray = table.column(name).is_null().to_numpy(zero_copy_only=False)
    return nulls
