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
  replays;
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
from dataclasses import dataclass, field
from itertools import compress

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ackstream import ids
from ackstream.config import RetryPolicy
from ackstream.ranges import is_run
from ackstream.records import (
    ACKED,
    ALIVE,
    BATCH_FAILED,
    INVALID,
    REJECTED,
    TIMED_OUT,
    one_outcome_per_root,
)
from ackstream.sources.in_flight import (
    EMPTY,
    EMPTY_SPANS,
    NOT_STARTED,
    Changes,
    InFlight,
    Roots,
    Spans,
)
from ackstream.sources.rows import TP
from ackstream.sources.state import DEAD, Uncharged, Unfinished, Waiting

__all__ = ["ISOLATION_PARTS", "METADATA_LIMIT", "OUTCOME_COUNTS", "DeadLetter", "Tracker", "ranges"]


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

    def __init__(self, starts=None, ends=None) -> None:
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

    def merged(self, starts, ends) -> DoneRuns:
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

    def mark_done(self, offsets) -> None:
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
        self.parts: dict[TP, _Partition] = {}
        self._tps: list[TP] = []  # the partition of each index in the in-flight ``part`` column
        self._index: dict[TP, int] = {}
        self.flights = InFlight(self._mint)
        self.scheduled: dict[tuple[TP, int], tuple[int, int]] = {}  # -> (attempt, due_ms)
        self.dead: dict[tuple[TP, int], DeadLetter] = {}
        #: scheduled records that replay only with their group, in a batch of its own
        #: (suspects, and records that failed alone), by group number
        self.suspects: dict[tuple[TP, int], int] = {}
        self._groups = 0  # the last group number given
        #: per record not done, its attempts not charged to its retries (as a suspect)
        self.uncharged: dict[tuple[TP, int], int] = {}
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

    def add_partition(self, tp: TP, offset: int) -> None:
        """Start tracking ``tp`` at ``offset`` (a no-op for a known partition)."""
        if tp not in self.parts:
            self.parts[tp] = _Partition(offset, offset)
            self._number(tp)

    def _number(self, tp: TP) -> int:
        """The index of ``tp`` in the in-flight table's ``part`` column."""
        if tp not in self._index:
            self._index[tp] = len(self._tps)
            self._tps.append(tp)
        return self._index[tp]

    @property
    def partitions(self) -> list[TP]:
        """The partition of each index in the in-flight table's ``part`` column."""
        return self._tps

    @property
    def in_flight(self) -> int:
        return len(self.flights)

    def budget(self, limit: int | None = None) -> int | None:
        """How many new roots may be emitted now: max pending minus in flight, and ``limit``."""
        room = None if self.max_pending is None else max(0, self.max_pending - len(self.flights))
        if limit is None:
            return room
        return limit if room is None else min(room, limit)

    def emit_range(self, tp: TP, start: int, end: int, now_ms: int) -> None:
        """Offsets ``[start, end)`` of ``tp`` were emitted for the first time (attempt 0)."""
        self.emit_ranges([(tp, start, end)], now_ms)

    def emit_ranges(self, spans: list[tuple[TP, int, int]], now_ms: int) -> None:
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

    def skip_to(self, tp: TP, offset: int) -> None:
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

    def _add_roots(self, part, offsets, attempts, now_ms: int, started=False) -> None:
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
        topics = np.array([t for t, _ in self._tps], dtype=object)
        partition = np.array([p for _, p in self._tps], np.int64)[part]
        topic = topics[part]
        if (topic == topic[0]).all():  # one topic: hashed once
            topic = topic[0]
        return ids.root_ids(self.source, topic, partition, offset, attempt)

    # --- completions, timeouts, replays ---------------------------------------------

    def complete(self, completions: pa.Table, now_ms: int) -> list[DeadLetter]:
        """Apply completions (``root``, ``status`` and ``reason`` columns, as the
        completion channel gives them); return new dead letters.

        A completion for a root that is not in flight (an earlier attempt, another
        source, a duplicate) is ignored, and so is an ``invalid`` one (a bad ack
        record says nothing about its root). Of several completions of one root,
        any other outcome applies before an ack (``records.one_outcome_per_root``).
        """
        run = is_run(completions)  # runs of acked offsets (ackstream.ranges)
        runs = completions.filter(pa.array(run)) if run.any() else None
        if runs is not None:
            completions = completions.filter(pa.array(~run))
        alive = pc.fill_null(pc.equal(completions.column("status"), ALIVE), False)
        if pc.any(alive).as_py():  # a reset reached the acker: the tree lives on
            self._restart(completions.filter(alive), now_ms)
        valid = pc.fill_null(pc.not_equal(completions.column("status"), INVALID), True)
        completions = one_outcome_per_root(completions.filter(valid))
        acked = pc.fill_null(pc.equal(completions.column("status"), ACKED), False)
        others = completions.filter(pc.invert(acked))
        outcomes: dict[int, tuple[str, str | None]] = {
            root: (outcome, reason)
            for root, outcome, reason in zip(
                *(others.column(c).to_pylist() for c in ("root", "status", "reason"))
            )
        }
        new_dead = []
        failed = self._take(others).sorted_by("part", "offset")
        whole = np.array([outcomes[r][0] == BATCH_FAILED for r in failed.root.tolist()], bool)
        for root, part, offset, attempt in zip(*(col[~whole].tolist() for col in failed[:4])):
            outcome, reason = outcomes[root]
            self.counts[outcome if outcome in (REJECTED, TIMED_OUT) else "failed"] += 1
            new_dead += self._failed(
                self._tps[part],
                offset,
                attempt,
                _why(outcome, reason),
                now_ms,
                replay=outcome != REJECTED,
            )
        if whole.any():
            new_dead += self._isolate(Roots(*(col[whole] for col in failed)), outcomes, now_ms)
        acks = completions.filter(acked)
        done = self._take(acks)
        self._acked(Spans.of_rows(done.part, done.offset, done.attempt))
        if len(done.root) < acks.num_rows:  # some were not in flight
            found = pc.is_in(acks.column("root"), pa.array(done.root))
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
        topic = completions.column("topic").to_pylist()
        partition = completions.column("partition").to_pylist()
        part = np.array([self._index.get((t, p), -1) for t, p in zip(topic, partition)], np.int64)
        offset, attempt, root = (
            pc.fill_null(completions.column(c), -1).to_numpy()
            for c in ("offset", "attempt", "root")
        )
        # the ledger caps an attempt it reports at 255: past it, only the id is sure
        placed = (part >= 0) & (part < 1 << 15) & (offset >= 0) & (attempt >= 0) & (attempt < 255)
        part, offset, attempt, mine = part[placed], offset[placed], attempt[placed], root[placed]
        mine = self._mint(part, offset, attempt) == mine
        return root[~placed], (part[mine], offset[mine], attempt[mine])

    def _acked(self, done: Spans) -> None:
        """The records of ``done`` (taken out of flight) were acked: they are done, at a
        cost per run."""
        self.counts["acked"] += done.records
        if self.uncharged:
            part, offset, _ = done.rows()
            for p, off in zip(part.tolist(), offset.tolist()):
                self.uncharged.pop((self._tps[p], off), None)
        for part in np.unique(done.part).tolist():
            self.parts[self._tps[part]].mark_done_runs(done.at(done.part == part))

    def _complete_runs(self, runs: pa.Table, failed: Roots) -> None:
        """Apply completions that each ack a run of offsets at attempt 0 (see
        :mod:`ackstream.ranges`), without a root id per offset: the roots in flight in
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

    def _isolate(self, failed: Roots, outcomes: dict, now_ms: int) -> list[DeadLetter]:
        """Roots whose batch failed as a whole (``failed``, in flight until now). A root
        that was alone in its batch is at fault: it fails as any root does, and is
        replayed alone. Those of a bigger batch are suspects: replayed at once, no
        retry charged, in :data:`ISOLATION_PARTS` groups of their own (see module doc)."""
        self.counts["failed"] += len(failed.root)
        new_dead = []
        for batch in np.unique(failed.batch).tolist():
            rows = failed.batch == batch
            root, part, offset, attempt = (col[rows].tolist() for col in failed[:4])
            if len(root) == 1:
                why = _why(*outcomes[root[0]])
                tp = self._tps[part[0]]
                new_dead += self._failed(tp, offset[0], attempt[0], why, now_ms, alone=True)
                continue
            size = -(-len(root) // ISOLATION_PARTS)  # ceiling
            for i, (p, off, att) in enumerate(zip(part, offset, attempt)):
                if i % size == 0:
                    self._groups += 1
                key = (self._tps[p], off)
                self.scheduled[key] = (att + 1, now_ms)
                self.suspects[key] = self._groups
                self.uncharged[key] = self.uncharged.get(key, 0) + 1
            self.counts["replayed"] += len(root)
        return new_dead

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
            offsets = np.unique(offsets[~part.done.contains(offsets)])
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
        new_dead = []
        for part, offset, attempt in zip(*(col.tolist() for col in overdue[1:4])):
            new_dead += self._failed(self._tps[part], offset, attempt, TIMED_OUT, now_ms)
        return new_dead

    def _failed(
        self, tp: TP, offset: int, attempt: int, reason: str, now_ms: int, replay=True, alone=False
    ) -> list[DeadLetter]:
        """A root not in flight any more failed: schedule its replay or dead-letter it.
        Retries and backoff count the attempts charged (a suspect's are not); ``alone``:
        it failed a batch of its own, and its replays stay alone."""
        key = (tp, offset)
        charged = attempt - self.uncharged.get(key, 0)
        if charged >= self.policy.max_retries or not replay:
            letter = DeadLetter(tp[0], tp[1], offset, attempt + 1, reason)
            self.dead[key] = letter
            return [letter]
        self.scheduled[key] = (attempt + 1, now_ms + self.policy.delay_ms(charged + 1))
        if alone:
            self._groups += 1
            self.suspects[key] = self._groups
        self.counts["replayed"] += 1
        return []

    def _forget(self, tp: TP, offsets) -> None:
        """The records at ``offsets`` of ``tp`` leave every state (in flight, scheduled, dead)."""
        offsets = np.asarray(offsets, np.int64)
        self.flights.take_offsets(self._index[tp], offsets)
        for state in (self.scheduled, self.dead, self.suspects, self.uncharged):  # all small
            keys = [key for key in state if key[0] == tp]
            if keys:
                for key in compress(keys, np.isin([off for _, off in keys], offsets)):
                    del state[key]

    def due(self, now_ms: int, budget: int | None = None) -> list[tuple[str, int, int, int]]:
        """Replays whose backoff is over, earliest first, at most ``budget``, but those of
        a group (see :meth:`due_group`); they are in flight from now on. Each is
        ``(topic, partition, offset, attempt)``."""
        ready = sorted(
            (due, key, att)
            for key, (att, due) in self.scheduled.items()
            if due <= now_ms and key not in self.suspects
        )
        if budget is not None:
            ready = ready[:budget]
        return self._replay([(key, att) for _, key, att in ready], now_ms)

    def due_group(self, now_ms: int) -> list[tuple[str, int, int, int]]:
        """The replays of the group due first (suspects, or a record that failed alone),
        for a batch that holds nothing else; [] when no group is due. As :meth:`due`."""
        firsts: dict[int, tuple[int, int]] = {}  # group -> (due_ms, group)
        for key, group in self.suspects.items():
            due = self.scheduled[key][1]
            if due <= now_ms:
                firsts[group] = min(firsts.get(group, (due, group)), (due, group))
        if not firsts:
            return []
        group = min(firsts.values())[1]
        members = sorted(key for key, g in self.suspects.items() if g == group)
        for key in members:
            del self.suspects[key]
        return self._replay([(key, self.scheduled[key][0]) for key in members], now_ms)

    def _replay(self, ready: list, now_ms: int) -> list[tuple[str, int, int, int]]:
        """Put the scheduled ``ready`` records, ``((tp, offset), attempt)``, in flight."""
        for key, _ in ready:
            del self.scheduled[key]
        self._add_roots(
            [self._index[tp] for (tp, _), _ in ready],
            [off for (_, off), _ in ready],
            [att for _, att in ready],
            now_ms,
        )
        return [(tp[0], tp[1], off, att) for (tp, off), att in ready]

    def dead_lettered(self, letters) -> None:
        """The dead letters were written: their records are done."""
        self.counts["dead_lettered"] += len(letters)
        by_tp: dict[TP, list[int]] = {}
        for letter in letters:
            by_tp.setdefault((letter.topic, letter.partition), []).append(letter.offset)
        for tp, offsets in by_tp.items():
            self._forget(tp, offsets)
            self.parts[tp].mark_done(offsets)

    def mark_done(self, tp: TP, offsets) -> None:
        """Offsets known to be done from elsewhere (the consumer group's commit)."""
        offsets = np.asarray(offsets, np.int64)
        offsets = offsets[offsets < self.parts[tp].end]
        self._forget(tp, offsets)
        self.parts[tp].mark_done(offsets)

    # --- commits and snapshots ------------------------------------------------------

    def watermarks(self) -> dict[TP, int]:
        return {tp: p.watermark for tp, p in self.parts.items()}

    def commit_metadata(self, tp: TP) -> str:
        """Done offsets above ``tp``'s watermark as JSON ranges, the lowest first, as
        many as fit the broker's limit."""
        return self.parts[tp].commit_metadata()

    def snapshot(self) -> dict:
        """JSON-able positions, a few dozen bytes a partition whatever is in flight: per
        topic and partition the read position and watermark (:meth:`unfinished` has
        the records between the two that are not done)."""
        out: dict = {}
        for tp, part in sorted(self.parts.items()):
            out.setdefault(tp[0], {})[str(tp[1])] = {"end": part.end, "wm": part.watermark}
        return out

    def unfinished(self, flying: bool = True) -> Unfinished:
        """Every record between a watermark and its read position that is not done:
        in flight (unless not ``flying``), scheduled (with its due time) or dead (its
        letter unwritten: in flight again after a restore). Those in flight as runs, so
        its cost is a few numpy passes over the runs and the records kept as rows."""
        rows = self.flights.flying() if flying else EMPTY_SPANS
        waiting = [
            (self._index[tp], off, att, due, self.suspects.get((tp, off), -1))
            for (tp, off), (att, due) in self.scheduled.items()
        ]
        waiting += [
            (self._index[tp], off, letter.attempts - 1, DEAD, -1)
            for (tp, off), letter in self.dead.items()
        ]
        uncharged = [(self._index[tp], off, n) for (tp, off), n in self.uncharged.items()]
        return Unfinished(
            list(self._tps),
            rows,
            Waiting(*np.array(waiting, np.int64).reshape(-1, 5).T),
            Uncharged(*np.array(uncharged, np.int64).reshape(-1, 3).T),
        )

    def changes(self) -> Changes:
        """The records put in flight and taken out since :meth:`mark`, net."""
        return self.flights.changes()

    def mark(self) -> None:
        """Every record not done was written down: :meth:`changes` count from now."""
        self.flights.mark()

    def restore(self, snapshot: dict, now_ms: int, unfinished: Unfinished | None) -> None:
        """Rebuild from :meth:`snapshot` and :meth:`unfinished`: records in flight then
        are in flight again (their completion may still come; if not, the source
        timeout replays them), scheduled replays stay scheduled, dead ones are in
        flight again, the rest between a watermark and its read position is done.
        Without ``unfinished`` (lost), every record between the two is in flight again
        at attempt 0."""
        for topic, parts in snapshot.items():
            for p, entry in parts.items():
                tp = (topic, int(p))
                self.parts[tp] = _Partition(entry["wm"], entry["end"])
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
        for i, off, att, at, group in zip(*(col[scheduled].tolist() for col in waiting)):
            tp = self._tps[index[i]]
            self.scheduled[(tp, off)] = (att, at)
            if group >= 0:
                self.suspects[(tp, off)] = group
                self._groups = max(self._groups, group)
        for i, off, n in zip(*(col.tolist() for col in uncharged)):
            self.uncharged[(self._tps[index[i]], off)] = n
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


def _why(outcome: str, reason: str | None) -> str:
    """A dead letter's reason: the status, then the stage's reason if it gave one."""
    return outcome + (f": {reason}" if reason else "")


def ranges(offsets) -> list[list[int]]:
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
    """Sorted distinct values (``np.unique`` hashes, which is slower on these)."""
    values = np.sort(np.asarray(values, np.int64))
    if len(values) < 2:
        return values
    return values[np.concatenate([[True], values[1:] != values[:-1]])]


_POWERS_OF_TEN = 10 ** np.arange(1, 19, dtype=np.int64)


def _digits(values: np.ndarray) -> np.ndarray:
    """Decimal digits of each non-negative integer."""
    return 1 + np.searchsorted(_POWERS_OF_TEN, values, side="right")
