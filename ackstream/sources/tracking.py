"""The state of every record of one source between its first emit and done: pure
bookkeeping, no Spark, no Kafka, time passed in.

The source's driver-side reader owns one :class:`Tracker`; every upstream record is in
exactly one of these states:

- **in flight**: emitted under a root id (attempt n), waiting for its completion
  (:mod:`ackstream.sources.in_flight`);
- **scheduled**: its last root failed or timed out; it is replayed at attempt n + 1
  once its backoff is over (:mod:`ackstream.sources.retries`). A record whose batch
  failed as a whole is a *suspect*, replayed at once in rounds that isolate the
  records at fault (:mod:`ackstream.sources.isolation`);
- **dead**: failed on its last allowed attempt, or rejected, waiting for its dead
  letter to be written (then it is done);
- **done**: acked or dead-lettered; per partition the watermark is the lowest offset
  not done (:mod:`ackstream.sources.done_runs`).

:meth:`Tracker.snapshot` (positions, in the Spark offset), :meth:`Tracker.unfinished`
(the records not done, in the source's state files, see :mod:`ackstream.sources.state`)
and :meth:`Tracker.rounds` are what :meth:`Tracker.restore` and
:meth:`Tracker.restore_rounds` resume from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from ackstream.config.source import RetryPolicy
from ackstream.sources.done_runs import Progress, complement
from ackstream.sources.in_flight import InFlight
from ackstream.sources.isolation import Isolation
from ackstream.sources.numbering import Numbering
from ackstream.sources.outcomes import Outcomes, Statuses, rows_where
from ackstream.sources.retries import Retries
from ackstream.sources.spans import (
    EMPTY,
    EMPTY_SPANS,
    NOT_STARTED,
    Changes,
    Coordinates,
    Roots,
    Spans,
)
from ackstream.sources.state import DEAD, Uncharged, Unfinished, Waiting
from ackstream.sources.waiting import NO_GROUP, Replays, packed
from ackstream.vocabulary import ids
from ackstream.vocabulary.arrays import distinct
from ackstream.vocabulary.batch_offset import Position
from ackstream.vocabulary.dead_letter import DeadLetter
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

__all__ = ["OUTCOME_COUNTS", "Tracker"]

#: The offset bits of a :func:`~ackstream.sources.waiting.packed` key.
_OFFSET_MASK = (1 << 48) - 1

#: The names of :attr:`Tracker.counts`.
OUTCOME_COUNTS = ("acked", "failed", "timed_out", "rejected", "replayed", "dead_lettered")


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
        self.parts: dict[Partition, Progress] = {}
        self._numbering = Numbering(source)
        self.flights = InFlight(self._numbering.mint)
        #: Outcomes counted by this tracker (the spout keeps them in its Spark offset, so
        #: a restart goes on from them): roots acked, failed, timed out and rejected;
        #: records replayed and dead-lettered.
        self.counts = dict.fromkeys(OUTCOME_COUNTS, 0)
        self._retries = Retries(policy, self._numbering.tps, self.counts)
        #: records waiting for their replay, and those waiting for their dead letter
        self.waiting, self.dead = self._retries.waiting, self._retries.dead
        self._isolation = Isolation(self._retries, self.counts)
        #: the number of the batch being planned: roots put in flight now are in it
        self.batch = 0
        #: True: a root's source timeout starts at :meth:`started` (when Spark has run
        #: its batch), not when it is planned; the first batch of a query may start late.
        self.clock_on_commit = False

    # --- partitions and emits -------------------------------------------------------

    def add_partition(self, tp: Partition, offset: int) -> None:
        """Start tracking ``tp`` at ``offset`` (a no-op for a known partition)."""
        if tp not in self.parts:
            self.parts[tp] = Progress(offset, offset)
            self._numbering.number(tp)

    @property
    def partitions(self) -> list[Partition]:
        """The partition of each index in the in-flight table's ``part`` column."""
        return self._numbering.tps

    @property
    def in_flight(self) -> int:
        return len(self.flights)

    def budget(self, limit: int | None = None) -> int | None:
        """How many new roots may be emitted now: max pending minus the records not done
        (in flight, waiting for a replay or for their dead letter), and ``limit``. A
        replay takes no room: it was counted when it was first read (Storm's
        ``maxUncommittedOffsets`` counts retries alike), so a downstream outage that
        fails every record holds at most ``maxPending`` of them."""
        held = len(self.flights) + len(self._retries)
        room = None if self.max_pending is None else max(0, self.max_pending - held)
        if limit is None:
            return room
        return limit if room is None else min(room, limit)

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
                [self._numbering.index[tp] for tp, *_ in spans],
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
        status = Statuses(completions)
        alive = status.of(ALIVE)
        if alive.any():  # a reset reached the acker: the tree lives on
            self._restart(completions.filter(pa.array(alive)), now_ms)
        invalid = status.of(INVALID)
        if invalid.any():
            completions = completions.filter(pa.array(~invalid))
        one = one_outcome_per_root(completions)
        status = status if one is completions and not invalid.any() else Statuses(one)
        completions, acked = one, status.of(ACKED)
        others = rows_where(completions, ~acked)
        new_dead = []
        failed = self._take(others).sorted_by("part", "offset")
        outcome = Outcomes.of(others, failed.root)
        whole = outcome.status == BATCH_FAILED
        if not whole.all():
            status = outcome.status[~whole]
            rejected, timed_out = status == REJECTED, status == TIMED_OUT
            self.counts["rejected"] += int(rejected.sum())
            self.counts["timed_out"] += int(timed_out.sum())
            self.counts["failed"] += int((~rejected & ~timed_out).sum())
            new_dead += self._retries.fail(
                failed.at(~whole),
                outcome.select(~whole),
                now_ms,
                replay=~rejected,
            )
        if whole.any():
            new_dead += self._isolation.isolate(failed.at(whole), outcome.select(whole), now_ms)
        acks = rows_where(completions, acked)
        by_id, at = self._take_acked(acks)
        self._acked(Spans.concat([Spans.of_rows(by_id.part, by_id.offset, by_id.attempt), at]))
        if len(by_id.root) + at.records < acks.num_rows:  # some were not in flight
            taken = np.concatenate([by_id.root, self._numbering.mint(*at.rows())])
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
            taken.append(
                rows._replace(root=self._numbering.mint(rows.part, rows.offset, rows.attempt))
            )
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

    def _placed(self, completions: pa.Table) -> tuple[np.ndarray, Coordinates]:
        """The roots of ``completions`` to find by id, and the coordinates (``part``,
        ``offset``, ``attempt``) of the others. A completion that names its record's
        coordinates (as the ledger's do) is found by them, once its id is checked
        against the one this source mints for them (a mismatch is not this source's);
        one that does not, by its id, for which every id in flight is minted."""
        part = self._numbering.parts_of(
            completions.column("topic"), completions.column("partition")
        )
        offset, attempt, root = (
            pc.fill_null(completions.column(c), -1).to_numpy()
            for c in ("offset", "attempt", "root")
        )
        # the ledger caps an attempt it reports at 255: past it, only the id is sure
        placed = (part >= 0) & (part < 1 << 15) & (offset >= 0) & (attempt >= 0) & (attempt < 255)
        part, offset, attempt, mine = part[placed], offset[placed], attempt[placed], root[placed]
        mine = self._numbering.mint(part, offset, attempt) == mine
        return root[~placed], (part[mine], offset[mine], attempt[mine])

    def _acked(self, done: Spans) -> None:
        """The records of ``done`` (taken out of flight) were acked: they are done, at a
        cost per run."""
        self.counts["acked"] += done.records
        if len(self._retries.uncharged):
            part, offset, _ = done.rows()
            self._retries.uncharged.drop(packed(part, offset))
        for part in np.unique(done.part).tolist():
            self.parts[self._numbering.tps[part]].mark_done_runs(done.at(done.part == part))

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
            (self._numbering.index[tp], lo, hi)
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
            tp, state = self._numbering.tps[part], self.parts[self._numbering.tps[part]]
            offsets = np.arange(max(lo, state.watermark), min(hi, state.end), dtype=np.int64)
            gone = np.concatenate(
                [done.at(done.part == part).rows()[1], failed.offset[failed.part == part]]
            )
            offsets = np.setdiff1d(offsets, gone)
            offsets = offsets[~state.done.contains(offsets)]
            self.counts["acked"] += len(offsets)
            self.mark_done(tp, offsets)

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
        return self._retries.fail(
            overdue, Outcomes.repeat(TIMED_OUT, None, len(overdue.root)), now_ms
        )

    def _forget(self, tp: Partition, offsets: npt.ArrayLike) -> None:
        """The records at ``offsets`` of ``tp`` leave every state (in flight, scheduled, dead)."""
        offsets = np.asarray(offsets, np.int64)
        part = self._numbering.index[tp]
        self.flights.take_offsets(part, offsets)
        self._retries.forget(part, offsets)

    def due(self, now_ms: int, budget: int | None = None) -> Replays:
        """Replays whose backoff is over, earliest first, at most ``budget``, but those of
        a group (see :meth:`due_group`); they are in flight from now on."""
        return self._replay(*self.waiting.take_due(now_ms, budget), now_ms)

    def due_group(self, now_ms: int) -> Replays:
        """The replays of the group due first (suspects, or a record that failed alone),
        for a batch that holds nothing else; none when no group is due. As :meth:`due`."""
        taken = self._isolation.take_group(now_ms, self.batch)
        if taken is None:
            return self._replay(*(np.empty(0, np.int64),) * 3, now_ms)
        return self._replay(*taken, now_ms)

    def _replay(
        self, part: np.ndarray, offset: np.ndarray, attempt: np.ndarray, now_ms: int
    ) -> Replays:
        """Put the scheduled records taken out (``part``, ``offset``, ``attempt``) in flight."""
        self._add_roots(part, offset, attempt, now_ms)
        return Replays(self._numbering.tps, part, offset, attempt)

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

    def rounds(self) -> dict[str, Any] | None:
        """The rounds of isolation in progress, JSON-able (None: none), for
        :meth:`restore_rounds` after a restart."""
        return self._isolation.rounds.snapshot(self.batch)

    def restore_rounds(self, rounds: Mapping[str, Any] | None) -> None:
        """Go on with the rounds :meth:`rounds` gave, once :meth:`restore` put the
        records back (those in flight are the last planned batch's)."""
        self._isolation.rounds.restore(rounds, self.batch)

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
                (self._numbering.index[tp], off, letter.attempts - 1, DEAD, NO_GROUP)
                for (tp, off), letter in self.dead.items()
            ],
            np.int64,
        ).reshape(-1, 5)
        waiting = Waiting(
            *(np.concatenate([col, d]) for col, d in zip(self.waiting.columns(), dead.T))
        )
        keys, counts = self._retries.uncharged.keys, self._retries.uncharged.counts
        uncharged = Uncharged(keys >> 48, keys & _OFFSET_MASK, counts.copy())
        return Unfinished(list(self._numbering.tps), rows, waiting, uncharged)

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
            self.parts[tp] = Progress(at.watermark, at.end)
            self._numbering.number(tp)
        if unfinished is None:
            for tp, known in self.parts.items():
                offsets = np.arange(known.watermark, known.end)
                self._add_roots(self._numbering.index[tp], offsets, 0, now_ms, started=True)
            return
        index = np.array([self._numbering.number(tp) for tp in unfinished.tps], np.int64)
        waiting, uncharged = unfinished.waiting, unfinished.uncharged
        flying_part, flying_offset, flying_attempt = unfinished.flying.rows()
        scheduled = waiting.due != DEAD  # a dead one's letter was not written: in flight again
        if scheduled.any():
            self.waiting.add(
                *(index[waiting.part[scheduled]], *(c[scheduled] for c in waiting[1:]))
            )
            self._retries.groups = max(self._retries.groups, self.waiting.last_group)
        if len(uncharged.offset):
            self._retries.uncharged.add(
                packed(index[uncharged.part], uncharged.offset), uncharged.attempts
            )
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
        starts = np.searchsorted(left[order], np.arange(len(self._numbering.tps) + 1))
        for i, tp in enumerate(self._numbering.tps):
            if tp in self.parts:
                p = self.parts[tp]
                mine = offset[order[starts[i] : starts[i + 1]]]
                p.done = complement(p.watermark, p.end, mine)
