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
- what was added and taken since :meth:`InFlight.mark` is kept (:meth:`InFlight.changes`),
  so the source's state file can be written as the changes since its last whole file.

Coordinates are in flight at most once (the tracker adds a record only after taking
its earlier attempt out).
"""

from __future__ import annotations

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
        """Columns of the right types; scalars are repeated to the length of the others."""
        columns = np.broadcast_arrays(
            *(np.asarray(v, np.int64) for v in (root, part, offset, attempt, emitted_ms, batch))
        )
        return cls(*(col.reshape(-1).copy() for col in columns))

    def sorted_by(self, *keys: str) -> Roots:
        """The rows ordered by ``keys``, the first key major."""
        order = np.lexsort([getattr(self, k) for k in reversed(keys)])
        return self.at(order)

    def at(self, index) -> Roots:
        """The rows at ``index`` (positions or a mask)."""
        return Roots(*(col[index] for col in self))

    @staticmethod
    def concat(parts: list[Roots]) -> Roots:
        return Roots(*(np.concatenate(cols) for cols in zip(*parts))) if parts else EMPTY


EMPTY = Roots.of([], 0, [], 0, 0)


class Changes(NamedTuple):
    """In-flight coordinates (``part``, ``offset``, ``attempt`` columns each) added and
    taken out since :meth:`InFlight.mark`, net: a record added and taken again is in
    neither; one taken and added back at the same attempt neither."""

    added: tuple[np.ndarray, np.ndarray, np.ndarray]
    removed: tuple[np.ndarray, np.ndarray, np.ndarray]

    def __len__(self) -> int:
        return len(self.added[0]) + len(self.removed[0])


class _Chunk:
    """Rows added together, sorted by their packed key when every row has one (else in
    the order given, and searched by masks); ``live`` marks the rows not taken."""

    def __init__(self, rows: Roots, minted: bool):
        packable = _packable(rows.part, rows.offset, rows.attempt)
        self.keys: np.ndarray | None = None
        if packable.all():
            keys = _key(rows.part, rows.offset, rows.attempt)
            if len(keys) > 1 and (keys[1:] < keys[:-1]).any():
                order = np.argsort(keys, kind="stable")
                keys, rows = keys[order], rows.at(order)
            self.keys = keys
        self.rows, self.minted = rows, minted
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
        if self.keys is not None and _packable(spans[:, 0], spans[:, 2] - 1, 0).all():
            lo = np.searchsorted(self.keys, _key(spans[:, 0], spans[:, 1].clip(0), 0))
            hi = np.searchsorted(self.keys, _key(spans[:, 0], spans[:, 2], 0))
            lengths = (hi - lo).clip(0)
            if not lengths.sum():
                return np.empty(0, np.int64)
            hit = np.repeat(lo - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum())
            hit = np.unique(hit) if len(spans) > 1 else hit  # spans may overlap
        else:
            rows, mask = self.rows, np.zeros(len(self.live), bool)
            for p, a, b in spans.tolist():
                mask |= (rows.part == p) & (rows.offset >= a) & (rows.offset < b)
            hit = np.flatnonzero(mask & (rows.attempt == 0))
        return hit[self.live[hit]]

    def take(self, hit: np.ndarray) -> Roots:
        self.live[hit] = False
        self.count -= len(hit)
        return self.rows.at(hit)

    def compacted(self) -> _Chunk:
        """This chunk without the rows taken, once half of it is gone."""
        if self.count * 2 >= len(self.live):
            return self
        return _Chunk(self.rows.at(self.live), self.minted)


class InFlight:
    """Roots in flight (see the module doc). A root id names one record at one
    attempt, so it is in the table at most once."""

    def __init__(self, mint: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]):
        self._chunks: list[_Chunk] = []
        self._mint = mint
        self._added: list[tuple[np.ndarray, ...]] = []  # since mark(), in order
        self._removed: list[tuple[np.ndarray, ...]] = []
        self._events = 0  # numbers the added and removed arrays, in order

    def __len__(self) -> int:
        return sum(chunk.count for chunk in self._chunks)

    @property
    def rows(self) -> Roots:
        """Every row, ids minted, ordered by id (for tests and the rare full listing)."""
        rows = Roots.concat([c.minted_rows(self._mint).at(c.live) for c in self._chunks])
        return rows.at(np.argsort(rows.root, kind="stable"))

    @property
    def coordinates(self) -> Roots:
        """Every row as it is: ``root`` is 0 where its id is not minted yet."""
        return Roots.concat([c.rows.at(c.live) for c in self._chunks])

    def add_unminted(self, part, offset, attempt, emitted_ms, batch) -> None:
        """Put records in flight by coordinates; their ids are minted when needed."""
        new = Roots.of(0, part, offset, attempt, emitted_ms, batch)
        if not len(new.offset):
            return
        self._chunks.append(_Chunk(new, minted=False))
        self._log(self._added, new)
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
            np.sort(_key(part, offset, attempt)) if _packable(part, offset, attempt).all() else None
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
                rows = chunk.take(hit)
                taken.append(rows)
                self._log(self._removed, rows)
        if taken:
            self._chunks = [c.compacted() for c in self._chunks if c.count]
        return Roots.concat(taken)

    def _merge_smallest(self) -> None:
        """Merge the smaller half of the chunks into one (sorted again by key)."""
        self._chunks.sort(key=lambda c: c.count)
        half = len(self._chunks) // 2
        small, self._chunks = self._chunks[:half], self._chunks[half:]
        minted = all(c.minted for c in small)
        rows = Roots.concat([c.rows.at(c.live) for c in small])
        self._chunks.append(_Chunk(rows, minted))

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
        """Forget the changes so far: :meth:`changes` counts from here."""
        self._added, self._removed, self._events = [], [], 0

    def changes(self) -> Changes:
        """The coordinates added and taken out since :meth:`mark`, net (and the log of
        them kept net from now on: its cost follows the net changes, not every event)."""
        events = [(arrays, 1) for arrays in self._added] + [(arrays, 0) for arrays in self._removed]
        if not events:
            empty = (np.empty(0, np.int64),) * 3
            return Changes(empty, empty)
        cols = [np.concatenate([arrays[i] for arrays, _ in events]) for i in range(4)]
        part, offset, attempt, order_of = cols
        added = np.concatenate([np.full(len(arrays[0]), kind, bool) for arrays, kind in events])
        order = np.lexsort((order_of, attempt, offset, part))
        part, offset, attempt, added = part[order], offset[order], attempt[order], added[order]
        same = (part[1:] == part[:-1]) & (offset[1:] == offset[:-1]) & (attempt[1:] == attempt[:-1])
        first = np.append(True, ~same)  # the first event of its coordinates
        last = np.append(~same, True)
        first_added = np.repeat(added[first], np.diff(np.append(np.flatnonzero(first), len(part))))
        keep_added = last & added & first_added  # new since mark, still in flight
        keep_removed = last & ~added & ~first_added  # there at mark, gone now
        net = Changes(
            (part[keep_added], offset[keep_added], attempt[keep_added]),
            (part[keep_removed], offset[keep_removed], attempt[keep_removed]),
        )
        # the log from now on: the net changes, before any later event (number 0)
        self._added = [(*net.added, np.zeros(len(net.added[0]), np.int64))]
        self._removed = [(*net.removed, np.zeros(len(net.removed[0]), np.int64))]
        return net

    def _log(self, into: list, rows: Roots) -> None:
        self._events += 1
        into.append((rows.part, rows.offset, rows.attempt, np.full(len(rows.offset), self._events)))


def started_at_or_before(rows: Roots, ms: int) -> np.ndarray:
    """Mask of ``rows`` whose timeout started at ``ms`` or earlier."""
    return (rows.emitted_ms != NOT_STARTED) & (rows.emitted_ms <= ms)


def _packable(part: np.ndarray, offset: np.ndarray, attempt: np.ndarray | int) -> np.ndarray:
    return (
        (part >= 0)
        & (part < _PARTS)
        & (offset >= 0)
        & (offset < _OFFSETS)
        & (attempt >= 0)
        & (attempt < _ATTEMPTS)
    )


def _key(part, offset, attempt) -> np.ndarray:
    """One int64 per (partition index, offset, attempt) within the widths of
    :func:`_packable`, ordered by partition, then attempt, then offset."""
    return (np.asarray(part) << 48) | (np.asarray(attempt) << 40) | np.asarray(offset)
