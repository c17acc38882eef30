"""A partition's progress: its watermark, its read position, and the offsets done above
the watermark as runs.

Per partition the *watermark* is the lowest offset not done: everything below it may be
committed to the consumer group, nothing above it is (Storm's KafkaSpout commits the
same way). Offsets done above it are kept as runs ``[start, end)``, and the commit's
metadata names the lowest of them, as many as fit the broker's limit.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ackstream.sources.spans import Spans
from ackstream.vocabulary.arrays import distinct

__all__ = ["METADATA_LIMIT", "DoneRuns", "Progress", "complement", "ranges"]

#: Bytes of commit metadata we allow ourselves (brokers default to 4096).
METADATA_LIMIT = 3800


class DoneRuns:
    """Offsets done above a partition's watermark, as sorted, disjoint, non-touching
    half-open runs ``[start, end)``: a record stuck below a million done ones (a replay
    waiting for its backoff, a tree kept alive by resetTimeout) costs a run per batch,
    not an entry per offset."""

    def __init__(
        self, starts: npt.ArrayLike | None = None, ends: npt.ArrayLike | None = None
    ) -> None:
        self.starts = np.empty(0, np.int64) if starts is None else np.asarray(starts, np.int64)
        self.ends = np.empty(0, np.int64) if ends is None else np.asarray(ends, np.int64)
        self._count: int | None = None

    def __len__(self) -> int:
        """How many offsets are done."""
        if self._count is None:
            self._count = int((self.ends - self.starts).sum())
        return self._count

    @property
    def runs(self) -> int:
        return len(self.starts)

    def merged(self, starts: npt.ArrayLike, ends: npt.ArrayLike) -> DoneRuns:
        """These runs and ``[starts, ends)`` (any order, overlapping or not) as one set:
        the new runs are sorted and put in place, then touching runs are joined, in
        one pass over the runs (no sort of those already here)."""
        starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
        keep = ends > starts
        order = np.argsort(starts[keep], kind="stable")
        starts, ends = starts[keep][order], ends[keep][order]
        if not len(starts):
            return self
        if self.runs and starts[0] >= self.ends[-1] and (starts[1:] >= ends[:-1]).all():
            # the usual case: disjoint runs past the last one (offsets read later)
            joins = np.flatnonzero(starts[1:] == ends[:-1]) + 1
            if starts[0] == self.ends[-1]:
                joins = np.append(0, joins)
            starts = np.concatenate([self.starts, starts])
            ends = np.concatenate([self.ends, ends])
            if len(joins):  # a run that starts where the one before ends joins it
                keep = np.ones(len(starts), bool)
                keep[joins + self.runs] = False
                at = np.flatnonzero(keep)
                last = np.append(at[1:] - 1, len(starts) - 1)
                starts, ends = starts[at], ends[last]
            return DoneRuns(starts, ends)
        at = np.searchsorted(self.starts, starts)
        starts, ends = np.insert(self.starts, at, starts), np.insert(self.ends, at, ends)
        reach = np.maximum.accumulate(ends)
        first = np.ones(len(starts), bool)
        first[1:] = starts[1:] > reach[:-1]  # a gap before it: a run of its own
        at = np.flatnonzero(first)
        last = np.append(at[1:] - 1, len(starts) - 1)
        return DoneRuns(starts[at], reach[last])

    def contains(self, offsets: np.ndarray) -> np.ndarray:
        """Mask of ``offsets`` that are done."""
        offsets = np.asarray(offsets, np.int64)
        at = np.searchsorted(self.starts, offsets, side="right") - 1
        inside = at >= 0
        inside[inside] = offsets[inside] < self.ends[at[inside]]
        return inside

    def above(self, watermark: int) -> DoneRuns:
        """Only the offsets at ``watermark`` or above."""
        keep = self.ends > watermark
        return DoneRuns(np.maximum(self.starts[keep], watermark), self.ends[keep])


@dataclass
class Progress:
    """One partition's watermark, read position and done runs above the watermark."""

    watermark: int  # lowest offset not done
    end: int  # next offset to read from upstream
    #: offsets done above the watermark, as runs: a partition with many done around a
    #: few slow ones costs a merge of runs per batch, not an entry per offset
    done: DoneRuns = field(default_factory=DoneRuns)
    #: the last commit metadata: (watermark, number done, ``lowest``, text) when it was
    #: made; ``done`` only grows while the watermark stands, and offsets done from
    #: ``lowest`` up (the first run the broker's limit left out, if any) do not change it
    _metadata: tuple[int, int, float, str] = (-1, -1, 0, "")
    _lowest_new: float = np.inf  # the lowest offset marked done since it was made

    def mark_done(self, offsets: npt.ArrayLike) -> None:
        """These offsets are done; the watermark moves over any run of done ones."""
        offsets = np.asarray(offsets, np.int64)
        offsets = offsets[offsets >= self.watermark]
        if len(offsets):
            self._mark(*_spans(distinct(offsets)))

    def mark_done_runs(self, runs: Spans) -> None:
        """The offsets of ``runs`` (of this partition) are done: as :meth:`mark_done`, at
        a cost per run."""
        starts, ends = np.maximum(runs.start, self.watermark), runs.end
        keep = ends > starts
        if keep.any():
            self._mark(starts[keep], ends[keep])

    def _mark(self, starts: np.ndarray, ends: np.ndarray) -> None:
        if not self.done.runs and len(starts) == 1 and starts[0] == self.watermark:
            self.watermark = int(ends[0])  # the usual batch: right above the watermark
            return
        self._lowest_new = min(self._lowest_new, int(starts.min()))
        self.done = self.done.merged(starts, ends)
        self.settle()

    def settle(self) -> None:
        """Move the watermark over the done run that starts at it, if any."""
        if not self.done.runs or self.done.starts[0] > self.watermark:
            return
        done = self.done.above(self.watermark)
        if done.runs and done.starts[0] == self.watermark:
            self.watermark = int(done.ends[0])
            done = DoneRuns(done.starts[1:], done.ends[1:])
        self.done = done

    def commit_metadata(self) -> str:
        """Done offsets above the watermark as JSON ranges, the lowest first, as many as
        fit the broker's limit (:data:`METADATA_LIMIT`)."""
        watermark, count, lowest, text = self._metadata
        if watermark != self.watermark or (count != len(self.done) and self._lowest_new < lowest):
            text, lowest = _spans_json(self.done)
            self._metadata = (self.watermark, len(self.done), lowest, text)
        self._lowest_new = np.inf
        return text


def ranges(offsets: Iterable[int]) -> list[list[int]]:
    """Offsets as sorted half-open ``[start, end)`` runs.

    >>> ranges({1, 2, 3, 7})
    [[1, 4], [7, 8]]
    """
    if not isinstance(offsets, np.ndarray):
        offsets = np.fromiter(offsets, np.int64)
    starts, ends = _spans(distinct(offsets))
    runs: list[list[int]] = np.stack([starts, ends], axis=1).tolist()
    return runs


def _spans(offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends of the runs of sorted, distinct ``offsets``."""
    cuts = np.flatnonzero(np.diff(offsets) != 1) + 1
    first = np.concatenate([[0], cuts]).astype(np.int64)
    last = np.concatenate([cuts - 1, [len(offsets) - 1]]).astype(np.int64)
    if not len(offsets):
        return offsets, offsets
    return offsets[first], offsets[last] + 1


def complement(lo: int, hi: int, taken: np.ndarray) -> DoneRuns:
    """The offsets of ``[lo, hi)`` but ``taken``, as runs, at a cost per taken offset."""
    taken = distinct(taken)
    taken = taken[(taken >= lo) & (taken < hi)]
    starts = np.concatenate([[lo], taken + 1])
    ends = np.concatenate([taken, [hi]])
    keep = ends > starts
    return DoneRuns(starts[keep], ends[keep])


def _spans_json(done: DoneRuns) -> tuple[str, float]:
    """``{"done": [[start, end], ...]}`` of the lowest runs of ``done`` that fit
    :data:`METADATA_LIMIT`, and the start of the first run left out (infinity if none
    was). Only the runs that could fit are read (a run costs four characters at least)."""
    room = METADATA_LIMIT - len('{"done":[]}') + 1
    most = room // 4  # runs that could fit
    starts, ends = done.starts[: most + 1], done.ends[: most + 1]
    chars = _digits(starts) + _digits(ends) + 4  # "[a,b],"
    fit = int(np.searchsorted(np.cumsum(chars), room))
    spans = np.stack([starts[:fit], ends[:fit]], axis=1).tolist()
    left_out = int(starts[fit]) if fit < len(starts) else np.inf
    return json.dumps({"done": spans}, separators=(",", ":")), left_out


_POWERS_OF_TEN = 10 ** np.arange(1, 19, dtype=np.int64)


def _digits(values: np.ndarray) -> np.ndarray:
    """Decimal digits of each non-negative integer."""
    return 1 + np.searchsorted(_POWERS_OF_TEN, values, side="right")
