"""The roots a source has in flight, as numpy columns in chunks.

The source's driver puts every record it emits here, and takes them out as their
completions come: a run of offsets at once, one record by its coordinates, or one
root by its id (a fail, a timeout, the acker's outcomes). A source with a million
roots in flight and a thousand new ones a batch must not pay a million per batch:

- each batch's roots are a chunk of their own, sorted by a packed key of their
  coordinates, so finding a run or a record is a binary search per chunk;
- a root taken out is only marked gone; a chunk is compacted once half of it is
  gone, and the smallest chunks are merged once there are many;
- root ids are minted lazily (``mint(part, offset, attempt)``), per chunk, only when
  a lookup by id needs them: a batch whose trees all close comes back as runs of
  offsets (:mod:`ackstream.ranges`), so in the steady state no id is computed;
- each row knows whether it was added since :meth:`InFlight.mark`, and rows that were
  there at the mark are remembered when a compaction drops them, so the changes since
  (:meth:`InFlight.changes`) are a few masks, and the source's state file can be
  written as the changes since its last whole file.

Coordinates are in flight at most once (the tracker adds a record only after taking
its earlier attempt out).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

__all__ = ["NOT_STARTED", "Changes", "InFlight", "Roots"]

#: ``emitted_ms`` of a root whose batch Spark has not run yet: its timeout has not begun.
NOT_STARTED = -1
#: More chunks than this and the smallest half are merged into one.
MAX_CHUNKS = 16

#: a packed key holds a partition index below 2**15, an attempt below 255 and an
#: offset below 2**40 (see :func:`_key`)
_PARTS, _ATTEMPTS, _OFFSETS = 1 << 15, 255, 1 << 40


def _own(col: np.ndarray, shape: tuple, size: int) -> np.ndarray:
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
    def of(cls, root, part, offset, attempt, emitted_ms, batch=0) -> Roots:
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

    def at(self, index) -> Roots:
        """The rows at ``index`` (positions or a mask)."""
        return Roots(*(col[index] for col in self))

    @staticmethod
    def concat(parts: list[Roots]) -> Roots:
        if len(parts) == 1:  # the usual take: one chunk's rows, no copy
            return parts[0]
        return Roots(*(np.concatenate(cols) for cols in zip(*parts))) if parts else EMPTY


EMPTY = Roots.of([], 0, [], 0, 0)


class Changes(NamedTuple):
    """In-flight coordinates (``part``, ``offset``, ``attempt`` columns each) taken out
    of those there at :meth:`InFlight.mark`, and added since and still in flight: what
    was in flight at the mark, less ``removed``, plus ``added``, is in flight now. A
    record added and taken again since is in neither."""

    added: tuple[np.ndarray, np.ndarray, np.ndarray]
    removed: tuple[np.ndarray, np.ndarray, np.ndarray]


class _Chunk:
    """Rows added together, sorted by their packed key when every row has one (else in
    the order given, and searched by masks); ``live`` marks the rows not taken."""

    def __init__(self, rows: Roots, minted: bool, new: np.ndarray):
        self.keys: np.ndarray | None = None
        if _all_packable(rows.part, rows.offset, rows.attempt):
            keys = _key(rows.part, rows.offset, rows.attempt)
            if len(keys) > 1 and (keys[1:] < keys[:-1]).any():
                order = np.argsort(keys, kind="stable")
                keys, rows, new = keys[order], rows.at(order), new[order]
            self.keys = keys
        self.rows, self.minted = rows, minted
        self.new = new  # added since the table's mark
        self.live = np.ones(len(rows.offset), bool)
        self.count = len(rows.offset)
        self._by_root: np.ndarray | None = None  # the rows' order by root id
        self._sorted_roots = np.empty(0, np.int64)

    def minted_rows(self, mint) -> Roots:
        if not self.minted:
            root = np.asarray(mint(self.rows.part, self.rows.offset, self.rows.attempt), np.int64)
            self.rows = self.rows._replace(root=root)
            self.minted = True
        return self.rows

    def find_roots(self, roots: np.ndarray, mint) -> np.ndarray:
        """Positions of the live rows whose id is in sorted ``roots``."""
        rows = self.minted_rows(mint)
        if self._by_root is None:
            self._by_root = np.argsort(rows.root, kind="stable")
            self._sorted_roots = rows.root[self._by_root]
        at = np.searchsorted(self._sorted_roots, roots).clip(0, len(self._by_root) - 1)
        hit = self._by_root[at[self._sorted_roots[at] == roots]]
        return hit[self.live[hit]]

    def find_keys(self, keys: np.ndarray | None, part, offset, attempt) -> np.ndarray:
        """Positions of the live rows at the coordinates given (``keys`` their packed
        keys, sorted, or None where some have none)."""
        if self.keys is not None and keys is not None:
            at = np.searchsorted(self.keys, keys).clip(0, len(self.keys) - 1)
            hit = np.unique(at[self.keys[at] == keys])
        else:
            rows, mask = self.rows, np.zeros(len(self.live), bool)
            for p, o, a in zip(part.tolist(), offset.tolist(), attempt.tolist()):
                mask |= (rows.part == p) & (rows.offset == o) & (rows.attempt == a)
            hit = np.flatnonzero(mask)
        return hit[self.live[hit]]

    def find_spans(self, spans: np.ndarray) -> np.ndarray:
        """Positions of the live rows at attempt 0 in ``spans`` (rows ``(part, from, to)``)."""
        if self.keys is not None and _all_packable(spans[:, 0], spans[:, 2] - 1, 0):
            lo = np.searchsorted(self.keys, _key(spans[:, 0], spans[:, 1].clip(0), 0))
            hi = np.searchsorted(self.keys, _key(spans[:, 0], spans[:, 2], 0))
            lengths = hi - lo
            lo, hi, lengths = lo[lengths > 0], hi[lengths > 0], lengths[lengths > 0]
            if not len(lengths):
                return np.empty(0, np.int64)
            order = np.argsort(lo, kind="stable")
            if (lo[order][1:] < hi[order][:-1]).any():  # spans that overlap: once each
                covered = np.zeros(len(self.keys) + 1, np.int64)
                np.add.at(covered, lo, 1)
                np.add.at(covered, hi, -1)
                hit = np.flatnonzero(np.cumsum(covered)[:-1] > 0)
            else:
                starts = np.cumsum(lengths) - lengths
                hit = np.repeat(lo - starts, lengths) + np.arange(lengths.sum())
        else:
            rows, mask = self.rows, np.zeros(len(self.live), bool)
            for p, a, b in spans.tolist():
                mask |= (rows.part == p) & (rows.offset >= a) & (rows.offset < b)
            hit = np.flatnonzero(mask & (rows.attempt == 0))
        return hit[self.live[hit]]

    def take(self, hit: np.ndarray) -> Roots:
        """Mark the rows at positions ``hit`` (distinct, live) gone and return them."""
        whole = len(hit) == self.count == len(self.live)  # the usual batch, acked whole
        self.live[hit] = False
        self.count -= len(hit)
        return self.rows if whole and (hit[1:] > hit[:-1]).all() else self.rows.at(hit)

    def compacted(self, removed: list, share: float = 0.5) -> _Chunk:
        """This chunk without the rows taken once more than ``share`` of it is gone (any,
        if 0); the rows dropped that were there at the mark go to ``removed``."""
        gone = len(self.live) - self.count
        if not gone or gone <= share * len(self.live):
            return self
        removed.append(self.gone_since_mark())
        return _Chunk(self.rows.at(self.live), self.minted, self.new[self.live])

    def gone_since_mark(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The coordinates of the rows taken that were in flight at the table's mark."""
        if not self.count and not self.new.any():  # all gone, all there at the mark
            return self.rows.part, self.rows.offset, self.rows.attempt
        gone = ~self.live & ~self.new
        return self.rows.part[gone], self.rows.offset[gone], self.rows.attempt[gone]


class InFlight:
    """Roots in flight (see the module doc). A root id names one record at one
    attempt, so it is in the table at most once."""

    def __init__(self, mint: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]):
        self._chunks: list[_Chunk] = []
        self._mint = mint
        #: coordinates of rows there at mark() that compactions dropped
        self._removed: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def __len__(self) -> int:
        return sum(chunk.count for chunk in self._chunks)

    @property
    def rows(self) -> Roots:
        """Every row, ids minted, ordered by id (for tests and the rare full listing)."""
        rows = Roots.concat([c.minted_rows(self._mint).at(c.live) for c in self._chunks])
        return rows.at(np.argsort(rows.root, kind="stable"))

    def flying(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``part``, ``offset`` and ``attempt`` of every row in flight, each chunk's
        sorted by them."""
        return _concat(
            [
                (c.rows.part, c.rows.offset, c.rows.attempt)
                if c.count == len(c.live)
                else (c.rows.part[c.live], c.rows.offset[c.live], c.rows.attempt[c.live])
                for c in self._chunks
            ]
        )

    def add_unminted(self, part, offset, attempt, emitted_ms, batch) -> None:
        """Put records in flight by coordinates; their ids are minted when needed."""
        new = Roots.of(0, part, offset, attempt, emitted_ms, batch)
        if not len(new.offset):
            return
        self._chunks.append(_Chunk(new, minted=False, new=np.ones(len(new.offset), bool)))
        if len(self._chunks) > MAX_CHUNKS:
            self._merge_smallest()

    def take(self, roots) -> Roots:
        """Remove those of ``roots`` that are in flight and return their rows (ids set)."""
        roots = np.unique(np.asarray(roots, np.int64))
        if not len(roots):
            return EMPTY
        return self._take_each(lambda c: c.find_roots(roots, self._mint))

    def take_at(self, part, offset, attempt) -> Roots:
        """Remove the rows of these coordinates (``part`` indexes the partitions) and
        return them, without minting an id."""
        part, offset, attempt = (np.asarray(v, np.int64) for v in (part, offset, attempt))
        if not len(offset):
            return EMPTY
        keys = (
            np.sort(_key(part, offset, attempt)) if _all_packable(part, offset, attempt) else None
        )
        return self._take_each(lambda c: c.find_keys(keys, part, offset, attempt))

    def take_runs(self, spans) -> Roots:
        """Remove the rows at attempt 0 whose offsets lie in ``spans`` (``(part, from,
        to)``, ``to`` exclusive) and return them, without minting an id."""
        spans = np.array(spans, np.int64).reshape(-1, 3)
        if not len(spans):
            return EMPTY
        return self._take_each(lambda c: c.find_spans(spans))

    def take_where(self, select: Callable[[Roots], np.ndarray]) -> Roots:
        """Remove the rows for which ``select`` (a mask over a chunk's rows, ids not
        minted) is true and return them."""
        return self._take_each(lambda c: np.flatnonzero(select(c.rows) & c.live))

    def take_offsets(self, part: int, offsets) -> Roots:
        """Remove the roots of these offsets of partition ``part``, at any attempt."""
        offsets = np.asarray(offsets, np.int64)
        return self.take_where(lambda rows: (rows.part == part) & np.isin(rows.offset, offsets))

    def _take_each(self, find: Callable[[_Chunk], np.ndarray]) -> Roots:
        taken = []
        for chunk in self._chunks:
            hit = find(chunk)
            if len(hit):
                taken.append(chunk.take(hit))
        if taken:
            self._chunks = [c.compacted(self._removed) for c in self._chunks]
            self._chunks = [c for c in self._chunks if c.count]
        return Roots.concat(taken)

    def _merge_smallest(self) -> None:
        """Merge the smaller half of the chunks into one (sorted again by key)."""
        self._chunks.sort(key=lambda c: c.count)
        half = len(self._chunks) // 2
        small, self._chunks = self._chunks[:half], self._chunks[half:]
        minted = all(c.minted for c in small)
        self._removed += [c.gone_since_mark() for c in small]
        rows = Roots.concat([c.rows.at(c.live) for c in small])
        new = np.concatenate([c.new[c.live] for c in small])
        self._chunks.append(_Chunk(rows, minted, new))

    def restart(self, roots, now_ms: int) -> None:
        """Those of ``roots`` in flight whose timeout has started start it again at
        ``now_ms`` (the acker reported a reset of their trees)."""
        roots = np.unique(np.asarray(roots, np.int64))
        if not len(roots):
            return
        for chunk in self._chunks:
            hit = chunk.find_roots(roots, self._mint)
            emitted = chunk.rows.emitted_ms
            emitted[hit[emitted[hit] != NOT_STARTED]] = now_ms

    def start(self, now_ms: int) -> None:
        """Roots not started start their timeout at ``now_ms``."""
        for chunk in self._chunks:
            emitted = chunk.rows.emitted_ms
            emitted[emitted == NOT_STARTED] = now_ms

    def delay(self, ms: int) -> None:
        """Started roots start their timeout ``ms`` later (time that does not count)."""
        for chunk in self._chunks:
            emitted = chunk.rows.emitted_ms
            emitted[emitted != NOT_STARTED] += ms

    def any_started_at_or_before(self, ms: int) -> bool:
        return any(
            (started_at_or_before(c.rows, ms) & c.live).any() for c in self._chunks if c.count
        )

    def mark(self) -> None:
        """What is in flight now is written down: :meth:`changes` count from here."""
        self._chunks = [c.compacted([], share=0) for c in self._chunks]
        self._chunks = [c for c in self._chunks if c.count]
        for chunk in self._chunks:
            chunk.new[:] = False
        self._removed = []

    def changes(self) -> Changes:
        """The coordinates taken out and added since :meth:`mark` (see :class:`Changes`):
        a mask per chunk, no sort."""
        added = [(c.rows.part, c.rows.offset, c.rows.attempt) for c in self._chunks]
        added = [tuple(col[c.live & c.new] for col in cols) for c, cols in zip(self._chunks, added)]
        removed = [*self._removed, *(c.gone_since_mark() for c in self._chunks)]
        return Changes(_concat(added), _concat(removed))

    def changed(self) -> int:
        """How many rows :meth:`changes` would give, without gathering them."""
        dropped = sum(len(part) for part, _, _ in self._removed)
        return dropped + sum(
            int((c.live & c.new).sum()) + int((~c.live & ~c.new).sum()) for c in self._chunks
        )


def started_at_or_before(rows: Roots, ms: int) -> np.ndarray:
    """Mask of ``rows`` whose timeout started at ``ms`` or earlier."""
    return (rows.emitted_ms != NOT_STARTED) & (rows.emitted_ms <= ms)


def _concat(parts: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Coordinates (``part``, ``offset``, ``attempt``) of several lists as one."""
    if not parts:
        empty = np.empty(0, np.int64)
        return empty, empty, empty
    part, offset, attempt = (np.concatenate(cols) for cols in zip(*parts))
    return part, offset, attempt


def _all_packable(part: np.ndarray, offset: np.ndarray, attempt: np.ndarray | int) -> bool:
    """Whether every row's coordinates fit a packed key (:func:`_key`): by each column's
    least and greatest value, a pass per column and no mask."""
    return all(
        not np.size(col) or (np.min(col) >= 0 and np.max(col) < limit)
        for col, limit in ((part, _PARTS), (offset, _OFFSETS), (attempt, _ATTEMPTS))
    )


def _key(part, offset, attempt) -> np.ndarray:
    """One int64 per (partition index, offset, attempt) within the widths of
    :func:`_all_packable`, ordered by partition, then attempt, then offset."""
    return (np.asarray(part) << 48) | (np.asarray(attempt) << 40) | np.asarray(offset)
