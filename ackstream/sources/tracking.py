"""In-flight roots, commit watermarks and the retry schedule of one source: pure bookkeeping.

No Spark, no Kafka, time passed in. The source's driver-side reader owns one
:class:`Tracker`; every upstream record is in exactly one of these states:

- **in flight**: emitted under a root id (attempt n), waiting for its completion;
- **scheduled**: its last root failed or timed out; it is replayed at attempt n + 1
  once its backoff is over;
- **dead**: failed on its last allowed attempt, or rejected (the record itself is
  at fault, so no replay), waiting for its dead letter to be written (then it is
  done);
- **done**: acked or dead-lettered. Per partition the *watermark* is the lowest
  offset not done: everything below it may be committed to the consumer group,
  nothing above it is (Storm's KafkaSpout commits the same way).

:meth:`Tracker.snapshot` and :meth:`Tracker.restore` turn the state into JSON
that the source stores inside its Spark offsets, so a restart resumes it.
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
from ackstream.records import ACKED, ALIVE, INVALID, REJECTED, TIMED_OUT, one_outcome_per_root
from ackstream.sources.in_flight import NOT_STARTED, InFlight, Roots
from ackstream.sources.rows import TP

__all__ = ["METADATA_LIMIT", "OUTCOME_COUNTS", "DeadLetter", "Tracker", "ranges"]


#: Bytes of commit metadata we allow ourselves (brokers default to 4096).
METADATA_LIMIT = 3800
#: Done ranges above the watermark kept per partition in a snapshot (Spark writes one
#: per batch); beyond that, facts are dropped: those records replay after a restart.
SNAPSHOT_RANGES = 1000
#: The names of :attr:`Tracker.counts`.
OUTCOME_COUNTS = ("acked", "failed", "timed_out", "rejected", "replayed", "dead_lettered")


@dataclass(frozen=True)
class DeadLetter:
    """A record that failed on its last allowed attempt or was rejected; ``attempts``
    counts every emit; ``reason`` is the status, then the stage's reason if it gave one
    (``"failed: parse#2: ValueError: ..."``)."""

    topic: str
    partition: int
    offset: int
    attempts: int
    reason: str


@dataclass
class _Partition:
    watermark: int  # lowest offset not done
    end: int  # next offset to read from upstream
    done: set[int] = field(default_factory=set)  # done offsets above the watermark

    def mark_done(self, offsets) -> None:
        """These offsets are done; the watermark moves over any run of done ones."""
        offsets = np.sort(np.asarray(offsets, np.int64))
        offsets = offsets[offsets >= self.watermark]
        offsets = offsets[np.diff(offsets, prepend=offsets[:1] - 1) != 0]  # unique, faster
        if not self.done and len(offsets):  # the usual case: a run from the watermark
            run = offsets - self.watermark == np.arange(len(offsets))
            ahead = len(offsets) if run.all() else int(np.argmin(run))
            self.watermark += ahead
            offsets = offsets[ahead:]
        self.done.update(offsets.tolist())
        while self.watermark in self.done:
            self.done.remove(self.watermark)
            self.watermark += 1


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
        self._tps: list[TP] = []  # the partition of each index in ``flights.rows.part``
        self._index: dict[TP, int] = {}
        self.flights = InFlight()
        self.scheduled: dict[tuple[TP, int], tuple[int, int]] = {}  # -> (attempt, due_ms)
        self.dead: dict[tuple[TP, int], DeadLetter] = {}
        #: Outcomes since this tracker was made (a restart starts at 0): roots acked,
        #: failed, timed out and rejected; records replayed and dead-lettered.
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
        part = self.parts[tp]
        if start != part.end:
            raise ValueError(f"{tp}: emit from {start} but the next offset to read is {part.end}")
        self._add_roots(self._index[tp], np.arange(start, end), 0, now_ms)
        part.end = end

    def skip_to(self, tp: TP, offset: int) -> None:
        """Offsets below ``offset`` no longer exist upstream (retention): count them as done."""
        part = self.parts[tp]
        gone = np.arange(part.watermark, min(offset, part.end))
        self._forget(tp, gone)
        part.mark_done(gone)
        part.watermark = max(part.watermark, offset)
        part.done = {o for o in part.done if o >= part.watermark}
        part.end = max(part.end, offset)

    def _add_roots(self, part, offsets, attempts, now_ms: int, started=False) -> None:
        """Put records in flight under their root ids (``part`` indexes the partitions).
        Their timeout starts now if ``started`` or the clock does not wait for Spark."""
        offsets = np.asarray(offsets, np.int64)
        if not len(offsets):
            return
        part = np.broadcast_to(np.asarray(part, np.int64), offsets.shape)
        if (part == part[0]).all():  # one partition: its topic is hashed once
            topic, partition = self._tps[part[0]]
        else:
            topic = np.array([self._tps[i][0] for i in part.tolist()], dtype=object)
            partition = np.array([self._tps[i][1] for i in part.tolist()])
        roots = ids.root_ids(self.source, topic, partition, offsets, attempts)
        emitted = now_ms if started or not self.clock_on_commit else NOT_STARTED
        self.flights.add(Roots.of(roots, part, offsets, attempts, emitted))

    # --- completions, timeouts, replays ---------------------------------------------

    def complete(self, completions: pa.Table, now_ms: int) -> list[DeadLetter]:
        """Apply completions (``root``, ``status`` and ``reason`` columns, as the
        completion channel gives them); return new dead letters.

        A completion for a root that is not in flight (an earlier attempt, another
        source, a duplicate) is ignored, and so is an ``invalid`` one (a bad ack
        record says nothing about its root). Of several completions of one root,
        any other outcome applies before an ack (``records.one_outcome_per_root``).
        """
        alive = pc.fill_null(pc.equal(completions.column("status"), ALIVE), False)
        if pc.any(alive).as_py():  # a reset reached the acker: the tree lives on
            self.flights.restart(completions.filter(alive).column("root").to_numpy(), now_ms)
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
        failed = self.flights.take(list(outcomes)).sorted_by("part", "offset")
        for root, part, offset, attempt in zip(*(col.tolist() for col in failed[:4])):
            outcome, reason = outcomes[root]
            self.counts[outcome if outcome in (REJECTED, TIMED_OUT) else "failed"] += 1
            why = outcome + (f": {reason}" if reason else "")
            new_dead += self._failed(
                self._tps[part], offset, attempt, why, now_ms, replay=outcome != REJECTED
            )
        done = self.flights.take(completions.filter(acked).column("root").to_numpy())
        self.counts["acked"] += len(done.root)
        for part in np.flatnonzero(np.bincount(done.part)).tolist():
            self.parts[self._tps[part]].mark_done(done.offset[done.part == part])
        return new_dead

    def started(self, now_ms: int) -> None:
        """Spark ran every batch planned so far: start their roots' source timeout."""
        self.flights.start(now_ms)

    def overdue(self, before_ms: int) -> bool:
        """Whether a root in flight was emitted at ``before_ms`` or earlier."""
        return bool(self.flights.started_at_or_before(before_ms).any())

    def expire(self, now_ms: int) -> list[DeadLetter]:
        """Roots in flight for longer than the source timeout count as timed out."""
        overdue = self.flights.take_where(
            self.flights.started_at_or_before(now_ms - self.source_timeout_ms)
        )
        overdue = overdue.sorted_by("emitted_ms", "part", "offset")
        self.counts["timed_out"] += len(overdue.root)
        new_dead = []
        for part, offset, attempt in zip(*(col.tolist() for col in overdue[1:4])):
            new_dead += self._failed(self._tps[part], offset, attempt, TIMED_OUT, now_ms)
        return new_dead

    def _failed(
        self, tp: TP, offset: int, attempt: int, reason: str, now_ms: int, replay=True
    ) -> list[DeadLetter]:
        """A root not in flight any more failed: schedule its replay or dead-letter it."""
        if attempt >= self.policy.max_retries or not replay:
            letter = DeadLetter(tp[0], tp[1], offset, attempt + 1, reason)
            self.dead[(tp, offset)] = letter
            return [letter]
        self.scheduled[(tp, offset)] = (attempt + 1, now_ms + self.policy.delay_ms(attempt + 1))
        self.counts["replayed"] += 1
        return []

    def _forget(self, tp: TP, offsets) -> None:
        """The records at ``offsets`` of ``tp`` leave every state (in flight, scheduled, dead)."""
        offsets = np.asarray(offsets, np.int64)
        self.flights.take_offsets(self._index[tp], offsets)
        for state in (self.scheduled, self.dead):  # both small: look up their keys
            keys = [key for key in state if key[0] == tp]
            if keys:
                for key in compress(keys, np.isin([off for _, off in keys], offsets)):
                    del state[key]

    def due(self, now_ms: int, budget: int | None = None) -> list[tuple[str, int, int, int]]:
        """Replays whose backoff is over, earliest first, at most ``budget``; they are in
        flight from now on. Each is ``(topic, partition, offset, attempt)``."""
        ready = sorted(
            (due, key, att) for key, (att, due) in self.scheduled.items() if due <= now_ms
        )
        if budget is not None:
            ready = ready[:budget]
        for _, key, _ in ready:
            del self.scheduled[key]
        self._add_roots(
            [self._index[tp] for _, (tp, _), _ in ready],
            [off for _, (_, off), _ in ready],
            [att for _, _, att in ready],
            now_ms,
        )
        return [(tp[0], tp[1], off, att) for _, (tp, off), att in ready]

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
        """Done offsets above the watermark as JSON ranges, cut to fit the broker's limit."""
        spans = ranges(self.parts[tp].done)
        text = json.dumps({"done": spans}, separators=(",", ":"))
        while len(text.encode()) > METADATA_LIMIT and spans:
            spans = spans[: len(spans) // 2]
            text = json.dumps({"done": spans}, separators=(",", ":"))
        return text

    def snapshot(self) -> dict:
        """JSON-able state: per topic and partition the read position, watermark, done
        ranges, and the records on a retry (in flight at attempt > 0, or scheduled)."""
        out: dict = {}
        retry: dict[TP, list] = {}
        rows = self.flights.rows
        again = rows.attempt > 0
        for part, off, att in zip(*(col[again].tolist() for col in rows[1:4])):
            retry.setdefault(self._tps[part], []).append([off, att, -1])
        for (tp, off), (att, due) in self.scheduled.items():
            retry.setdefault(tp, []).append([off, att, due])
        for (tp, off), letter in self.dead.items():
            retry.setdefault(tp, []).append([off, letter.attempts - 1, -1])
        for tp, part in sorted(self.parts.items()):
            entry = {"end": part.end, "wm": part.watermark}
            if part.done:
                entry["done"] = ranges(part.done)[:SNAPSHOT_RANGES]
            if tp in retry:
                entry["retry"] = sorted(retry[tp])
            out.setdefault(tp[0], {})[str(tp[1])] = entry
        return out

    def restore(self, snapshot: dict, now_ms: int) -> None:
        """Rebuild from :meth:`snapshot`: every offset between the watermark and the read
        position that is not done is in flight again (its completion may still come;
        if not, the source timeout replays it), scheduled replays stay scheduled."""
        for topic, parts in snapshot.items():
            for p, entry in parts.items():
                tp = (topic, int(p))
                part = self.parts[tp] = _Partition(entry["wm"], entry["end"])
                index = self._number(tp)
                for a, b in entry.get("done", ()):
                    part.done.update(range(a, b))
                attempts = {}
                for off, att, due in entry.get("retry", ()):
                    if due >= 0:
                        self.scheduled[(tp, off)] = (att, due)
                    else:
                        attempts[off] = att
                live = np.arange(part.watermark, part.end)
                if part.done or self.scheduled:
                    live = np.array(
                        [
                            o
                            for o in live.tolist()
                            if o not in part.done and (tp, o) not in self.scheduled
                        ],
                        np.int64,
                    )
                self._add_roots(
                    index, live, [attempts.get(o, 0) for o in live.tolist()], now_ms, started=True
                )


def ranges(offsets) -> list[list[int]]:
    """Sorted offsets as half-open ``[start, end)`` runs.

    >>> ranges({1, 2, 3, 7})
    [[1, 4], [7, 8]]
    """
    out: list[list[int]] = []
    for off in sorted(offsets):
        if out and out[-1][1] == off:
            out[-1][1] = off + 1
        else:
            out.append([off, off + 1])
    return out
