"""The spout: the driver-side logic of one ``ackstream`` source, with no Spark import.

Built from (config, upstream, channel, clock), as Storm's KafkaSpout is from its
consumer factory, so it runs and is tested without a query. The Spark reader
(:mod:`ackstream.sources.datasource`) only adapts it: ``latestOffset`` asks it for
the next offset, ``commit`` tells it a batch has run.

On each call it applies the completions that arrived (acked offsets move the
commit watermark; failures are scheduled for replay with backoff or
dead-lettered), wakes the acker while a root is overdue, then plans the next
batch: due replays first, then new offsets, within ``maxPending`` and the read
limit, split over partitions by lag. The roots of a batch that failed as a whole
replay in groups, each group a batch of its own, until the record at fault fails
alone (see :mod:`ackstream.sources.isolation`). The offset it returns holds each partition's
read position and watermark (see :mod:`ackstream.sources.offsets`); the records
between the two that are not done go to the source's state file that the offset
names (:mod:`ackstream.sources.state`), written before the offset is returned.

Guarantees: a group commit never covers an offset that is not acked or
dead-lettered. A dead letter is written once, then its record is done; writing
it makes the next offset differ (an empty batch if nothing else is new), so the
fact is in Spark's offset log a few milliseconds later, and in the group commit
when it is contiguous (or in the commit metadata, on brokers that keep it). Only
a driver crash inside that window writes the dead letter again on restart: the
headers' (topic, partition, offset) then identify the duplicate.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ackstream.channels.base import Channel
from ackstream.config.source import SourceConfig, default_tick_ms
from ackstream.errors import AckstreamError
from ackstream.kafka.settings import kafka_options_of
from ackstream.sinks.dead_letters import DeadLetterWriter, KafkaDeadLetters, ParquetDeadLetters
from ackstream.sources.claim import GroupClaim, new_owner
from ackstream.sources.offsets import spark_reads_replays
from ackstream.sources.starting import new_tracker
from ackstream.sources.state import SourceState
from ackstream.sources.upstream import Upstream
from ackstream.sources.waiting import Replays
from ackstream.vocabulary.batch_offset import BatchOffset, Tracked
from ackstream.vocabulary.clock import Clock, now_ms
from ackstream.vocabulary.partition import Partition
from ackstream.vocabulary.records import caught_up_ms, tick

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

__all__ = [
    "BLOCKED_MS",
    "Spout",
    "TrackedSpout",
    "UntrackedSpout",
    "open_spout",
    "share_by_lag",
]

#: A driver call slower than this (ms) waited for brokers; see ``Spout._blocked_time_not_charged``.
BLOCKED_MS = 1_000


def share_by_lag(budget: int | None, lags: dict[Partition, int]) -> dict[Partition, int]:
    """Split ``budget`` offsets over partitions in proportion to their lag (as Spark's
    Kafka source does for maxOffsetsPerTrigger)."""
    total = sum(lags.values())
    if budget is None or total <= budget:
        return dict(lags)
    out = {tp: budget * lag // total for tp, lag in lags.items()}
    left = budget - sum(out.values())
    for tp in sorted(lags, key=lambda t: -lags[t]):
        if left <= 0:
            break
        if out[tp] < lags[tp]:
            out[tp] += 1
            left -= 1
    return out


class Spout(ABC):
    """Driver-side state of one running source: the partitions' positions, the upstream,
    the consumer group's claim and commits, and the planning of each batch's new
    ranges. What tracking adds (completions, replays, dead letters, the state files) is
    :class:`TrackedSpout`'s; :class:`UntrackedSpout` commits what Spark ran.
    :func:`open_spout` makes the one the options ask for.

    ``offset`` is where it resumes (the initial offset, or the last one Spark logged);
    ``clock`` gives the time in ms for every decision.
    """

    def __init__(
        self,
        config: SourceConfig,
        upstream: Upstream,
        channel: Channel,
        offset: BatchOffset,
        clock: Clock = now_ms,
    ):
        self.config, self.upstream, self.channel, self.clock = config, upstream, channel, clock
        owner = offset.owner or new_owner()  # an offset from before owners
        self.claim = GroupClaim(config.topology, config.kafka.group_id, owner)
        self.tracker = new_tracker(config)
        self._restore(offset)
        self.tracker.clock_on_commit = True
        self.position = offset.done
        self._planned_ms = clock()  # when the last offset was planned
        self.committed: dict[
            Partition, tuple[int, str]
        ] = {}  # {tp: (offset, metadata without the claim)}
        self.latest: dict[Partition, int] = {}  # the upstream's end offsets, as last seen
        #: records the offsets planned since this spout started name (new and replayed):
        #: what its batches read, whichever reader reads them
        self.planned_records = 0

    def next_offset(self, max_rows: int | None = None) -> BatchOffset | None:
        """Take in what the batches that ran left, then plan the next batch of at most
        ``max_rows`` records; None when there is nothing to read."""
        now = self.clock()
        self._add_new_partitions()  # first: a deleted topic is named before calls wait on it
        # Spark plans a batch only after the previous one ran (and it calls commit() for
        # that one only when the next batch starts): everything planned so far has run.
        self._batches_ran(now)
        replays, budget = self._due(now, max_rows)
        read = self._new_ranges(now, budget)
        idle = not replays and not read
        if idle and not self._empty_batch_due(now):
            return None
        self._planned_ms = now
        runs = tuple((t, p, a, b, att) for t, p, a, b, att in replays.runs()) if replays else ()
        spark_reads_new = self.config.record_reader == "spark"  # the topology reads them
        offset = BatchOffset(
            self.tracker.snapshot(),
            done=self.position,
            owner=self.claim.owner,
            read=read,
            replays=runs,
            idle_ms=now if idle else None,  # nothing new: an offset of its own, so Spark runs it
            spark_reads_new=spark_reads_new,
            spark_reads_replays=spark_reads_new and spark_reads_replays(runs),
            tracked=self._tracked(),
        )
        self.planned_records += offset.new_records + offset.replayed_records
        return offset

    def _new_ranges(self, now: int, budget: int | None) -> dict[Partition, tuple[int, int]]:
        """``[from, to)`` each partition reads anew in the next batch: at most ``budget``
        offsets in all, split over the partitions by lag."""
        tracker = self.tracker
        tps = list(tracker.parts)
        self._check_retention(tps)
        positions = {tp: tracker.parts[tp].end for tp in tps}
        latest = self.latest = self.upstream.latest(tps, positions)
        self._check_not_reset(latest, positions)
        lags = {tp: max(0, latest[tp] - positions[tp]) for tp in tps}
        shares = share_by_lag(budget, lags)
        spans = [(tp, positions[tp], positions[tp] + n) for tp, n in shares.items() if n]
        self._emit(spans, now)
        return {tp: (start, end) for tp, start, end in spans}

    @abstractmethod
    def _restore(self, offset: BatchOffset) -> None:
        """Take up where ``offset`` left the partitions."""

    @abstractmethod
    def _batches_ran(self, now: int) -> None:
        """What the batches planned so far left, taken in before the next is planned."""

    def _due(self, now: int, max_rows: int | None) -> tuple[Replays | None, int | None]:
        """The replays of the next batch, and how many new offsets it may read."""
        return None, max_rows

    @abstractmethod
    def _emit(self, spans: list[tuple[Partition, int, int]], now: int) -> None:
        """The ranges ``(partition, from, to)`` are read by the next batch."""

    def _tracked(self) -> Tracked | None:
        """The tracked part of the next offset (None: untracked)."""
        return None

    def _empty_batch_due(self, now: int) -> bool:
        """A batch with nothing new is due (``ackstream.idleBatchInterval``): none was
        planned for the interval (untracked the source cannot see what a stage holds:
        roots may always be in flight)."""
        interval = self.config.idle_batch_ms
        return interval is not None and now - self._planned_ms >= interval

    def on_spark_commit(self, end: BatchOffset) -> None:
        """Spark finished the batch that ends at ``end``. The completions are not read
        here: Spark calls this right after the next ``latestOffset``, which has just
        read them."""
        self._add_new_partitions()  # first, as in next_offset
        self._ran(end)

    @abstractmethod
    def _ran(self, end: BatchOffset) -> None:
        """What the batch ending at ``end`` having run changes."""

    def metrics(self) -> dict[str, Any]:
        """What this source has seen since its checkpoint began, JSON-ready: the
        :attr:`Tracker.counts <ackstream.sources.tracking.Tracker.counts>`, roots
        ``pending`` (in flight), records ``waiting`` for a replay's backoff, records
        ``read`` by the batches planned since this source started (the source's own
        count: Spark's ``numInputRows`` leaves out what its Kafka connector reads); per
        topic and partition its ``end`` (upstream), ``committed`` (the watermark: every
        offset below it is acked or dead-lettered) and ``lag`` (end - committed)."""
        tracker = self.tracker
        parts: dict[str, dict[str, dict[str, int]]] = {}
        for tp, part in sorted(tracker.parts.items()):
            end = self.latest.get(tp, part.end)
            parts.setdefault(tp[0], {})[str(tp[1])] = {
                "end": end,
                "committed": part.watermark,
                "lag": max(0, end - part.watermark),
            }
        return {
            **tracker.counts,
            "pending": tracker.in_flight,
            "waiting": len(tracker.waiting),
            "read": self.planned_records,
            "partitions": parts,
        }

    def _add_new_partitions(self) -> None:
        """Partitions added upstream since the start are read from their earliest
        offset, as Spark's Kafka source does (Kafka clients see them when their
        metadata is refreshed: ``kafka.metadata.max.age.ms``). The upstream's listing
        is also where a topic deleted under the query stops it, named."""
        new = [tp for tp in self.upstream.partitions() if tp not in self.tracker.parts]
        if new:
            earliest = self.upstream.earliest(new)
            for tp in new:
                self.tracker.add_partition(tp, earliest[tp])

    def _check_retention(self, tps: list[Partition]) -> None:
        earliest = self.upstream.earliest(tps)
        for tp in tps:
            part = self.tracker.parts[tp]
            if earliest[tp] > part.end:
                if self.config.kafka.fail_on_data_loss:
                    raise AckstreamError(
                        f"{tp[0]}[{tp[1]}] offsets {part.end}..{earliest[tp] - 1} were deleted "
                        "by retention before they were read (data loss); set "
                        "failOnDataLoss=false to skip them"
                    )
                self.tracker.skip_to(tp, earliest[tp])

    @staticmethod
    def _check_not_reset(latest: dict[Partition, int], positions: dict[Partition, int]) -> None:
        """An end offset below what was already read: the topic was deleted and created
        again under the query (its records past the old offsets would be skipped)."""
        for tp, end in latest.items():
            if end < positions[tp]:
                raise AckstreamError(
                    f"{tp[0]}[{tp[1]}] ends at offset {end}, below the {positions[tp]} "
                    "already read: the topic was deleted and re-created while the query "
                    "ran. Start the query from a new checkpoint (startingOffsets=earliest "
                    "to read the new topic from its start)"
                )

    def _check_claim(self) -> bool:
        """When due, read the group's commits and stop if another query holds it."""
        now = self.clock()
        if not self.claim.due(now):
            return False
        self.claim.check(self.upstream.committed(list(self.tracker.parts)), now)
        return True

    def _send_commits(self, entries: dict[Partition, tuple[int, str]]) -> None:
        if entries:
            now = self.clock()
            self.upstream.commit(
                {tp: (off, self.claim.stamp(meta, now)) for tp, (off, meta) in entries.items()}
            )
            self.committed.update(entries)

    def close(self) -> None:
        self.upstream.close()
        self.channel.close()


class UntrackedSpout(Spout):
    """A source with tracking off: each batch's end is committed once Spark ran it
    (Spark's at-least-once); nothing waits for completions."""

    def _restore(self, offset: BatchOffset) -> None:
        self.tracker.restore(offset.parts, self.clock(), None)  # nothing was in flight

    def _emit(self, spans: list[tuple[Partition, int, int]], now: int) -> None:
        for tp, _, end in spans:  # nothing in flight: the watermark is the read position
            self.tracker.parts[tp].end = self.tracker.parts[tp].watermark = end

    def _batches_ran(self, now: int) -> None:
        self._commit_positions()

    def _ran(self, end: BatchOffset) -> None:
        self._commit_positions({tp: at.end for tp, at in end.parts.items()})

    def _commit_positions(self, positions: dict[Partition, int] | None = None) -> None:
        """Commit the read positions of batches Spark has run. Called from
        latestOffset (before the next batch is planned, so the driver's positions are
        those of the batch that just ran) or with the end Spark committed."""
        if positions is None:
            positions = {tp: part.end for tp, part in self.tracker.parts.items()}
        renew = self._check_claim()
        changed = {}
        for tp, end in positions.items():
            last = self.committed.get(tp, (-1, ""))[0]
            if end > last or (renew and end == last):  # never move backwards
                changed[tp] = (end, "")
        self._send_commits(changed)


class TrackedSpout(Spout):
    """A source with tracking on: completions in, replays scheduled with backoff or
    dead-lettered, acked offsets committed, the acker woken while a root is overdue,
    and the records not done kept in the state file each offset names."""

    def __init__(
        self,
        config: SourceConfig,
        upstream: Upstream,
        channel: Channel,
        offset: BatchOffset,
        clock: Clock = now_ms,
    ):
        super().__init__(config, upstream, channel, offset, clock)
        self.letters: DeadLetterWriter | None = None
        self._dead_since_snapshot = False
        self._ticked_ms = 0
        #: the latest tick the acker echoed: no root times out before the acker has read
        #: every ack record written until its deadline (a slow acker restart must not
        #: replay trees the acker will settle once it is back)
        self._acker_caught_up_ms = 0
        self._started_ms, self._warned_ms = clock(), 0
        self._deaf = False  # the channel did not answer the last completions read
        self._heard_ms = clock()  # the last time it did
        self._paused_since_heard = 0  # ms paused since then for blocked calls
        self._merge_group_commits()

    def _restore(self, offset: BatchOffset) -> None:
        """The positions, and the records not done from the state file ``offset`` names
        (all between a watermark and its read position in flight again, without it)."""
        self.state = SourceState(os.path.join(self.config.state_dir, self.claim.owner))
        tracked = offset.tracked
        self.seq = 0 if tracked is None else tracked.seq
        unfinished = None if tracked is None else self.state.read(self.seq)
        self.tracker.restore(offset.parts, self.clock(), unfinished)
        if tracked is not None:
            self.tracker.restore_rounds(tracked.rounds)
            # outcomes counted up to the logged position, whose later completions are read again
            self.tracker.counts.update(tracked.counts)

    def next_offset(self, max_rows: int | None = None) -> BatchOffset | None:
        """Apply completions, then plan the next batch of at most ``max_rows`` new roots
        (replays first); None when there is nothing to read."""
        with self._blocked_time_not_charged():
            return super().next_offset(max_rows)

    def _batches_ran(self, now: int) -> None:
        self.tracker.started(now)
        self._poll(now)

    def _due(self, now: int, max_rows: int | None) -> tuple[Replays | None, int | None]:
        tracker = self.tracker
        tracker.new_batch()
        # a group of suspects (or a record that failed its batch alone) is a batch of its
        # own: nothing new is read with it, so whatever fails it is among them
        replays = tracker.due_group(now)
        if replays:
            return replays, 0
        # replays take no room of maxPending: they hold it since their first read
        replays = tracker.due(now, max_rows)
        return replays, tracker.budget(None if max_rows is None else max_rows - len(replays))

    def _emit(self, spans: list[tuple[Partition, int, int]], now: int) -> None:
        self.tracker.emit_ranges(spans, now)

    def _empty_batch_due(self, now: int) -> bool:
        # a dead letter written makes a new offset, which persists the fact (see the
        # report in the module doc); else only roots in flight make one due
        return self._dead_since_snapshot or (
            self.tracker.in_flight > 0 and super()._empty_batch_due(now)
        )

    def _tracked(self) -> Tracked:
        """The batch's roots are waited for on these terms. Writes the state file the
        offset names first (before Spark logs the offset); the offset persists the
        dead letters written so far, so a restart does not write them again."""
        tracker = self.tracker
        self._dead_since_snapshot = False
        self.seq += 1
        self.state.write(self.seq, tracker)
        return Tracked(
            topology=self.config.topology,
            channel=self.config.channel,
            timeout_ms=self.config.message_timeout_ms,
            namespace=self.config.id_namespace,
            seq=self.seq,
            counts=dict(tracker.counts),
            rounds=tracker.rounds(),  # isolation in progress: a restart goes on with it
        )

    def _ran(self, end: BatchOffset) -> None:
        """Commits follow acks; the roots' source timeouts start now."""
        self.tracker.started(self.clock())
        if end.tracked is not None:  # a restart resumes from this offset or a later one
            self.state.forget_before(end.tracked.seq)

    def _merge_group_commits(self) -> None:
        """Offsets the group's commit says are done (it may be newer than the offset log:
        acks and dead letters after the last batch was planned) are done here too."""
        tps = list(self.tracker.parts)
        for tp, (off, meta) in self.upstream.committed(tps).items():
            part = self.tracker.parts[tp]
            done = list(range(part.watermark, min(off, part.end)))
            try:
                spans = json.loads(meta).get("done", []) if meta else []
            except (ValueError, AttributeError):
                spans = []
            for a, b in spans:
                done += range(a, b)
            self.tracker.mark_done(tp, done)

    @contextlib.contextmanager
    def _blocked_time_not_charged(self) -> Iterator[None]:
        """A driver call that took longer than ``BLOCKED_MS`` waited for brokers that did
        not answer (a restart, an election, a stall: Kafka calls are retried for up to
        ``OUTAGE_LIMIT_S``); no completion could be heard meanwhile, so that time is not
        charged to the source timeouts of the roots in flight. Otherwise a long broker
        restart would time out every root whose ack is written just after it. (The
        acker's ``caught_up`` echo alone covers trees a batch settles, whose acks are
        written before their roots start; not trees open across batches or processes,
        a window's or a continued tree's, whose acks a stalled broker also delays.)"""
        started = self.clock()
        try:
            yield
        finally:
            blocked = self.clock() - started
            if blocked > BLOCKED_MS:
                self.tracker.paused(blocked)
                self._paused_since_heard += blocked

    def _poll(self, now: int) -> None:
        """Completions in, replays scheduled, dead letters out, acked offsets committed;
        first of all, stop if another query holds the consumer group."""
        renew = self._check_claim()
        table, self.position = self.channel.completions_since(self.position, runs=True)
        if table.num_rows:
            self.tracker.complete(table, now)
            # a read takes every completion written before its end (the channel lists
            # where it ends first), so one with the echo has what the acker wrote before it
            echo = caught_up_ms(table)
            if echo is not None:
                self._acker_caught_up_ms = max(self._acker_caught_up_ms, echo)
        caught_up = self._acker_caught_up_ms
        if self._can_hear(now):
            self.tracker.expire(min(now, caught_up))
            self._tick(now)
            self._warn_if_no_acker(now, caught_up)
        if self.tracker.dead:
            self._write_dead_letters()
        self._commit(renew)

    def _can_hear(self, now: int) -> bool:
        """Whether completions reach the spout. While the channel does not answer, no
        root times out (its ack may be waiting there), and once it answers again the
        roots in flight are not charged the time since it last answered."""
        if not self.channel.answering():
            self._deaf = True
            return False
        if self._deaf:
            self.tracker.paused(max(0, now - self._heard_ms - self._paused_since_heard))
            self._deaf = False
        self._heard_ms, self._paused_since_heard = now, 0
        return True

    def _warn_if_no_acker(self, now: int, caught_up: int) -> None:
        """Say so, once a minute, while roots wait past twice the source timeout because
        no acker has answered the source's ticks: their timeouts wait for one."""
        waited = now - max(caught_up, self._started_ms)
        if waited < 2 * self.config.source_timeout_ms or now - self._warned_ms < 60_000:
            return
        if self.tracker.overdue(now - 2 * self.config.source_timeout_ms):
            log.warning(
                "topology %s: no acker has answered the source's ticks for %d s; roots in "
                "flight wait for it (is the acker query of this topology running?)",
                self.config.topology,
                waited // 1000,
            )
            self._warned_ms = now

    def _tick(self, now: int) -> None:
        """Wake the acker, at most once per its tick, while a root is past the message
        timeout: the acker runs only when records arrive, and such a root must time out
        there (see ``ackstream.acker.query``)."""
        timeout = self.config.message_timeout_ms
        if now - self._ticked_ms >= default_tick_ms(timeout) and self.tracker.overdue(
            now - timeout
        ):
            self.channel.write_acks(tick(now))
            self._ticked_ms = now

    def _write_dead_letters(self) -> None:
        letters = list(self.tracker.dead.values())
        if self.letters is None:
            if self.config.dead_letter_topic and self.config.kafka.bootstrap_servers:
                self.letters = KafkaDeadLetters(
                    self.config.kafka.bootstrap_servers,
                    self.config.dead_letter_topic,
                    self.config.topology,
                    kafka_options=kafka_options_of(self.config),
                )
            else:
                self.letters = ParquetDeadLetters(self.config.dead_letter_dir, self.config.topology)
        records = self.upstream.fetch([((lt.topic, lt.partition), lt.offset) for lt in letters])
        limit = self.config.admission.max_value_bytes  # a rejected huge value stays upstream only
        if limit is not None:
            records = {
                k: (key, None if value is not None and len(value) > limit else value, *rest)
                for k, (key, value, *rest) in records.items()
            }
        self.letters.write(letters, records)
        self.tracker.dead_lettered(letters)
        self._dead_since_snapshot = True

    def _commit(self, renew: bool) -> None:
        """Commit each partition's watermark (and done offsets above it) if it moved, and
        every partition's when the claim on the group is renewed."""
        changed = {}
        for tp, wm in self.tracker.watermarks().items():
            entry = (wm, self.tracker.commit_metadata(tp))
            if renew or self.committed.get(tp) != entry:
                changed[tp] = entry
        self._send_commits(changed)

    def close(self) -> None:
        super().close()
        if self.letters is not None:
            self.letters.close()


def open_spout(
    config: SourceConfig,
    upstream: Upstream,
    channel: Channel,
    offset: BatchOffset,
    clock: Clock = now_ms,
) -> Spout:
    """The spout of a source with tracking on or off, as ``config`` says."""
    kind = TrackedSpout if config.tracking else UntrackedSpout
    return kind(config, upstream, channel, offset, clock)
