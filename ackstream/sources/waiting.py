"""Records a source holds between a failure and their replay: numpy columns, not a dict
entry per record.

A downstream outage fails whole batches, a hundred thousand roots each, again and
again while it lasts: the tracker schedules, counts and replays them with numpy
passes over these columns, at a cost per batch that does not grow with Python calls
per record. Records are found by a key packing their partition index and offset (a
record waits at most once, whatever its attempt).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ackstream.sources.spans import Spans
from ackstream.vocabulary.partition import Partition

__all__ = ["NO_GROUP", "Replays", "Scheduled", "UnchargedCounts", "packed"]

#: ``group`` of a scheduled record that is replayed with any other due records.
NO_GROUP = -1


def packed(part: npt.ArrayLike, offset: npt.ArrayLike) -> np.ndarray:
    """One int64 key per record: its partition index and offset."""
    return (np.asarray(part, np.int64) << 48) | np.asarray(offset, np.int64)


class Replays(NamedTuple):
    """Records taken out to be replayed now, a row each (``part`` indexes ``tps``)."""

    tps: list[Partition]
    part: np.ndarray
    offset: np.ndarray
    attempt: np.ndarray

    def __len__(self) -> int:
        return len(self.offset)

    def __bool__(self) -> bool:
        return bool(len(self.offset))

    def tolist(self) -> list[tuple[str, int, int, int]]:
        """``(topic, partition, offset, attempt)`` of each record."""
        return [
            (*self.tps[p], off, att)
            for p, off, att in zip(self.part.tolist(), self.offset.tolist(), self.attempt.tolist())
        ]

    def runs(self) -> list[list[Any]]:
        """``[topic, partition, from, to, attempt]`` of each run of consecutive offsets at
        one attempt (the form an offset logs them in)."""
        if not len(self.offset):
            return []
        order = np.lexsort((self.offset, self.attempt, self.part))
        spans = Spans.of_rows(self.part[order], self.offset[order], self.attempt[order])
        return [
            [*self.tps[p], start, end, att]
            for p, start, end, att in zip(
                spans.part.tolist(),
                spans.start.tolist(),
                spans.end.tolist(),
                spans.attempt.tolist(),
            )
        ]


class Scheduled:
    """Records scheduled for a replay: at ``attempt``, once ``due`` (ms) has passed; a
    record of a ``group`` (not :data:`NO_GROUP`) is replayed only with its group, in a
    batch of its own."""

    def __init__(self) -> None:
        empty = np.empty(0, np.int64)
        self.part, self.offset, self.attempt, self.due, self.group = (empty,) * 5
        self._pending: list[tuple[np.ndarray, ...]] = []

    def __len__(self) -> int:
        self._settle()
        return len(self.offset)

    def add(
        self,
        part: npt.ArrayLike,
        offset: npt.ArrayLike,
        attempt: npt.ArrayLike,
        due: npt.ArrayLike,
        group: npt.ArrayLike = NO_GROUP,
    ) -> None:
        """Schedule records (scalars are repeated); a record must not be scheduled yet."""
        offset = np.asarray(offset, np.int64).reshape(-1)
        if len(offset):
            columns = np.broadcast_arrays(
                offset, *(np.asarray(c, np.int64) for c in (part, attempt, due, group))
            )
            self._pending.append(tuple(np.array(c) for c in columns))

    def _settle(self) -> None:
        if self._pending:
            pieces = [(self.offset, self.part, self.attempt, self.due, self.group), *self._pending]
            self.offset, self.part, self.attempt, self.due, self.group = (
                np.concatenate([p[i] for p in pieces]) for i in range(5)
            )
            self._pending = []

    def columns(self) -> tuple[np.ndarray, ...]:
        """``part, offset, attempt, due, group``, a row per record."""
        self._settle()
        return self.part, self.offset, self.attempt, self.due, self.group

    def take_due(
        self, now_ms: int, budget: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``part, offset, attempt`` of the records of no group whose backoff is over,
        earliest due first (then by partition and offset), at most ``budget``; they
        leave the schedule."""
        self._settle()
        ready = np.flatnonzero((self.due <= now_ms) & (self.group == NO_GROUP))
        ready = ready[np.lexsort((self.offset[ready], self.part[ready], self.due[ready]))]
        if budget is not None:
            ready = ready[: max(budget, 0)]
        return self._take(ready)

    def take_group(self, now_ms: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray] | None:
        """The group due first (its earliest due member, then the lowest group number)
        and its members' ``part, offset, attempt``, sorted by partition and offset; they
        leave the schedule. None when no group is due."""
        self._settle()
        grouped = (self.group != NO_GROUP) & (self.due <= now_ms)
        if not grouped.any():
            return None
        at = np.flatnonzero(grouped)
        group = int(self.group[at[np.lexsort((self.group[at], self.due[at]))[0]]])
        return (group, *self.take_groups([group]))

    def take_groups(self, groups: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``part, offset, attempt`` of the members of ``groups``, due or not, sorted by
        partition and offset; they leave the schedule."""
        self._settle()
        members = np.flatnonzero(np.isin(self.group, np.asarray(groups, np.int64)))
        members = members[np.lexsort((self.offset[members], self.part[members]))]
        return self._take(members)

    def _take(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        taken = self.part[rows], self.offset[rows], self.attempt[rows]
        if len(rows):
            self._keep(~np.isin(np.arange(len(self.offset)), rows))
        return taken

    def drop(self, part: int, offsets: npt.ArrayLike) -> None:
        """Records of partition ``part`` at ``offsets`` leave the schedule."""
        self._settle()
        if len(self.offset):
            gone = (self.part == part) & np.isin(self.offset, np.asarray(offsets, np.int64))
            if gone.any():
                self._keep(~gone)

    def _keep(self, keep: np.ndarray) -> None:
        self.part, self.offset, self.attempt, self.due, self.group = (
            c[keep] for c in (self.part, self.offset, self.attempt, self.due, self.group)
        )

    @property
    def last_group(self) -> int:
        """The highest group number scheduled (0 when none)."""
        self._settle()
        return int(self.group.max()) if len(self.group) else 0


class UnchargedCounts:
    """Per record not done, how many of its attempts were not charged to its retries
    (it was replayed as a suspect, see :mod:`ackstream.sources.isolation`): sorted keys
    (:func:`packed`) and a count each."""

    def __init__(self) -> None:
        self.keys = np.empty(0, np.int64)
        self.counts = np.empty(0, np.int64)

    def __len__(self) -> int:
        return len(self.keys)

    def get(self, keys: np.ndarray) -> np.ndarray:
        """The count of each key (0 for a key not here)."""
        keys = np.asarray(keys, np.int64)
        if not len(self.keys) or not len(keys):
            return np.zeros(len(keys), np.int64)
        at = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        return np.where(self.keys[at] == keys, self.counts[at], 0)

    def add(self, keys: np.ndarray, counts: npt.ArrayLike = 1) -> None:
        """Add ``counts`` (one each, or an array) to the keys' counts."""
        keys = np.asarray(keys, np.int64)
        if not len(keys):
            return
        counts = np.broadcast_to(np.asarray(counts, np.int64), keys.shape)
        merged = np.concatenate([self.keys, keys])
        total = np.concatenate([self.counts, counts])
        order = np.argsort(merged, kind="stable")
        merged, total = merged[order], total[order]
        first = np.flatnonzero(np.concatenate([[True], merged[1:] != merged[:-1]]))
        self.keys, self.counts = merged[first], np.add.reduceat(total, first)

    def drop(self, keys: np.ndarray) -> None:
        """The keys leave (their records are done)."""
        if len(self.keys) and len(keys):
            keep = ~np.isin(self.keys, np.asarray(keys, np.int64))
            self.keys, self.counts = self.keys[keep], self.counts[keep]
