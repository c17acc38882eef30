"""Records as numpy columns: rows of roots, and runs of consecutive offsets.

What the in-flight table (:mod:`ackstream.sources.in_flight`), the replays waiting
(:mod:`ackstream.sources.waiting`) and the source's state files
(:mod:`ackstream.sources.state`) pass each other: a column per field, a row per root
(:class:`Roots`) or per run of records (:class:`Spans`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = [
    "EMPTY",
    "Coordinates",
    "EMPTY_SPANS",
    "NOT_STARTED",
    "Changes",
    "Roots",
    "Spans",
    "started_at_or_before",
]

#: ``part``, ``offset`` and ``attempt`` of some records, a column each
Coordinates = tuple[np.ndarray, np.ndarray, np.ndarray]

#: ``emitted_ms`` of a root whose batch Spark has not run yet: its timeout has not begun.
NOT_STARTED = -1


def _own(col: np.ndarray, shape: tuple[int, ...], size: int) -> np.ndarray:
    """``col`` as a flat column of ``size`` rows of its own: a scalar repeated, an array
    broadcast to ``shape`` and copied (a caller's array is never shared)."""
    if not col.ndim:
        return np.full(size, col)
    return np.broadcast_to(col, shape).reshape(-1).copy()


class Roots(NamedTuple):
    """Rows of the in-flight table, one numpy column each; ``part`` indexes the
    tracker's partitions; ``batch`` numbers the batch the source planned the root in
    (a batch that fails as a whole fails these roots together)."""

    root: np.ndarray
    part: np.ndarray
    offset: np.ndarray
    attempt: np.ndarray
    emitted_ms: np.ndarray
    batch: np.ndarray

    @classmethod
    def of(
        cls,
        root: npt.ArrayLike,
        part: npt.ArrayLike,
        offset: npt.ArrayLike,
        attempt: npt.ArrayLike,
        emitted_ms: npt.ArrayLike,
        batch: npt.ArrayLike = 0,
    ) -> Roots:
        """Columns of the right types, the rows' own (copies); scalars are repeated to
        the length of the others."""
        values = (root, part, offset, attempt, emitted_ms, batch)
        columns = [np.asarray(v, np.int64) for v in values]
        shape = np.broadcast_shapes(*(col.shape for col in columns))
        size = math.prod(shape)
        return cls(*(_own(col, shape, size) for col in columns))

    def sorted_by(self, *keys: str) -> Roots:
        """The rows ordered by ``keys``, the first key major."""
        order = np.lexsort([getattr(self, k) for k in reversed(keys)])
        return self.at(order)

    def at(self, index: np.ndarray) -> Roots:
        """The rows at ``index`` (positions or a mask)."""
        return Roots(*(col[index] for col in self))

    @staticmethod
    def concat(parts: list[Roots]) -> Roots:
        if len(parts) == 1:  # the usual take: one chunk's rows, no copy
            return parts[0]
        return Roots(*(np.concatenate(cols) for cols in zip(*parts))) if parts else EMPTY


EMPTY = Roots.of([], 0, [], 0, 0)


class Spans(NamedTuple):
    """Records as runs of consecutive offsets, one row per run: ``[start, end)`` of the
    partition indexed ``part`` at ``attempt``."""

    part: np.ndarray
    attempt: np.ndarray
    start: np.ndarray
    end: np.ndarray

    @classmethod
    def of_rows(cls, part: npt.ArrayLike, offset: npt.ArrayLike, attempt: npt.ArrayLike) -> Spans:
        """The runs of records given a row each: a row whose offset follows the row
        before it (same partition and attempt) continues its run, so rows ordered by
        partition, attempt and offset give the fewest runs."""
        part, offset, attempt = np.broadcast_arrays(
            *(np.asarray(c, np.int64).reshape(-1) for c in (part, offset, attempt))
        )
        if not len(offset):
            return EMPTY_SPANS
        cut = np.ones(len(offset), bool)
        cut[1:] = (
            (part[1:] != part[:-1])
            | (attempt[1:] != attempt[:-1])
            | (offset[1:] != offset[:-1] + 1)
        )
        first = np.flatnonzero(cut)
        last = np.append(first[1:], len(offset)) - 1
        return cls(part[first], attempt[first], offset[first], offset[last] + 1)

    @staticmethod
    def concat(parts: list[Spans]) -> Spans:
        parts = [p for p in parts if len(p.start)]
        if len(parts) == 1:
            return parts[0]
        return Spans(*(np.concatenate(cols) for cols in zip(*parts))) if parts else EMPTY_SPANS

    @property
    def runs(self) -> int:
        return len(self.start)

    @property
    def records(self) -> int:
        return int((self.end - self.start).sum())

    def at(self, index: np.ndarray) -> Spans:
        """The runs at ``index`` (positions or a mask)."""
        return Spans(*(col[index] for col in self))

    def rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``part``, ``offset`` and ``attempt`` of every record, run after run."""
        length = self.end - self.start
        within = np.arange(int(length.sum())) - np.repeat(np.cumsum(length) - length, length)
        return (
            np.repeat(self.part, length),
            np.repeat(self.start, length) + within,
            np.repeat(self.attempt, length),
        )


EMPTY_SPANS = Spans(*(np.empty(0, np.int64) for _ in range(4)))


class Changes(NamedTuple):
    """Records in flight at :meth:`InFlight.mark` taken out since (``removed``), and
    records added since and still in flight (``added``): what was in flight at the
    mark, less ``removed``, plus ``added``, is in flight now. A record added and taken
    again since is in neither."""

    added: Spans
    removed: Spans

    @property
    def runs(self) -> int:
        return self.added.runs + self.removed.runs


def started_at_or_before(rows: Roots, ms: int) -> np.ndarray:
    """Mask of ``rows`` whose timeout started at ``ms`` or earlier."""
    started: np.ndarray = (rows.emitted_ms != NOT_STARTED) & (rows.emitted_ms <= ms)
    return started
