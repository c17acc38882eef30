"""The roots a source has in flight: runs of offsets, and numpy rows for the exceptions.

The source's driver puts every record it emits here, and takes them out as their
completions come: a run of offsets at once, one record by its coordinates, or one
root by its id (a fail, a timeout, the acker's outcomes). A source with a million
roots in flight and a hundred thousand new ones a batch must not pay per record when
its trees close:

- offsets read anew (attempt 0) go in as one row per partition and batch, a *run*
  ``[start, end)``, and a batch whose trees all close comes back as runs of offsets
  (:mod:`ackstream.vocabulary.ranges`) that take them out whole: in the steady state the table
  costs a row per partition and batch, and no root id is computed;
- records that are exceptions are rows of their own: replays, restored records, the
  short pieces left of a run once some of its offsets were taken, and every run once a
  lookup by id needs ids. Each batch of rows is a chunk sorted by a packed key of the
  coordinates, so finding a run or a record is a binary search per chunk; a root
  taken out is only marked gone, a chunk is compacted once half of it is gone, and
  the smallest chunks are merged once there are many; root ids are minted lazily
  (``mint(part, offset, attempt)``), per chunk, only when a lookup by id needs them;
- what changed since :meth:`InFlight.mark` (:meth:`InFlight.changes`) comes as runs
  too, so the source's state file can be written as the changes since its last whole
  file at a cost per run.

Coordinates are in flight at most once (the tracker adds a record only after taking
its earlier attempt out).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from ackstream.sources.spans import (
    EMPTY,
    EMPTY_SPANS,
    NOT_STARTED,
    Changes,
    Coordinates,
    Roots,
    Spans,
    started_at_or_before,
)
from ackstream.vocabulary.arrays import distinct

__all__ = ["InFlight"]

#: More chunks than this and the smallest half are merged into one.
MAX_CHUNKS = 16
#: A piece of a run left this long or longer stays a run; a shorter one becomes rows.
LONG_RUN = 32

#: a packed key holds a partition index below 2**15, an attempt below 255 and an
#: offset below 2**40 (see :func:`_key`)
_PARTS, _ATTEMPTS, _OFFSETS = 1 << 15, 255, 1 << 40

#: a root id per record from its partition index, offset and attempt (columns)
Mint = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


class _Runs(NamedTuple):
    """Runs of offsets read anew (attempt 0) that are in flight, ``[start, end)`` of the
    partition indexed ``part``, sorted by partition and start; each with its timeout's
    start, its batch and whether it was added since the table's mark."""

    part: np.ndarray
    start: np.ndarray
    end: np.ndarray
    emitted_ms: np.ndarray
    batch: np.ndarray
    new: np.ndarray

    def at(self, index: np.ndarray) -> _Runs:
        return _Runs(*(col[index] for col in self))

    def keys(self) -> tuple[np.ndarray, np.ndarray]:
        """Packed keys of each run's start and end (both sorted: runs do not overlap)."""
        return _key(self.part, self.start, 0), _key(self.part, self.end, 0)

    def spans(self) -> Spans:
        return Spans(self.part, np.zeros_like(self.part), self.start, self.end)

    @property
    def records(self) -> int:
        return int((self.end - self.start).sum())

    def roots(self) -> tuple[Roots, np.ndarray]:
        """Every record of the runs as a row (no id), and whether it is new."""
        part, offset, attempt = self.spans().rows()
        length = self.end - self.start
        rows = Roots(
            np.zeros(len(offset), np.int64),
            part,
            offset,
            attempt,
            np.repeat(self.emitted_ms, length),
            np.repeat(self.batch, length),
        )
        return rows, np.repeat(self.new, length)

    @staticmethod
    def sorted(parts: list[_Runs]) -> _Runs:
        """The runs of ``parts`` together, sorted."""
        runs = _Runs(*(np.concatenate(cols) for cols in zip(*parts)))
        return runs.at(np.argsort(runs.keys()[0], kind="stable"))


_NONE = np.empty(0, np.int64)
_NO_RUNS = _Runs(_NONE, _NONE, _NONE, _NONE, _NONE, np.empty(0, bool))


def _carve(runs: _Runs, lo: np.ndarray, hi: np.ndarray) -> tuple[_Runs, _Runs]:
    """``runs`` cut by the packed-key intervals ``[lo, hi)`` (which may overlap): the
    pieces outside every interval, and those inside one, each with its run's columns."""
    starts, ends = runs.keys()
    points = distinct(np.concatenate([starts, ends, lo, hi]))
    a, b = points[:-1], points[1:]
    owner = np.searchsorted(starts, a, side="right") - 1
    inside = owner >= 0
    inside[inside] = a[inside] < ends[owner[inside]]
    a, b, owner = a[inside], b[inside], owner[inside]
    covered = np.searchsorted(np.sort(lo), a, side="right") > np.searchsorted(
        np.sort(hi), a, side="right"
    )
    first = np.ones(len(a), bool)  # pieces of one run and one side join
    first[1:] = (owner[1:] != owner[:-1]) | (covered[1:] != covered[:-1])
    at = np.flatnonzero(first)
    last = np.append(at[1:], len(a)) - 1
    owner, covered = owner[at], covered[at]
    base = runs.part[owner] << 48
    pieces = runs.at(owner)._replace(start=a[at] - base, end=b[last] - base)
    return pieces.at(~covered), pieces.at(covered)


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

    def minted_rows(self, mint: Mint) -> Roots:
        if not self.minted:
            root = np.asarray(mint(self.rows.part, self.rows.offset, self.rows.attempt), np.int64)
            self.rows = self.rows._replace(root=root)
            self.minted = True
        return self.rows

    def find_roots(self, roots: np.ndarray, mint: Mint) -> np.ndarray:
        """Positions of the live rows whose id is in sorted ``roots``."""
        rows = self.minted_rows(mint)
        if self._by_root is None:
            self._by_root = np.argsort(rows.root, kind="stable")
            self._sorted_roots = rows.root[self._by_root]
        at = np.searchsorted(self._sorted_roots, roots).clip(0, len(self._by_root) - 1)
        hit = self._by_root[at[self._sorted_roots[at] == roots]]
        found: np.ndarray = hit[self.live[hit]]
        return found

    def find_keys(
        self, keys: np.ndarray | None, part: np.ndarray, offset: np.ndarray, attempt: np.ndarray
    ) -> np.ndarray:
        """Positions of the live rows at the coordinates given (``keys`` their packed
        keys, sorted, or None where some have none)."""
        if self.keys is not None and keys is not None:
            at = np.searchsorted(self.keys, keys).clip(0, len(self.keys) - 1)
            hit = distinct(at[self.keys[at] == keys])
        else:
            rows, mask = self.rows, np.zeros(len(self.live), bool)
            for p, o, a in zip(part.tolist(), offset.tolist(), attempt.tolist()):
                mask |= (rows.part == p) & (rows.offset == o) & (rows.attempt == a)
            hit = np.flatnonzero(mask)
        found: np.ndarray = hit[self.live[hit]]
        return found

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

    def compacted(self, removed: list[Coordinates], share: float = 0.5) -> _Chunk:
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

    def __init__(self, mint: Mint):
        self._runs = _NO_RUNS
        self._chunks: list[_Chunk] = []
        self._mint = mint
        #: runs there at mark() since taken out, and coordinates of rows there at
        #: mark() that compactions dropped
        self._removed_runs: list[Spans] = []
        self._removed: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def __len__(self) -> int:
        return self._runs.records + sum(chunk.count for chunk in self._chunks)

    @property
    def rows(self) -> Roots:
        """Every row, ids minted, ordered by id (for tests and the rare full listing)."""
        runs, _ = self._runs.roots()
        runs = runs._replace(root=self._ids(runs))
        rows = Roots.concat([runs, *(c.minted_rows(self._mint).at(c.live) for c in self._chunks)])
        return rows.at(np.argsort(rows.root, kind="stable"))

    def flying(self) -> Spans:
        """Every record in flight, as runs."""
        return Spans.concat(
            [
                self._runs.spans(),
                *(Spans.of_rows(*_coordinates(c.rows, c.live)) for c in self._chunks),
            ]
        )

    def add_runs(
        self,
        part: npt.ArrayLike,
        start: npt.ArrayLike,
        end: npt.ArrayLike,
        emitted_ms: int,
        batch: int,
    ) -> None:
        """Put the offsets ``[start, end)`` of partitions ``part`` in flight at attempt 0:
        a row per run; their ids are minted when needed."""
        part, start, end = (np.asarray(v, np.int64).reshape(-1) for v in (part, start, end))
        keep = end > start
        part, start, end = part[keep], start[keep], end[keep]
        if not len(start):
            return
        if not _all_packable(part, np.concatenate([start, end - 1]), 0):
            self.add_unminted(
                *Spans(part, np.zeros_like(part), start, end).rows(), emitted_ms, batch
            )
            return
        size = len(start)
        new = _Runs(
            part, start, end, np.full(size, emitted_ms), np.full(size, batch), np.ones(size, bool)
        )
        self._runs = _Runs.sorted([self._runs, new])

    def add_unminted(
        self,
        part: npt.ArrayLike,
        offset: npt.ArrayLike,
        attempt: npt.ArrayLike,
        emitted_ms: npt.ArrayLike,
        batch: npt.ArrayLike,
    ) -> None:
        """Put records in flight by coordinates, a row each; their ids are minted when
        needed."""
        self._add_rows(Roots.of(0, part, offset, attempt, emitted_ms, batch), new=None)

    def _add_rows(self, rows: Roots, new: np.ndarray | None) -> None:
        if not len(rows.offset):
            return
        new = np.ones(len(rows.offset), bool) if new is None else new
        self._chunks.append(_Chunk(rows, minted=False, new=new))
        if len(self._chunks) > MAX_CHUNKS:
            self._merge_smallest()

    def take(self, roots: npt.ArrayLike) -> Roots:
        """Remove those of ``roots`` that are in flight and return their rows (ids set)."""
        roots = distinct(roots)
        if not len(roots):
            return EMPTY
        self._runs_to_rows()
        return self._take_each(lambda c: c.find_roots(roots, self._mint))

    def take_at(self, part: npt.ArrayLike, offset: npt.ArrayLike, attempt: npt.ArrayLike) -> Roots:
        """Remove the rows of these coordinates (``part`` indexes the partitions) and
        return them, without minting an id."""
        runs, rows = self._take_at(part, offset, attempt)
        return Roots.concat([runs.roots()[0], rows])

    def take_spans_at(
        self, part: npt.ArrayLike, offset: npt.ArrayLike, attempt: npt.ArrayLike
    ) -> Spans:
        """As :meth:`take_at`, the records taken given as runs: what an ack needs, at a
        cost per run, not per record."""
        runs, rows = self._take_at(part, offset, attempt)
        return Spans.concat([runs.spans(), Spans.of_rows(rows.part, rows.offset, rows.attempt)])

    def _take_at(
        self, part: npt.ArrayLike, offset: npt.ArrayLike, attempt: npt.ArrayLike
    ) -> tuple[_Runs, Roots]:
        """The records of these coordinates taken out of the runs (as runs) and out of
        the chunks (as rows)."""
        part, offset, attempt = np.broadcast_arrays(
            *(np.asarray(v, np.int64).reshape(-1) for v in (part, offset, attempt))
        )
        if not len(offset):
            return _NO_RUNS, EMPTY
        keys = None
        if _all_packable(part, offset, attempt):
            keys = np.sort(_key(part, offset, attempt))  # by partition, attempt, offset
            fresh = keys[(keys >> 40) & 0xFF == 0]  # attempt 0: what runs hold
            cuts = Spans.of_rows(fresh >> 48, fresh & (_OFFSETS - 1), 0)
        else:
            order = np.lexsort((offset, part))
            first = attempt[order] == 0
            cuts = Spans.of_rows(part[order][first], offset[order][first], 0)
        runs = self._cut(cuts.part, cuts.start, cuts.end)
        return runs, self._take_each(lambda c: c.find_keys(keys, part, offset, attempt))

    def take_runs(self, spans: npt.ArrayLike) -> Spans:
        """Remove the records at attempt 0 whose offsets lie in ``spans`` (``(part, from,
        to)``, ``to`` exclusive) and return them as runs, without minting an id."""
        spans = np.array(spans, np.int64).reshape(-1, 3)
        if not len(spans):
            return EMPTY_SPANS
        runs = self._cut(spans[:, 0], spans[:, 1], spans[:, 2]).spans()
        rows = self._take_each(lambda c: c.find_spans(spans))
        return Spans.concat([runs, Spans.of_rows(rows.part, rows.offset, rows.attempt)])

    def take_started_at_or_before(self, ms: int) -> Roots:
        """Remove the rows whose timeout started at ``ms`` or earlier and return them."""
        runs = self._runs
        overdue = (runs.emitted_ms != NOT_STARTED) & (runs.emitted_ms <= ms)
        if overdue.any():
            self._runs = runs.at(~overdue)
            self._note_removed(runs.at(overdue))
        rows, _ = runs.at(overdue).roots()
        chunks = self._take_where(lambda rows: started_at_or_before(rows, ms))
        return Roots.concat([rows, chunks])

    def take_offsets(self, part: int, offsets: npt.ArrayLike) -> Roots:
        """Remove the roots of these offsets of partition ``part``, at any attempt."""
        offsets = np.asarray(offsets, np.int64)
        cuts = Spans.of_rows(part, distinct(offsets), 0)
        runs, _ = self._cut(cuts.part, cuts.start, cuts.end).roots()
        chunks = self._take_where(lambda rows: (rows.part == part) & np.isin(rows.offset, offsets))
        return Roots.concat([runs, chunks])

    def _cut(self, part: npt.ArrayLike, lo: npt.ArrayLike, hi: npt.ArrayLike) -> _Runs:
        """Take the offsets ``[lo, hi)`` of partitions ``part`` out of the runs and return
        them as runs; pieces of a run left shorter than :data:`LONG_RUN` become rows."""
        part, lo, hi = (np.asarray(v, np.int64) for v in (part, lo, hi))
        ok = (part >= 0) & (part < _PARTS) & (hi > lo) & (hi > 0) & (lo < _OFFSETS)
        runs = self._runs
        if not len(runs.start) or not ok.any():
            return _NO_RUNS
        lo = _key(part[ok], lo[ok].clip(0), 0)
        hi = _key(part[ok], hi[ok].clip(max=_OFFSETS), 0)
        starts, ends = runs.keys()
        first = np.searchsorted(ends, lo, side="right")  # the first run ending past lo
        last = np.searchsorted(starts, hi, side="left")  # past the last run starting below hi
        hit = first < last
        if not hit.any():
            return _NO_RUNS
        edges = np.zeros(len(starts) + 1, np.int64)
        np.add.at(edges, first[hit], 1)
        np.add.at(edges, last[hit], -1)
        touched = np.cumsum(edges)[:-1] > 0
        left, taken = _carve(runs.at(touched), lo[hit], hi[hit])
        long = left.end - left.start >= LONG_RUN
        self._runs = _Runs.sorted([runs.at(~touched), left.at(long)])
        self._add_rows(*left.at(~long).roots())
        self._note_removed(taken)
        return taken

    def _note_removed(self, runs: _Runs) -> None:
        """``runs`` were taken out: those there at the mark count as removed."""
        if not runs.new.all():
            self._removed_runs.append(runs.at(~runs.new).spans())

    def _runs_to_rows(self) -> None:
        """Every run becomes rows (a lookup by id needs their ids)."""
        if len(self._runs.start):
            self._add_rows(*self._runs.roots())
            self._runs = _NO_RUNS

    def _ids(self, rows: Roots) -> np.ndarray:
        return self._mint(rows.part, rows.offset, rows.attempt) if len(rows.offset) else rows.root

    def _take_where(self, select: Callable[[Roots], np.ndarray]) -> Roots:
        """Remove the rows for which ``select`` (a mask over a chunk's rows, ids not
        minted) is true and return them."""
        return self._take_each(lambda c: np.flatnonzero(select(c.rows) & c.live))

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

    def restart(self, roots: npt.ArrayLike, now_ms: int) -> None:
        """Those of ``roots`` in flight whose timeout has started start it again at
        ``now_ms`` (the acker reported a reset of their trees)."""
        roots = distinct(roots)
        if not len(roots):
            return
        self._runs_to_rows()
        for chunk in self._chunks:
            hit = chunk.find_roots(roots, self._mint)
            emitted = chunk.rows.emitted_ms
            emitted[hit[emitted[hit] != NOT_STARTED]] = now_ms

    def restart_at(
        self, part: npt.ArrayLike, offset: npt.ArrayLike, attempt: npt.ArrayLike, now_ms: int
    ) -> None:
        """Those of these coordinates in flight whose timeout has started start it again
        at ``now_ms``, found without minting an id: their offsets are cut out of their
        runs and put back as rows with the new start."""
        rows = self.take_at(part, offset, attempt)
        emitted = rows.emitted_ms.copy()
        emitted[emitted != NOT_STARTED] = now_ms
        self._add_rows(rows._replace(emitted_ms=emitted), new=None)

    def start(self, now_ms: int) -> None:
        """Roots not started start their timeout at ``now_ms``."""
        for emitted in self._emitted():
            emitted[emitted == NOT_STARTED] = now_ms

    def delay(self, ms: int) -> None:
        """Started roots start their timeout ``ms`` later (time that does not count)."""
        for emitted in self._emitted():
            emitted[emitted != NOT_STARTED] += ms

    def _emitted(self) -> list[np.ndarray]:
        """The ``emitted_ms`` column of the runs and of each chunk, to change in place."""
        return [self._runs.emitted_ms, *(chunk.rows.emitted_ms for chunk in self._chunks)]

    def any_started_at_or_before(self, ms: int) -> bool:
        runs = self._runs
        return bool(((runs.emitted_ms != NOT_STARTED) & (runs.emitted_ms <= ms)).any()) or any(
            (started_at_or_before(c.rows, ms) & c.live).any() for c in self._chunks if c.count
        )

    def mark(self) -> None:
        """What is in flight now is written down: :meth:`changes` count from here."""
        self._runs.new[:] = False
        self._chunks = [c.compacted([], share=0) for c in self._chunks]
        self._chunks = [c for c in self._chunks if c.count]
        for chunk in self._chunks:
            chunk.new[:] = False
        self._removed, self._removed_runs = [], []

    def changes(self) -> Changes:
        """The records taken out and added since :meth:`mark` (see :class:`Changes`), as
        runs: a mask per chunk, no sort."""
        added = [self._runs.at(self._runs.new).spans()]
        added += [Spans.of_rows(*_coordinates(c.rows, c.live & c.new)) for c in self._chunks]
        removed = [*self._removed, *(c.gone_since_mark() for c in self._chunks)]
        removed_runs = [*self._removed_runs, *(Spans.of_rows(*cols) for cols in removed)]
        return Changes(Spans.concat(added), Spans.concat(removed_runs))


def _coordinates(rows: Roots, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``part``, ``offset`` and ``attempt`` of the rows in ``mask`` (no copy if all)."""
    if mask.all():
        return rows.part, rows.offset, rows.attempt
    return rows.part[mask], rows.offset[mask], rows.attempt[mask]


def _all_packable(part: np.ndarray, offset: np.ndarray, attempt: np.ndarray | int) -> bool:
    """Whether every row's coordinates fit a packed key (:func:`_key`): by each column's
    least and greatest value, a pass per column and no mask."""
    return all(
        not np.size(col) or (np.min(col) >= 0 and np.max(col) < limit)
        for col, limit in ((part, _PARTS), (offset, _OFFSETS), (attempt, _ATTEMPTS))
    )


def _key(part: npt.ArrayLike, offset: npt.ArrayLike, attempt: npt.ArrayLike) -> np.ndarray:
    """One int64 per (partition index, offset, attempt) within the widths of
    :func:`_all_packable`, ordered by partition, then attempt, then offset."""
    key: np.ndarray = (np.asarray(part) << 48) | (np.asarray(attempt) << 40) | np.asarray(offset)
    return key
