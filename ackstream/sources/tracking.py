"""In-flight roots, commit watermarks and the retry schedule of one source: pure bookkeeping.

No Spark, no Kafka, time passed in. The source's driver-side reader owns one
:class:`Tracker`; every upstream record is in exactly one of these states:

- **in flight**: emitted under a root id (attempt n), waiting for its completion;
- **scheduled**: its last root failed or timed out; it is replayed at attempt n + 1
  once its backoff is over. A record whose batch failed as a whole (an error out of
  its Spark jobs, or the batch deadline: completions ``batch_failed``) is a
  *suspect*: not known to be at fault, it is replayed at once and without a retry
  charged, in a batch of its own group (the failed batch's roots split in
  :data:`ISOLATION_PARTS`, so a record at fault is alone after a few rounds). Only a
  record that fails alone in its batch is charged, and it stays alone for its
  replays; but once every group of a round failed as a whole, the error is every
  record's (a stage that fails them all, a downstream outage), and the round's
  records are charged and retried together (see :meth:`Tracker._isolate`). Records
  waiting for a replay are kept as numpy columns (:mod:`ackstream.sources.waiting`):
  an outage fails a whole batch again and again;
- **dead**: failed on its last allowed attempt, or rejected (the record itself is
  at fault, so no replay), waiting for its dead letter to be written (then it is
  done);
- **done**: acked or dead-lettered. Per partition the *watermark* is the lowest
  offset not done: everything below it may be committed to the consumer group,
  nothing above it is (Storm's KafkaSpout commits the same way).

:meth:`Tracker.snapshot` (positions, in the Spark offset) and
:meth:`Tracker.unfinished` (the records not done, in the source's state files, see
:mod:`ackstream.sources.state`) are what :meth:`Tracker.restore` resumes from.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from ackstream.config.source import RetryPolicy
from ackstream.sources.in_flight import (
    EMPTY,
    EMPTY_SPANS,
    NOT_STARTED,
    Changes,
    InFlight,
    Roots,
    Spans,
)
from ackstream.sources.state import DEAD, Uncharged, Unfinished, Waiting
from ackstream.sources.waiting import NO_GROUP, Replays, Scheduled, UnchargedCounts, packed
from ackstream.vocabulary import ids
from ackstream.vocabulary.arrays import distinct
from ackstream.vocabulary.batch_offset import Position
from ackstream.vocabulary.partition import Partition
from ackstream.vocabulary.ranges import is_run
from ackstream.vocabulary.records import (
    ACKED,
    ALIVE,
    BATCH_FAILED,
    INVALID,
    REJECTED,
    TIMED_OUT,
    one_outcome_per_root,
)

__all__ = ["ISOLATION_PARTS", "METADATA_LIMIT", "OUTCOME_COUNTS", "DeadLetter", "Tracker", "ranges"]


log = logging.getLogger(__name__)

#: The offset bits of a :func:`~ackstream.sources.waiting.packed` key.
_OFFSET_MASK = (1 << 48) - 1

#: Bytes of commit metadata we allow ourselves (brokers default to 4096).
METADATA_LIMIT = 3800
#: The roots of a batch that failed as a whole replay in this many batches of their own.
ISOLATION_PARTS = 8
#: The names of :attr:`Tracker.counts`.
OUTCOME_COUNTS = ("acked", "failed", "timed_out", "rejected", "replayed", "dead_lettered")


@dataclass(frozen=True)
class DeadLetter:
    """A record that failed on its last allowed attempt or was rejected; ``attempts``
    counts every emit (a suspect's too, see the module doc); ``reason`` is the status,
    then the stage's reason if it gave one (``"failed: parse#2: ValueError: ..."``)."""

    topic: str
    partition: int
    offset: int
    attempts: int
    reason: str


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

    def offsets(self) -> np.ndarray:
        """Every offset done, sorted (one entry each: for tests and small listings)."""
        if not self.runs:
            return self.starts
        return np.concatenate([np.arange(a, b) for a, b in zip(self.starts, self.ends)])

    def tolist(self) -> list[int]:
        return self.offsets().tolist()

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
class _Partition:
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
            self._mark(*_spans(_sorted_unique(offsets)))

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


class Tracker:
    """The state of every record between its first emit and done (see module doc)."""

    def __init__(
        self,
        source: str,
        policy: RetryPolicy,
        source_timeout_ms: int,
        max_pending: int | None = None,
    ):
        self.source, self.policy = source, policy
        self.source_timeout_ms, self.max_pending = source_timeout_ms, max_pending
        self.parts: dict[Partition, _Partition] = {}
        #: the partition of each index in the in-flight ``part`` column
        self._tps: list[Partition] = []
        #: ``xxhash64(source, topic, partition)`` of each of ``_tps``: what its ids go on from
        self._seeds = np.empty(0, np.int64)
        self._index: dict[Partition, int] = {}
        self.flights = InFlight(self._mint)
        #: records waiting for their replay; those of a group (suspects, records that
        #: failed alone) replay only with their group, in a batch of its own
        self.waiting = Scheduled()
        self.dead: dict[tuple[Partition, int], DeadLetter] = {}
        self._groups = 0  # the last group number given
        #: per record not done, its attempts not charged to its retries (as a suspect)
        self._uncharged = UnchargedCounts()
        #: the rounds of isolation in progress (see :meth:`_isolate`)
        self._rounds = Rounds()
        #: the number of the batch being planned: roots put in flight now are in it
        self.batch = 0
        #: Outcomes counted by this tracker (the spout keeps them in its Spark offset, so
        #: a restart goes on from them): roots acked, failed, timed out and rejected;
        #: records replayed and dead-lettered.
        self.counts = dict.fromkeys(OUTCOME_COUNTS, 0)
        #: True: a root's source timeout starts at :meth:`started` (when Spark has run
        #: its batch), not when it is planned; the first batch of a query may start late.
        self.clock_on_commit = False

    # --- partitions and emits -------------------------------------------------------

    def add_partition(self, tp: Partition, offset: int) -> None:
        """Start tracking ``tp`` at ``offset`` (a no-op for a known partition)."""
        if tp not in self.parts:
            self.parts[tp] = _Partition(offset, offset)
            self._number(tp)

    def _number(self, tp: Partition) -> int:
        """The index of ``tp`` in the in-flight table's ``part`` column."""
        if tp not in self._index:
            self._index[tp] = len(self._tps)
            self._tps.append(tp)
        return self._index[tp]

    @property
    def partitions(self) -> list[Partition]:
        """The partition of each index in the in-flight table's ``part`` column."""
        return self._tps

    @property
    def in_flight(self) -> int:
        return len(self.flights)

    def budget(self, limit: int | None = None) -> int | None:
        """How many new roots may be emitted now: max pending minus the records not done
        (in flight, waiting for a replay or for their dead letter), and ``limit``. A
        replay takes no room: it was counted when it was first read (Storm's
        ``maxUncommittedOffsets`` counts retries alike), so a downstream outage that
        fails every record holds at most ``maxPending`` of them."""
        held = len(self.flights) + len(self.waiting) + len(self.dead)
        room = None if self.max_pending is None else max(0, self.max_pending - held)
        if limit is None:
            return room
        return limit if room is None else min(room, limit)

    @property
    def scheduled(self) -> dict[tuple[Partition, int], tuple[int, int]]:
        """``(attempt, due_ms)`` of each record waiting for a replay, by ``(tp, offset)``
        (a dict built for reading: tests and listings)."""
        part, offset, attempt, due, _ = self.waiting.columns()
        return {
            (self._tps[p], o): (a, d)
            for p, o, a, d in zip(part.tolist(), offset.tolist(), attempt.tolist(), due.tolist())
        }

    @property
    def suspects(self) -> dict[tuple[Partition, int], int]:
        """The group of each record waiting for a replay with its group, by ``(tp, offset)``."""
        part, offset, _, _, group = self.waiting.columns()
        grouped = group != NO_GROUP
        return {
            (self._tps[p], o): g
            for p, o, g in zip(*(c[grouped].tolist() for c in (part, offset, group)))
        }

    @property
    def uncharged(self) -> dict[tuple[Partition, int], int]:
        """Attempts not charged to its retries, by ``(tp, offset)`` of each record with any."""
        keys, counts = self._uncharged.keys, self._uncharged.counts
        return {
            (self._tps[k >> 48], k & _OFFSET_MASK): n
            for k, n in zip(keys.tolist(), counts.tolist())
        }

    def emit_range(self, tp: Partition, start: int, end: int, now_ms: int) -> None:
        """Offsets ``[start, end)`` of ``tp`` were emitted for the first time (attempt 0)."""
        self.emit_ranges([(tp, start, end)], now_ms)

    def emit_ranges(self, spans: list[tuple[Partition, int, int]], now_ms: int) -> None:
        """:meth:`emit_range` of several partitions at once (one insert into the table)."""
        for tp, start, _ in spans:
            if start != self.parts[tp].end:
                raise ValueError(
                    f"{tp}: emit from {start} but the next offset to read is {self.parts[tp].end}"
                )
        if spans:
            self.flights.add_runs(
                [self._index[tp] for tp, *_ in spans],
                [a for _, a, _ in spans],
                [b for *_, b in spans],
                self._emitted_ms(now_ms),
                self.batch,
            )
        for tp, _, end in spans:
            self.parts[tp].end = end

    def skip_to(self, tp: Partition, offset: int) -> None:
        """Offsets below ``offset`` no longer exist upstream (retention): count them as done."""
        part = self.parts[tp]
        gone = np.arange(part.watermark, min(offset, part.end))
        self._forget(tp, gone)
        part.mark_done(gone)
        part.watermark = max(part.watermark, offset)
        part.settle()  # the watermark moves over done offsets just above it
        part.end = max(part.end, offset)

    def new_batch(self) -> None:
        """The source plans its next batch: the roots put in flight from now are in it."""
        self.batch += 1

    def _add_roots(
        self,
        part: npt.ArrayLike,
        offsets: npt.ArrayLike,
        attempts: npt.ArrayLike,
        now_ms: int,
        started: bool = False,
    ) -> None:
        """Put records in flight (``part`` indexes the partitions); their root ids are
        minted when a lookup needs them. Their timeout starts now if ``started`` or the
        clock does not wait for Spark."""
        offsets = np.asarray(offsets, np.int64)
        if not len(offsets):
            return
        emitted = now_ms if started else self._emitted_ms(now_ms)
        part = np.broadcast_to(np.asarray(part, np.int64), offsets.shape)
        self.flights.add_unminted(part, offsets, attempts, emitted, self.batch)

    def _emitted_ms(self, now_ms: int) -> int:
        """When the timeout of roots put in flight now starts (see :attr:`clock_on_commit`)."""
        return NOT_STARTED if self.clock_on_commit else now_ms

    def _mint(self, part: np.ndarray, offset: np.ndarray, attempt: np.ndarray) -> np.ndarray:
        """The root ids of records in flight (``part`` indexes the partitions)."""
        if not len(offset):
            return np.empty(0, np.int64)
        if len(self._seeds) < len(self._tps):  # partitions added since: hashed once each
            topics, partitions = zip(*self._tps)
            self._seeds = ids.partition_seeds(self.source, topics, np.array(partitions))
        return ids.hash_longs(offset, attempt, seed=self._seeds[part])

    # --- completions, timeouts, replays ---------------------------------------------

    def complete(self, completions: pa.Table, now_ms: int) -> list[DeadLetter]:
        """Apply completions (``root``, ``status`` and ``reason`` columns, as the
        completion channel gives them); return new dead letters.

        A completion for a root that is not in flight (an earlier attempt, another
        source, a duplicate) is ignored, and so is an ``invalid`` one (a bad ack
        record says nothing about its root). Of several completions of one root,
        any other outcome applies before an ack (``records.one_outcome_per_root``).
        """
        run = is_run(completions)  # runs of acked offsets (ackstream.vocabulary.ranges)
        runs = completions.filter(pa.array(run)) if run.any() else None
        if runs is not None:
            completions = completions.filter(pa.array(~run))
        status = _Statuses(completions)
        alive = status.of(ALIVE)
        if alive.any():  # a reset reached the acker: the tree lives on
            self._restart(completions.filter(pa.array(alive)), now_ms)
        invalid = status.of(INVALID)
        if invalid.any():
            completions = completions.filter(pa.array(~invalid))
        one = one_outcome_per_root(completions)
        status = status if one is completions and not invalid.any() else _Statuses(one)
        completions, acked = one, status.of(ACKED)
        others = _rows(completions, ~acked)
        new_dead = []
        failed = self._take(others).sorted_by("part", "offset")
        outcome = _Outcomes.of(others, failed.root)
        whole = outcome.status == BATCH_FAILED
        if not whole.all():
            status = outcome.status[~whole]
            rejected, timed_out = status == REJECTED, status == TIMED_OUT
            self.counts["rejected"] += int(rejected.sum())
            self.counts["timed_out"] += int(timed_out.sum())
            self.counts["failed"] += int((~rejected & ~timed_out).sum())
            new_dead += self._failed(
                Roots(*(col[~whole] for col in failed)),
                outcome.select(~whole),
                now_ms,
                replay=~rejected,
            )
        if whole.any():
            new_dead += self._isolate(
                Roots(*(col[whole] for col in failed)), outcome.select(whole), now_ms
            )
        acks = _rows(completions, acked)
        by_id, at = self._take_acked(acks)
        self._acked(Spans.concat([Spans.of_rows(by_id.part, by_id.offset, by_id.attempt), at]))
        if len(by_id.root) + at.records < acks.num_rows:  # some were not in flight
            taken = np.concatenate([by_id.root, self._mint(*at.rows())])
            found = pc.is_in(acks.column("root"), pa.array(taken))
            self._late_acks(acks.filter(pc.invert(found)))
        if runs is not None:
            self._complete_runs(runs, failed)
        return new_dead

    def _take(self, completions: pa.Table) -> Roots:
        """Take the roots of ``completions`` out of flight and return their rows (found
        as :meth:`_placed` says)."""
        if not completions.num_rows or not len(self.flights):
            return EMPTY
        by_id, (part, offset, attempt) = self._placed(completions)
        taken = [self.flights.take(by_id)] if len(by_id) else []
        if len(offset):
            rows = self.flights.take_at(part, offset, attempt)
            taken.append(rows._replace(root=self._mint(rows.part, rows.offset, rows.attempt)))
        return Roots.concat(taken)

    def _take_acked(self, acks: pa.Table) -> tuple[Roots, Spans]:
        """Take the roots of ``acks`` out of flight: the rows of those found by id, and
        those found by their coordinates as runs (no id minted: an ack needs none)."""
        if not acks.num_rows or not len(self.flights):
            return EMPTY, EMPTY_SPANS
        by_id, (part, offset, attempt) = self._placed(acks)
        found = self.flights.take(by_id) if len(by_id) else EMPTY
        return found, self.flights.take_spans_at(part, offset, attempt)

    def _restart(self, notices: pa.Table, now_ms: int) -> None:
        """Restart the timeout of the roots of ``alive`` ``notices`` that are in flight
        (found as :meth:`_placed` says)."""
        if not len(self.flights):
            return
        by_id, (part, offset, attempt) = self._placed(notices)
        if len(by_id):
            self.flights.restart(by_id, now_ms)
        if len(offset):
            self.flights.restart_at(part, offset, attempt, now_ms)

    def _placed(self, completions: pa.Table) -> tuple[np.ndarray, tuple]:
        """The roots of ``completions`` to find by id, and the coordinates (``part``,
        ``offset``, ``attempt``) of the others. A completion that names its record's
        coordinates (as the ledger's do) is found by them, once its id is checked
        against the one this source mints for them (a mismatch is not this source's);
        one that does not, by its id, for which every id in flight is minted."""
        part = self._parts_of(completions.column("topic"), completions.column("partition"))
        offset, attempt, root = (
            pc.fill_null(completions.column(c), -1).to_numpy()
            for c in ("offset", "attempt", "root")
        )
        # the ledger caps an attempt it reports at 255: past it, only the id is sure
        placed = (part >= 0) & (part < 1 << 15) & (offset >= 0) & (attempt >= 0) & (attempt < 255)
        part, offset, attempt, mine = part[placed], offset[placed], attempt[placed], root[placed]
        mine = self._mint(part, offset, attempt) == mine
        return root[~placed], (part[mine], offset[mine], attempt[mine])

    def _parts_of(self, topic: pa.ChunkedArray, partition: pa.ChunkedArray) -> np.ndarray:
        """The in-flight table's partition index of each ``(topic, partition)``, -1 where
        not tracked (or null): looked up in a table by topic and partition number, a
        gather per row and no sort or hash."""
        tracked = {t for t, _ in self._index}
        if len(tracked) == 1:  # the usual source: a string compare per row, no hash
            (name,) = tracked
            column = {name: 0}
            same = pc.fill_null(pc.equal(topic, name), False)
            codes = same.to_numpy(zero_copy_only=False).astype(np.int64) - 1
        else:
            names = pc.dictionary_encode(topic.combine_chunks())
            codes = pc.fill_null(names.indices, -1).to_numpy(zero_copy_only=False)
            codes = codes.astype(np.int64)
            column = {name: i for i, name in enumerate(names.dictionary.to_pylist())}
        number = pc.fill_null(partition, -1).to_numpy().astype(np.int64)
        known = [(column[t], p, i) for (t, p), i in self._index.items() if t in column and p >= 0]
        width = 2 + max((p for _, p, _ in known), default=-1)
        # row 0 (no topic) and column 0 (no tracked partition number) hold -1
        table = np.full((len(column) + 1, width), -1, np.int64)
        for code, p, i in known:
            table[code + 1, p + 1] = i
        at = np.where((number >= 0) & (number < width - 1), number + 1, 0)
        return np.take(table.ravel(), (codes + 1) * width + at)

    def _acked(self, done: Spans) -> None:
        """The records of ``done`` (taken out of flight) were acked: they are done, at a
        cost per run."""
        self.counts["acked"] += done.records
        if len(self._uncharged):
            part, offset, _ = done.rows()
            self._uncharged.drop(packed(part, offset))
        for part in np.unique(done.part).tolist():
            self.parts[self._tps[part]].mark_done_runs(done.at(done.part == part))

    def _complete_runs(self, runs: pa.Table, failed: Roots) -> None:
        """Apply completions that each ack a run of offsets at attempt 0 (see
        :mod:`ackstream.vocabulary.ranges`), without a root id per offset: the roots in flight in
        a run are acked; its other offsets, not done yet, are acked late (as
        :meth:`_late_acks`), but for those that failed in the same read (``failed``).
        A run whose first root this source does not mint for its coordinates is
        another source's, and ignored."""
        topic = runs.column("topic").to_numpy(zero_copy_only=False)
        partition, first, end, root = (
            pc.fill_null(runs.column(c), 0).to_numpy()
            for c in ("partition", "offset", "end_offset", "root")
        )
        mine = ids.root_ids(self.source, topic, partition, first, 0) == root
        spans = [
            (self._index[tp], lo, hi)
            for tp, lo, hi, ok in zip(
                zip(topic.tolist(), partition.tolist()), first.tolist(), end.tolist(), mine.tolist()
            )
            if ok and tp in self.parts and hi > lo
        ]
        if not spans:
            return
        done = self.flights.take_runs(spans)  # no id is minted for a run
        self._acked(done)
        if done.records == sum(hi - lo for _, lo, hi in spans):
            return
        for part, lo, hi in spans:  # acks of offsets no longer in flight at attempt 0
            tp, state = self._tps[part], self.parts[self._tps[part]]
            offsets = np.arange(max(lo, state.watermark), min(hi, state.end), dtype=np.int64)
            gone = np.concatenate(
                [done.at(done.part == part).rows()[1], failed.offset[failed.part == part]]
            )
            offsets = np.setdiff1d(offsets, gone)
            offsets = offsets[~state.done.contains(offsets)]
            self.counts["acked"] += len(offsets)
            self.mark_done(tp, offsets)

    def _isolate(self, failed: Roots, outcome: _Outcomes, now_ms: int) -> list[DeadLetter]:
        """Roots whose batch failed as a whole (``failed``, in flight until now), batch by
        batch. A root that was alone in its batch is at fault: it fails as any root
        does, and is replayed alone. Those of a bigger batch are suspects: replayed at
        once, no retry charged, in :data:`ISOLATION_PARTS` groups of their own, a
        *round*. Once every group of a round has failed as a whole, the error is not
        one record's (a stage that fails every record, a downstream outage): the
        round's records are charged a retry each and replayed together after their
        backoff, not split again; they end acked once the error goes, or
        dead-lettered with its reason after their retries (see :class:`Rounds`)."""
        self.counts["failed"] += len(failed.root)
        new_dead = []
        for batch in np.unique(failed.batch).tolist():
            rows = failed.batch == batch
            roots, why = Roots(*(col[rows] for col in failed)), outcome.select(rows)
            group = self._rounds.group_of_batch.pop(batch, NO_GROUP)
            if len(roots.root) == 1:
                new_dead += self._failed(roots, why, now_ms, alone=True)
            elif self._rounds.systematic(group):  # its round failed whole before
                new_dead += self._charge_together(roots, why, now_ms)
            elif self._rounds.failed(group):  # and so did every other group of its round
                taken = self._take_descendants(group)
                new_dead += self._charge_together(_concat_roots(roots, taken), why, now_ms)
            else:
                self._split(roots, group, now_ms)
        return new_dead

    def _split(self, roots: Roots, parent: int, now_ms: int) -> None:
        """Replay the suspects ``roots`` at once, uncharged, in a round of groups."""
        size = -(-len(roots.root) // ISOLATION_PARTS)  # ceiling
        groups = self._groups + 1 + np.arange(len(roots.root)) // size
        self._rounds.add(np.unique(groups).tolist(), parent)
        self._groups = int(groups[-1])
        self.waiting.add(roots.part, roots.offset, roots.attempt + 1, now_ms, groups)
        self._uncharged.add(packed(roots.part, roots.offset))
        self.counts["replayed"] += len(roots.root)

    def _take_descendants(self, group: int) -> Roots:
        """The records waiting in the rounds that groups of ``group``'s round were split
        into (their round failed whole: they are not split further), as in-flight rows
        at the attempt they failed."""
        groups = self._rounds.descendants(group)
        part, offset, attempt = self.waiting.take_groups(groups)
        self._uncharged.add(packed(part, offset), -1)  # counted for a replay not made
        self.counts["replayed"] -= len(offset)
        zero = np.zeros(len(offset), np.int64)
        return Roots(zero, part, offset, attempt - 1, zero, zero)

    def _charge_together(self, roots: Roots, why: _Outcomes, now_ms: int) -> list[DeadLetter]:
        """Every one of ``roots`` fails, charged; the replays wait together in one group
        (a batch of their own), dead letters go with the batch's first reason, saying
        that it was charged with the group's (it may quote another record's value)."""
        self._groups += 1
        self._rounds.add_systematic(self._groups)
        first, n = why.first_reason, len(roots.root)
        log.warning(
            "ackstream: every group of %d records failed as a whole (%s): they are retried "
            "together after their backoff, not split further",
            n,
            first,
        )
        reason = first
        if n > 1:
            charged = f"charged with {n} records of a failing group"
            reason = f"{charged}; the group's first error: {first}" if first else charged
        why = _Outcomes.repeat(BATCH_FAILED, reason, len(roots.root))
        return self._failed(roots, why, now_ms, group=self._groups)

    def _late_acks(self, acks: pa.Table) -> None:
        """Acks of an earlier attempt of a record that is not done yet (timed out, its
        replay scheduled or in flight): that attempt's tree was fully processed, so
        the record is done, as if its replay had been acked. Only ids this source
        mints for those coordinates count."""
        columns = ["root", "topic", "partition", "offset", "attempt"]
        acks = acks.select(columns).drop_null()
        root, topic, partition, offset, attempt = (
            acks.column(c).to_numpy(zero_copy_only=False) for c in columns
        )
        mine = ids.root_ids(self.source, topic, partition, offset, attempt) == root
        for tp in set(zip(topic[mine].tolist(), partition[mine].tolist())):
            part = self.parts.get(tp)
            if part is None:
                continue
            offsets = offset[mine & (topic == tp[0]) & (partition == tp[1])]
            offsets = offsets[(offsets >= part.watermark) & (offsets < part.end)]
            offsets = distinct(offsets[~part.done.contains(offsets)])
            self.counts["acked"] += len(offsets)
            self.mark_done(tp, offsets)

    def started(self, now_ms: int) -> None:
        """Spark ran every batch planned so far: start their roots' source timeout."""
        self.flights.start(now_ms)

    def paused(self, ms: int) -> None:
        """For ``ms`` no completion could be heard (the brokers did not answer): the
        source timeouts of the roots in flight do not count that time."""
        self.flights.delay(ms)

    def overdue(self, before_ms: int) -> bool:
        """Whether a root in flight was emitted at ``before_ms`` or earlier."""
        return self.flights.any_started_at_or_before(before_ms)

    def expire(self, now_ms: int) -> list[DeadLetter]:
        """Roots in flight for longer than the source timeout count as timed out."""
        cutoff = now_ms - self.source_timeout_ms
        overdue = self.flights.take_started_at_or_before(cutoff)
        overdue = overdue.sorted_by("emitted_ms", "part", "offset")
        self.counts["timed_out"] += len(overdue.root)
        return self._failed(overdue, _Outcomes.repeat(TIMED_OUT, None, len(overdue.root)), now_ms)

    def _failed(
        self,
        roots: Roots,
        why: _Outcomes,
        now_ms: int,
        replay: np.ndarray | bool = True,
        alone: bool = False,
        group: int = NO_GROUP,
    ) -> list[DeadLetter]:
        """Records no longer in flight failed: schedule their replays or dead-letter them.
        Retries and backoff count the attempts charged (a suspect's are not); ``alone``:
        each failed a batch of its own, and its replays stay alone; ``group``: their
        replays wait together in that group."""
        keys = packed(roots.part, roots.offset)
        charged = roots.attempt - self._uncharged.get(keys)
        dead = (charged >= self.policy.max_retries) | ~np.broadcast_to(replay, charged.shape)
        letters = [
            DeadLetter(self._tps[p][0], self._tps[p][1], off, att + 1, reason)
            for p, off, att, reason in zip(
                roots.part[dead].tolist(),
                roots.offset[dead].tolist(),
                roots.attempt[dead].tolist(),
                why.select(dead).dead_letter_reasons(),
            )
        ]
        for letter in letters:
            self.dead[((letter.topic, letter.partition), letter.offset)] = letter
        live = ~dead
        if alone:
            groups = self._groups + 1 + np.arange(int(live.sum()))
            self._groups += len(groups)
        else:
            groups = np.full(int(live.sum()), group)
        due = now_ms + self.policy.delays_ms(charged[live] + 1)
        self.waiting.add(roots.part[live], roots.offset[live], roots.attempt[live] + 1, due, groups)
        self.counts["replayed"] += int(live.sum())
        return letters

    def _forget(self, tp: Partition, offsets: npt.ArrayLike) -> None:
        """The records at ``offsets`` of ``tp`` leave every state (in flight, scheduled, dead)."""
        offsets = np.asarray(offsets, np.int64)
        part = self._index[tp]
        self.flights.take_offsets(part, offsets)
        self.waiting.drop(part, offsets)
        self._uncharged.drop(packed(part, offsets))
        if self.dead:
            for off in offsets.tolist():
                self.dead.pop((tp, off), None)

    def due(self, now_ms: int, budget: int | None = None) -> Replays:
        """Replays whose backoff is over, earliest first, at most ``budget``, but those of
        a group (see :meth:`due_group`); they are in flight from now on."""
        return self._replay(*self.waiting.take_due(now_ms, budget), now_ms)

    def due_group(self, now_ms: int) -> Replays:
        """The replays of the group due first (suspects, or a record that failed alone),
        for a batch that holds nothing else; none when no group is due. As :meth:`due`."""
        taken = self.waiting.take_group(now_ms)
        if taken is not None:
            self._rounds.group_of_batch[self.batch] = taken[0]
        live = set(distinct(self.waiting.columns()[4]).tolist())
        self._rounds.prune(live | set(self._rounds.group_of_batch.values()), self.batch)
        if taken is None:
            return self._replay(*(np.empty(0, np.int64),) * 3, now_ms)
        return self._replay(*taken[1:], now_ms)

    def _replay(
        self, part: np.ndarray, offset: np.ndarray, attempt: np.ndarray, now_ms: int
    ) -> Replays:
        """Put the scheduled records taken out (``part``, ``offset``, ``attempt``) in flight."""
        self._add_roots(part, offset, attempt, now_ms)
        return Replays(self._tps, part, offset, attempt)

    def dead_lettered(self, letters: Sequence[DeadLetter]) -> None:
        """The dead letters were written: their records are done."""
        self.counts["dead_lettered"] += len(letters)
        for letter in letters:
            self.dead.pop(((letter.topic, letter.partition), letter.offset), None)
        by_tp: dict[Partition, list[int]] = {}
        for letter in letters:
            by_tp.setdefault((letter.topic, letter.partition), []).append(letter.offset)
        for tp, offsets in by_tp.items():
            self._forget(tp, offsets)
            self.parts[tp].mark_done(offsets)

    def mark_done(self, tp: Partition, offsets: npt.ArrayLike) -> None:
        """Offsets known to be done from elsewhere (the consumer group's commit)."""
        offsets = np.asarray(offsets, np.int64)
        offsets = offsets[offsets < self.parts[tp].end]
        self._forget(tp, offsets)
        self.parts[tp].mark_done(offsets)

    # --- commits and snapshots ------------------------------------------------------

    def watermarks(self) -> dict[Partition, int]:
        return {tp: p.watermark for tp, p in self.parts.items()}

    def commit_metadata(self, tp: Partition) -> str:
        """Done offsets above ``tp``'s watermark as JSON ranges, the lowest first, as
        many as fit the broker's limit."""
        return self.parts[tp].commit_metadata()

    def rounds(self) -> dict | None:
        """The rounds of isolation in progress, JSON-able (None: none), for
        :meth:`restore_rounds` after a restart."""
        return self._rounds.snapshot(self.batch)

    def restore_rounds(self, rounds: Mapping[str, Any] | None) -> None:
        """Go on with the rounds :meth:`rounds` gave, once :meth:`restore` put the
        records back (those in flight are the last planned batch's)."""
        self._rounds.restore(rounds, self.batch)

    def snapshot(self) -> dict[Partition, Position]:
        """Positions, a few dozen bytes a partition whatever is in flight: per partition
        the read position and watermark (:meth:`unfinished` has the records between the
        two that are not done)."""
        return {tp: Position(part.end, part.watermark) for tp, part in sorted(self.parts.items())}

    def unfinished(self, flying: bool = True) -> Unfinished:
        """Every record between a watermark and its read position that is not done:
        in flight (unless not ``flying``), scheduled (with its due time) or dead (its
        letter unwritten: in flight again after a restore). Those in flight as runs, so
        its cost is a few numpy passes over the runs and the records kept as rows."""
        rows = self.flights.flying() if flying else EMPTY_SPANS
        dead = np.array(
            [
                (self._index[tp], off, letter.attempts - 1, DEAD, NO_GROUP)
                for (tp, off), letter in self.dead.items()
            ],
            np.int64,
        ).reshape(-1, 5)
        waiting = Waiting(
            *(np.concatenate([col, d]) for col, d in zip(self.waiting.columns(), dead.T))
        )
        keys = self._uncharged.keys
        uncharged = Uncharged(keys >> 48, keys & _OFFSET_MASK, self._uncharged.counts.copy())
        return Unfinished(list(self._tps), rows, waiting, uncharged)

    def changes(self) -> Changes:
        """The records put in flight and taken out since :meth:`mark`, net."""
        return self.flights.changes()

    def mark(self) -> None:
        """Every record not done was written down: :meth:`changes` count from now."""
        self.flights.mark()

    def restore(
        self, snapshot: Mapping[Partition, Position], now_ms: int, unfinished: Unfinished | None
    ) -> None:
        """Rebuild from :meth:`snapshot` and :meth:`unfinished`: records in flight then
        are in flight again (their completion may still come; if not, the source
        timeout replays them), scheduled replays stay scheduled, dead ones are in
        flight again, the rest between a watermark and its read position is done.
        Without ``unfinished`` (lost), every record between the two is in flight again
        at attempt 0."""
        for tp, at in snapshot.items():
            self.parts[tp] = _Partition(at.watermark, at.end)
            self._number(tp)
        if unfinished is None:
            for tp, known in self.parts.items():
                offsets = np.arange(known.watermark, known.end)
                self._add_roots(self._index[tp], offsets, 0, now_ms, started=True)
            return
        index = np.array([self._number(tp) for tp in unfinished.tps], np.int64)
        waiting, uncharged = unfinished.waiting, unfinished.uncharged
        flying_part, flying_offset, flying_attempt = unfinished.flying.rows()
        scheduled = waiting.due != DEAD  # a dead one's letter was not written: in flight again
        if scheduled.any():
            self.waiting.add(
                *(index[waiting.part[scheduled]], *(c[scheduled] for c in waiting[1:]))
            )
            self._groups = max(self._groups, self.waiting.last_group)
        if len(uncharged.offset):
            self._uncharged.add(packed(index[uncharged.part], uncharged.offset), uncharged.attempts)
        dead = ~scheduled
        part = (
            index[np.concatenate([flying_part, waiting.part[dead]])] if len(index) else flying_part
        )
        self._add_roots(
            part,
            np.concatenate([flying_offset, waiting.offset[dead]]),
            np.concatenate([flying_attempt, waiting.attempt[dead]]),
            now_ms,
            started=True,
        )
        left = np.concatenate([part, index[waiting.part[scheduled]] if len(index) else part[:0]])
        offset = np.concatenate([flying_offset, waiting.offset[dead], waiting.offset[scheduled]])
        order = np.argsort(left, kind="stable")
        starts = np.searchsorted(left[order], np.arange(len(self._tps) + 1))
        for i, tp in enumerate(self._tps):
            if tp in self.parts:
                p = self.parts[tp]
                mine = offset[order[starts[i] : starts[i + 1]]]
                p.done = _complement(p.watermark, p.end, mine)


class _Statuses:
    """The ``status`` column of completions, its names encoded once: a mask per status
    is a numpy comparison of small integers, not a string comparison per row."""

    def __init__(self, completions: pa.Table):
        encoded = pc.dictionary_encode(completions.column("status").combine_chunks())
        self.names = encoded.dictionary.to_pylist()
        self.codes = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False)

    def of(self, name: str) -> np.ndarray:
        """Which rows have status ``name``."""
        if name not in self.names:
            return np.zeros(len(self.codes), bool)
        return self.codes == self.names.index(name)


def _rows(table: pa.Table, mask: np.ndarray) -> pa.Table:
    """The rows of ``table`` where ``mask`` holds (the table itself when all do)."""
    return table if mask.all() else table.filter(pa.array(mask))


class _Outcomes(NamedTuple):
    """The outcome of each of some failed roots: its status, and where its reason is."""

    status: np.ndarray  # str objects
    row: np.ndarray  # the root's row of ``reasons`` (-1: ``reasons`` holds no row for it)
    reasons: pa.ChunkedArray | pa.Array

    @classmethod
    def of(cls, completions: pa.Table, roots: np.ndarray) -> _Outcomes:
        """Each of ``roots``' status and reason in ``completions`` (one row per root,
        every one of ``roots`` among them); reasons are read only for dead letters."""
        keys = pc.fill_null(completions.column("root"), 0).to_numpy()
        order = np.argsort(keys, kind="stable")
        at = order[np.searchsorted(keys[order], roots)]
        status = pc.dictionary_encode(completions.column("status").combine_chunks())
        names = np.array(status.dictionary.to_pylist() + [None], object)
        codes = pc.fill_null(status.indices, len(names) - 1).to_numpy(zero_copy_only=False)
        return cls(names[codes[at]], at, completions.column("reason"))

    @classmethod
    def repeat(cls, status: str, reason: str | None, n: int) -> _Outcomes:
        return cls(
            np.full(n, status, object), np.zeros(n, np.int64), pa.array([reason], pa.string())
        )

    def select(self, rows: np.ndarray) -> _Outcomes:
        return _Outcomes(self.status[rows], self.row[rows], self.reasons)

    @property
    def first_reason(self) -> str | None:
        return self.reasons[int(self.row[0])].as_py() if len(self.row) else None

    def dead_letter_reasons(self) -> list[str]:
        reasons = self.reasons.take(pa.array(self.row)).to_pylist() if len(self.row) else []
        return [_why(s, r) for s, r in zip(self.status.tolist(), reasons)]


class Rounds:
    """Rounds of isolation in progress (see :meth:`Tracker._isolate`): the groups a failed
    batch's suspects were split into, how many of each round failed as a whole, the
    group each planned batch replayed, and the groups whose round failed whole (their
    records replay together, charged). A few entries per group, kept in the source's
    offset (:meth:`snapshot`), so a restart goes on with its rounds: begun again, each
    group waiting would start a round of its own."""

    def __init__(self) -> None:
        #: the group a batch replayed, by the batch's number (see ``Tracker.batch``)
        self.group_of_batch: dict[int, int] = {}
        self._round: dict[int, int] = {}  # group -> its round (the round's first group)
        self._size: dict[int, int] = {}  # round -> its groups
        self._failed: dict[int, int] = {}  # round -> its groups failed as a whole
        self._children: dict[int, list[int]] = {}  # group -> the groups it was split into
        self._systematic: set[int] = set()

    def add(self, groups: list[int], parent: int) -> None:
        """A new round of ``groups``, split out of group ``parent`` (or of a batch of no
        group, :data:`~ackstream.sources.waiting.NO_GROUP`)."""
        first = groups[0]
        self._round.update(dict.fromkeys(groups, first))
        self._size[first], self._failed[first] = len(groups), 0
        if parent != NO_GROUP:
            self._children[parent] = groups

    def failed(self, group: int) -> bool:
        """Group ``group`` failed as a whole: whether every group of its round now has."""
        first = self._round.get(group)
        if first is None:
            return False
        self._failed[first] += 1
        return self._failed[first] >= self._size[first]

    def descendants(self, group: int) -> list[int]:
        """The groups that the groups of ``group``'s round were split into, and theirs;
        the round is over."""
        first = self._round[group]
        stack = [g for g, r in self._round.items() if r == first]
        found: list[int] = []
        while stack:
            children = self._children.pop(stack.pop(), [])
            found += children
            stack += children
        for g in [g for g, r in self._round.items() if r == first]:
            del self._round[g]
        del self._size[first], self._failed[first]
        return found

    def add_systematic(self, group: int) -> None:
        self._systematic.add(group)

    def systematic(self, group: int) -> bool:
        """Whether ``group`` holds records whose round failed whole."""
        return group in self._systematic

    def snapshot(self, batch: int) -> dict | None:
        """What :meth:`restore` takes, JSON-able; None when no round is in progress.
        ``flying``: the group the batch ``batch`` (the last planned) replays."""
        if not (self._round or self._systematic):
            return None
        return {
            "round": [[g, r] for g, r in self._round.items()],
            "size": [[r, n] for r, n in self._size.items()],
            "failed": [[r, n] for r, n in self._failed.items()],
            "children": [[g, c] for g, c in self._children.items()],
            "systematic": sorted(self._systematic),
            "flying": self.group_of_batch.get(batch, NO_GROUP),
        }

    def restore(self, snapshot: Mapping[str, Any] | None, batch: int) -> None:
        """Rounds as :meth:`snapshot` gave them; the roots restored in flight, in batch
        ``batch``, are the ``flying`` group's."""
        if not snapshot:
            return
        self._round = {g: r for g, r in snapshot["round"]}
        self._size = {r: n for r, n in snapshot["size"]}
        self._failed = {r: n for r, n in snapshot["failed"]}
        self._children = {g: list(c) for g, c in snapshot["children"]}
        self._systematic = set(snapshot["systematic"])
        if snapshot.get("flying", NO_GROUP) != NO_GROUP:
            self.group_of_batch[batch] = snapshot["flying"]

    def prune(self, live: set[int], batch: int) -> None:
        """Forget groups that neither wait nor were split (their batch went through),
        rounds left with no group, and the groups of batches long planned."""
        for group in [g for g in self._round if g not in live and g not in self._children]:
            first = self._round.pop(group)
            if first not in self._round.values():
                self._size.pop(first, None)
                self._failed.pop(first, None)
        self._systematic &= live
        for old in [b for b in self.group_of_batch if b < batch - 1_000]:
            del self.group_of_batch[old]


def _concat_roots(*parts: Roots) -> Roots:
    return Roots(*(np.concatenate(cols) for cols in zip(*parts)))


def _why(outcome: str, reason: str | None) -> str:
    """A dead letter's reason: the status, then the stage's reason if it gave one."""
    return outcome + (f": {reason}" if reason else "")


def ranges(offsets: Iterable[int]) -> list[list[int]]:
    """Offsets as sorted half-open ``[start, end)`` runs.

    >>> ranges({1, 2, 3, 7})
    [[1, 4], [7, 8]]
    """
    if not isinstance(offsets, np.ndarray):
        offsets = np.fromiter(offsets, np.int64)
    starts, ends = _spans(_sorted_unique(offsets))
    return np.stack([starts, ends], axis=1).tolist()


def _spans(offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends of the runs of sorted, distinct ``offsets``."""
    cuts = np.flatnonzero(np.diff(offsets) != 1) + 1
    first = np.concatenate([[0], cuts]).astype(np.int64)
    last = np.concatenate([cuts - 1, [len(offsets) - 1]]).astype(np.int64)
    if not len(offsets):
        return offsets, offsets
    return offsets[first], offsets[last] + 1


def _complement(lo: int, hi: int, taken: np.ndarray) -> DoneRuns:
    """The offsets of ``[lo, hi)`` but ``taken``, as runs, at a cost per taken offset."""
    taken = _sorted_unique(taken)
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


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    return distinct(values)


_POWERS_OF_TEN = 10 ** np.arange(1, 19, dtype=np.int64)


def _digits(values: np.ndarray) -> np.ndarray:
    """Decimal digits of each non-negative integer."""
    return 1 + np.searchsorted(_POWERS_OF_TEN, values, side="right")
