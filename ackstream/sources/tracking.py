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

import pyarrow as pa
import pyarrow.compute as pc

from ackstream import ids
from ackstream.records import ACKED, INVALID, REJECTED, TIMED_OUT

__all__ = ["METADATA_LIMIT", "DeadLetter", "RetryPolicy", "Tracker", "ranges"]

TP = tuple[str, int]

#: Bytes of commit metadata we allow ourselves (brokers default to 4096).
METADATA_LIMIT = 3800
#: Done ranges above the watermark kept per partition in a snapshot (Spark writes one
#: per batch); beyond that, facts are dropped: those records replay after a restart.
SNAPSHOT_RANGES = 1000


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff: attempt n (n >= 1) waits ``initial * 2**(n-1)``, at most ``max``."""

    initial_delay_ms: int = 500
    max_delay_ms: int = 10_000
    max_retries: int = 5

    def delay_ms(self, attempt: int) -> int:
        if attempt <= 0:
            return 0
        return min(self.max_delay_ms, self.initial_delay_ms * (1 << min(attempt - 1, 40)))


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


@dataclass(slots=True)
class _Root:
    tp: TP
    offset: int
    attempt: int
    emitted_ms: int | None  # None: planned, its batch has not run yet


@dataclass
class _Partition:
    watermark: int  # lowest offset not done
    end: int  # next offset to read from upstream
    done: set[int] = field(default_factory=set)  # done offsets above the watermark

    def mark_done(self, *offsets: int) -> None:
        below = self.watermark
        self.done.update(o for o in offsets if o >= below)
        while self.watermark in self.done:
            self.done.remove(self.watermark)
            self.watermark += 1


class Tracker:
    """The state of every record between its first emit and done (see module doc)."""

    def __init__(self, source: str, policy: RetryPolicy, source_timeout_ms: int,
                 max_pending: int | None = None):
        self.source, self.policy = source, policy
        self.source_timeout_ms, self.max_pending = source_timeout_ms, max_pending
        self.parts: dict[TP, _Partition] = {}
        #: in flight, by root id, in emission order: ``emitted_ms`` never decreases along
        #: it and roots not started yet come last, so timeouts look only at its ends
        self.roots: dict[int, _Root] = {}
        self._by_coord: dict[tuple[TP, int], int] = {}  # in flight: (tp, offset) -> root
        self.scheduled: dict[tuple[TP, int], tuple[int, int]] = {}  # -> (attempt, due_ms)
        self.dead: dict[tuple[TP, int], DeadLetter] = {}
        #: True: a root's source timeout starts at :meth:`started` (when Spark has run
        #: its batch), not when it is planned; the first batch of a query may start late.
        self.clock_on_commit = False

    # --- partitions and emits -------------------------------------------------------

    def add_partition(self, tp: TP, offset: int) -> None:
        """Start tracking ``tp`` at ``offset`` (a no-op for a known partition)."""
        if tp not in self.parts:
            self.parts[tp] = _Partition(offset, offset)

    @property
    def in_flight(self) -> int:
        return len(self.roots)

    def budget(self, limit: int | None = None) -> int | None:
        """How many new roots may be emitted now: max pending minus in flight, and ``limit``."""
        room = None if self.max_pending is None else max(0, self.max_pending - len(self.roots))
        if limit is None:
            return room
        return limit if room is None else min(room, limit)

    def emit_range(self, tp: TP, start: int, end: int, now_ms: int) -> None:
        """Offsets ``[start, end)`` of ``tp`` were emitted for the first time (attempt 0)."""
        part = self.parts[tp]
        if start != part.end:
            raise ValueError(f"{tp}: emit from {start} but the next offset to read is {part.end}")
        self._add_roots(tp, range(start, end), [0] * (end - start), now_ms, fresh=True)
        part.end = end

    def skip_to(self, tp: TP, offset: int) -> None:
        """Offsets below ``offset`` no longer exist upstream (retention): count them as done."""
        part = self.parts[tp]
        for off in range(part.watermark, min(offset, part.end)):
            self._forget(tp, off)
            part.mark_done(off)
        part.watermark = max(part.watermark, offset)
        part.done = {o for o in part.done if o >= part.watermark}
        part.end = max(part.end, offset)

    def _add_roots(self, tp: TP, offsets, attempts, now_ms: int, started=False,
                   fresh=False) -> list[int]:
        """Put roots in flight; ``fresh``: offsets never emitted before (no root to move)."""
        offsets, attempts = list(offsets), list(attempts)
        if not offsets:
            return []
        roots = ids.root_ids(self.source, tp[0], tp[1], offsets, attempts).tolist()
        emitted = None if self.clock_on_commit and not started else now_ms
        if not fresh:
            for root in roots:
                self.roots.pop(root, None)  # a root added again moves to the end
        self.roots.update(zip(roots, [_Root(tp, off, att, emitted)
                                      for off, att in zip(offsets, attempts)]))
        self._by_coord.update(zip([(tp, off) for off in offsets], roots))
        return roots

    # --- completions, timeouts, replays ---------------------------------------------

    def complete(self, completions: pa.Table, now_ms: int) -> list[DeadLetter]:
        """Apply completions (``root``, ``status`` and ``reason`` columns, as the
        completion channel gives them); return new dead letters.

        A completion for a root that is not in flight (an earlier attempt, another
        source, a duplicate) is ignored, and so is an ``invalid`` one (a bad ack
        record says nothing about its root). Of several completions of one root in
        ``completions``, any other outcome applies before an ack: two writers can
        report one root (a read task rejects a record of a batch that a topology acks
        whole), and a wrong ack loses a record where a wrong fail only replays it.
        """
        acked = pc.fill_null(pc.equal(completions.column("status"), ACKED), False)
        others = completions.filter(pc.invert(acked))
        new_dead = []
        for root_id, outcome, reason in zip(*(others.column(c).to_pylist()
                                              for c in ("root", "status", "reason"))):
            root = self.roots.get(root_id)
            if root is None or outcome == INVALID:
                continue
            self._forget(root.tp, root.offset)
            why = outcome + (f": {reason}" if reason else "")
            new_dead += self._failed(root, why, now_ms, replay=outcome != REJECTED)
        done: dict[TP, list[int]] = {}
        for root_id in completions.filter(acked).column("root").to_pylist():
            root = self.roots.pop(root_id, None)  # in flight: neither scheduled nor dead,
            if root is not None:  # so forgetting it takes two deletions
                del self._by_coord[(root.tp, root.offset)]
                done.setdefault(root.tp, []).append(root.offset)
        for tp, offsets in done.items():
            self.parts[tp].mark_done(*offsets)
        return new_dead

    def started(self, now_ms: int) -> None:
        """Spark ran every batch planned so far: start their roots' source timeout."""
        for root in reversed(self.roots.values()):  # the roots not started are the newest
            if root.emitted_ms is not None:
                break
            root.emitted_ms = now_ms

    def overdue(self, before_ms: int) -> bool:
        """Whether a root in flight was emitted at ``before_ms`` or earlier."""
        oldest = next(iter(self.roots.values()), None)
        return oldest is not None and oldest.emitted_ms is not None \
            and oldest.emitted_ms <= before_ms

    def expire(self, now_ms: int) -> list[DeadLetter]:
        """Roots in flight for longer than the source timeout count as timed out."""
        overdue = []
        for root in self.roots.values():  # oldest first
            if root.emitted_ms is None or now_ms - root.emitted_ms < self.source_timeout_ms:
                break
            overdue.append(root)
        new_dead = []
        for root in overdue:
            self._forget(root.tp, root.offset)
            new_dead += self._failed(root, TIMED_OUT, now_ms)
        return new_dead

    def _failed(self, root: _Root, reason: str, now_ms: int, replay=True) -> list[DeadLetter]:
        key = (root.tp, root.offset)
        if root.attempt >= self.policy.max_retries or not replay:
            letter = DeadLetter(root.tp[0], root.tp[1], root.offset, root.attempt + 1, reason)
            self.dead[key] = letter
            return [letter]
        attempt = root.attempt + 1
        self.scheduled[key] = (attempt, now_ms + self.policy.delay_ms(attempt))
        return []

    def _forget(self, tp: TP, offset: int) -> None:
        root = self._by_coord.pop((tp, offset), None)
        if root is not None:
            del self.roots[root]
        self.scheduled.pop((tp, offset), None)
        self.dead.pop((tp, offset), None)

    def due(self, now_ms: int, budget: int | None = None) -> list[tuple[str, int, int, int]]:
        """Replays whose backoff is over, earliest first, at most ``budget``; they are in
        flight from now on. Each is ``(topic, partition, offset, attempt)``."""
        ready = sorted((due, key, att) for key, (att, due) in self.scheduled.items()
                       if due <= now_ms)
        if budget is not None:
            ready = ready[:budget]
        out = []
        for _, (tp, off), att in ready:
            del self.scheduled[(tp, off)]
            self._add_roots(tp, [off], [att], now_ms)
            out.append((tp[0], tp[1], off, att))
        return out

    def dead_lettered(self, letters) -> None:
        """The dead letters were written: their records are done."""
        for letter in letters:
            tp = (letter.topic, letter.partition)
            self._forget(tp, letter.offset)
            self.parts[tp].mark_done(letter.offset)

    def mark_done(self, tp: TP, offsets) -> None:
        """Offsets known to be done from elsewhere (the consumer group's commit)."""
        part = self.parts[tp]
        for off in offsets:
            if off < part.end:
                self._forget(tp, off)
                part.mark_done(off)

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
        for root in self.roots.values():
            if root.attempt:
                retry.setdefault(root.tp, []).append([root.offset, root.attempt, -1])
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
                for a, b in entry.get("done", ()):
                    part.done.update(range(a, b))
                attempts = {}
                for off, att, due in entry.get("retry", ()):
                    if due >= 0:
                        self.scheduled[(tp, off)] = (att, due)
                    else:
                        attempts[off] = att
                live = [o for o in range(part.watermark, part.end)
                        if o not in part.done and (tp, o) not in self.scheduled]
                self._add_roots(tp, live, [attempts.get(o, 0) for o in live], now_ms,
                                started=True)


def ranges(offsets) -> list[list[int]]:
    """Sorted offsets as half-open ``[start, end)`` runs: {1, 2, 3, 7} -> [[1, 4], [7, 8]]."""
    out: list[list[int]] = []
    for off in sorted(offsets):
        if out and out[-1][1] == off:
            out[-1][1] = off + 1
        else:
            out.append([off, off + 1])
    return out
