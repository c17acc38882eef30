"""The roots a source has in flight, as numpy columns sorted by root id.

The source's driver looks up every completion's root here and puts every emitted
record here, once per batch: thousands of roots each time. Columns keep both to a
few vectorised passes (a binary search, an insert, a compaction), where one Python
object and two dict entries per root cost about 40 ms per 10,000 roots.
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
    """Roots in flight, sorted by root id for lookups. A root id names one record at
    one attempt, so it is in the table at most once."""

    def __init__(self):
        self.rows = EMPTY

    def __len__(self) -> int:
        return len(self.rows.root)

    def add(self, new: Roots) -> None:
        """Put ``new`` in flight; a root that is already in flight is replaced."""
        rows = Roots(*(np.concatenate(pair) for pair in zip(self.rows, new)))
        order = np.argsort(rows.root, kind="stable")  # the old rows are one sorted run
        root = rows.root[order]
        newest = np.append(root[1:] != root[:-1], True)  # of equal roots, the one added last
        self.rows = Roots(*(col[order[newest]] for col in rows))

    def take(self, roots) -> Roots:
        """Remove those of ``roots`` that are in flight and return their rows."""
        roots = np.sort(np.asarray(roots, np.int64))  # sorted, the search stays in cache
        if not len(self) or not len(roots):
            return EMPTY
        at = np.searchsorted(self.rows.root, roots)
        found = at < len(self)
        found[found] = self.rows.root[at[found]] == roots[found]
        mask = np.zeros(len(self), bool)
        mask[at[found]] = True
        return self.take_where(mask)

    def take_where(self, mask: np.ndarray) -> Roots:
        """Remove the rows where ``mask`` is true and return them."""
        if not mask.any():
            return EMPTY
        taken, kept = np.flatnonzero(mask), np.flatnonzero(~mask)
        rows = self.rows
        self.rows = Roots(*(col[kept] for col in rows))
        return Roots(*(col[taken] for col in rows))

    def take_offsets(self, part: int, offsets) -> Roots:
        """Remove the roots of these offsets of partition ``part``, at any attempt."""
        rows = self.rows
        return self.take_where((rows.part == part) & np.isin(rows.offset, offsets))

    def restart(self, roots, now_ms: int) -> None:
        """Those of ``roots`` in flight whose timeout has started start it again at
        ``now_ms`` (the acker reported a reset of their trees)."""
        roots = np.sort(np.asarray(roots, np.int64))
        if not len(self) or not len(roots):
            return
        at = np.searchsorted(self.rows.root, roots)
        found = at < len(self)
        found[found] = self.rows.root[at[found]] == roots[found]
        emitted = self.rows.emitted_ms
        hit = at[found]
        emitted[hit[emitted[hit] != NOT_STARTED]] = now_ms

    def start(self, now_ms: int) -> None:
        """Roots not started start their timeout at ``now_ms``."""
        emitted = self.rows.emitted_ms
        emitted[emitted == NOT_STARTED] = now_ms

    def delay(self, ms: int) -> None:
        """Started roots start their timeout ``ms`` later (time that does not count)."""
        emitted = self.rows.emitted_ms
        emitted[emitted != NOT_STARTED] += ms

    def started_at_or_before(self, ms: int) -> np.ndarray:
        """Mask of the roots started at ``ms`` or earlier."""
        emitted = self.rows.emitted_ms
        return (emitted != NOT_STARTED) & (emitted <= ms)
