"""The roots a source has in flight, as numpy columns.

The source's driver puts every record it emits here, and takes them out as their
completions come: a whole run of offsets at once, or one root by its id (a fail, a
timeout, the acker's outcomes). Columns keep each to a few vectorised passes (a
mask, a binary search, a compaction) instead of a Python object per root.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["NOT_STARTED", "InFlight", "Roots"]

#: ``emitted_ms`` of a root whose batch Spark has not run yet: its timeout has not begun.
NOT_STARTED = -1


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
        """Columns of the right types; scalars are repeated to the length of ``root``."""
        root = np.asarray(root, np.int64)
        return cls(
            root,
            *(
                np.broadcast_to(np.asarray(v, np.int64), root.shape).copy()
                for v in (part, offset, attempt, emitted_ms, batch)
            ),
        )

    def sorted_by(self, *keys: str) -> Roots:
        """The rows ordered by ``keys``, the first key major."""
        order = np.lexsort([getattr(self, k) for k in reversed(keys)])
        return Roots(*(col[order] for col in self))


EMPTY = Roots.of([], 0, 0, 0, 0)


class InFlight:
    """Roots in flight. A root id names one record at one attempt, so it is in the
    table at most once.

    Ids are minted lazily: rows put in flight with :meth:`add_unminted` carry their
    coordinates alone, and their ids are computed (by ``mint(part, offset, attempt)``)
    only when a lookup by id needs them. A batch whose trees all close comes back as
    runs of offsets (:mod:`ackstream.ranges`), so in the steady state no id is ever
    computed here. The first ``_sorted`` rows have their ids and are sorted by them;
    the rest wait, in the order they were added."""

    def __init__(self, mint=None):
        self._rows = EMPTY
        self._sorted = 0
        self._mint = mint

    def __len__(self) -> int:
        return len(self._rows.root)

    @property
    def rows(self) -> Roots:
        """Every row, ids minted."""
        self._mint_waiting()
        return self._rows

    @property
    def coordinates(self) -> Roots:
        """Every row as it is: ``root`` is 0 where its id is not minted yet. For masks
        over the other columns (:meth:`take_where` takes them in this order)."""
        return self._rows

    def add(self, new: Roots) -> None:
        """Put ``new`` (ids given) in flight; a root that is already in flight is replaced."""
        self._mint_waiting()
        self._merge(new)

    def add_unminted(self, part, offset, attempt, emitted_ms, batch) -> None:
        """Put records in flight by coordinates; their ids are minted when needed."""
        new = Roots.of(np.zeros(len(offset), np.int64), part, offset, attempt, emitted_ms, batch)
        if self._mint is None:
            raise ValueError("an in-flight table without mint() takes roots with ids")
        self._rows = Roots(*(np.concatenate(pair) for pair in zip(self._rows, new)))

    def _mint_waiting(self) -> None:
        """Mint the ids of the rows that wait for them, and sort them in."""
        if self._sorted == len(self):
            return
        waiting = Roots(*(col[self._sorted :] for col in self._rows))
        self._rows = Roots(*(col[: self._sorted] for col in self._rows))
        root = self._mint(waiting.part, waiting.offset, waiting.attempt)
        self._merge(waiting._replace(root=np.asarray(root, np.int64)))

    def _merge(self, new: Roots) -> None:
        rows = Roots(*(np.concatenate(pair) for pair in zip(self._rows, new)))
        order = np.argsort(rows.root, kind="stable")  # the old rows are one sorted run
        root = rows.root[order]
        newest = np.append(root[1:] != root[:-1], True)  # of equal roots, the one added last
        self._rows = Roots(*(col[order[newest]] for col in rows))
        self._sorted = len(self)

    def take(self, roots) -> Roots:
        """Remove those of ``roots`` that are in flight and return their rows."""
        roots = np.sort(np.asarray(roots, np.int64))  # sorted, the search stays in cache
        if not len(self) or not len(roots):
            return EMPTY
        self._mint_waiting()
        at = np.searchsorted(self._rows.root, roots)
        found = at < len(self)
        found[found] = self._rows.root[at[found]] == roots[found]
        mask = np.zeros(len(self), bool)
        mask[at[found]] = True
        return self.take_where(mask)

    def take_at(self, part, offset, attempt) -> Roots:
        """Remove the rows of these coordinates (``part`` indexes the partitions) and
        return them, without minting an id."""
        part, offset, attempt = (np.asarray(v, np.int64) for v in (part, offset, attempt))
        if not len(self) or not len(offset):
            return EMPTY
        rows = self._rows
        if max(int(offset.max()), int(rows.offset.max())) < 1 << 40:
            wanted = np.sort(_key(part, offset, attempt))
            keys = _key(rows.part, rows.offset, rows.attempt)
            at = np.searchsorted(wanted, keys).clip(0, len(wanted) - 1)
            packed = (rows.attempt < 255) & (rows.part < 1 << 15)  # what a key holds
            return self.take_where((wanted[at] == keys) & packed)
        mask = np.zeros(len(self), bool)  # offsets past 2**40: no packed keys
        for p, o, a in zip(part.tolist(), offset.tolist(), attempt.tolist()):
            mask |= (rows.part == p) & (rows.offset == o) & (rows.attempt == a)
        return self.take_where(mask)

    def take_where(self, mask: np.ndarray) -> Roots:
        """Remove the rows where ``mask`` (over :attr:`coordinates`) is true and return them."""
        if not mask.any():
            return EMPTY
        taken, kept = np.flatnonzero(mask), np.flatnonzero(~mask)
        rows = self._rows
        self._sorted -= int(mask[: self._sorted].sum())
        self._rows = Roots(*(col[kept] for col in rows))
        return Roots(*(col[taken] for col in rows))

    def take_offsets(self, part: int, offsets) -> Roots:
        """Remove the roots of these offsets of partition ``part``, at any attempt."""
        rows = self._rows
        return self.take_where((rows.part == part) & np.isin(rows.offset, offsets))

    def restart(self, roots, now_ms: int) -> None:
        """Those of ``roots`` in flight whose timeout has started start it again at
        ``now_ms`` (the acker reported a reset of their trees)."""
        roots = np.sort(np.asarray(roots, np.int64))
        if not len(self) or not len(roots):
            return
        self._mint_waiting()
        at = np.searchsorted(self._rows.root, roots)
        found = at < len(self)
        found[found] = self._rows.root[at[found]] == roots[found]
        emitted = self._rows.emitted_ms
        hit = at[found]
        emitted[hit[emitted[hit] != NOT_STARTED]] = now_ms

    def start(self, now_ms: int) -> None:
        """Roots not started start their timeout at ``now_ms``."""
        emitted = self._rows.emitted_ms
        emitted[emitted == NOT_STARTED] = now_ms

    def delay(self, ms: int) -> None:
        """Started roots start their timeout ``ms`` later (time that does not count)."""
        emitted = self._rows.emitted_ms
        emitted[emitted != NOT_STARTED] += ms

    def started_at_or_before(self, ms: int) -> np.ndarray:
        """Mask (over :attr:`coordinates`) of the roots started at ``ms`` or earlier."""
        emitted = self._rows.emitted_ms
        return (emitted != NOT_STARTED) & (emitted <= ms)


def _key(part: np.ndarray, offset: np.ndarray, attempt: np.ndarray) -> np.ndarray:
    """One int64 per (partition index below 2**15, offset below 2**40, attempt below
    255): equal keys, equal coordinates within those widths."""
    return ((part & 0x7FFF) << 48) | ((attempt & 0xFF) << 40) | offset
