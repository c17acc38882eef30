"""The Kafka upstream, spoken with kafka-python through :mod:`ackstream.kafka`.

Driver side, :class:`KafkaUpstream` lists partitions (of the ``subscribe`` topics,
the ``assign`` partitions, or the topics matching ``subscribePattern``), asks for
earliest/latest offsets and offsets by time, reads and writes the consumer group's
committed offsets (a standalone commit: ``assign()`` plus a group id, never a group
join), and fetches single records for dead letters. Executor side,
:meth:`KafkaUpstream.read` reads one :class:`~ackstream.sources.rows.ReadTask` with
the consumer its Python worker's previous task left idle (or a new one).

A driver-side call that fails with a Kafka error (a broker lost, a leader moved: the
consumer may wait out a whole request timeout on a dead connection) is tried again
with a new consumer, as Spark's Kafka source does (``fetchOffset.numRetries``), until
the brokers have failed for longer than ``OUTAGE_LIMIT_S`` (:mod:`ackstream.kafka.outage`), so that
one lost or stalled broker costs the planner a pause, not the query. A topic read
that was deleted is not an outage: the brokers are asked whether they still list it
when the partitions are listed (first thing in each planning round) and after any
failure (:mod:`ackstream.kafka.topics`), and a deleted one stops the query, named.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from ackstream.config.source import SourceConfig
from ackstream.errors import AckstreamError, EnvironmentProblem, OptionError
from ackstream.kafka.offsets import end_offsets
from ackstream.kafka.outage import RETRY_PAUSE_S, Outage
from ackstream.kafka.reading import MAX_RECORDS, read_records
from ackstream.kafka.settings import consumer_settings
from ackstream.kafka.topics import deleted_topics, never_create_topics, shared_listing
from ackstream.sources.done_runs import ranges
from ackstream.sources.rows import (
    NO_RECORD,
    Headers,
    ReadTask,
    held_batch,
    spout_batch,
    too_big_reason,
)
from ackstream.vocabulary.partition import Partition

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["KafkaUpstream"]

log = logging.getLogger(__name__)

#: How long the check before a query starts waits for the brokers to answer.
CHECK_TIMEOUT_MS = 10_000
#: Bytes of keys and values per Arrow batch (a binary column holds at most 2 GiB).
BYTES_PER_BATCH = 64 << 20

_T = TypeVar("_T")
#: a record as read: offset, attempt, key, value, timestamp (ms), its type, headers
_Record = tuple[int, int, bytes | None, bytes | None, int, int, Headers | None]


class KafkaUpstream:
    """The subscribed topics and the consumer group (see the module doc)."""

    def __init__(self, config: SourceConfig):
        self.config = config
        self.settings = consumer_settings(config)  # an unknown kafka.* option fails here
        self._client: KafkaConsumer | None = None
        self._matched: tuple[float, list[str]] = (float("-inf"), [])  # subscribePattern
        self._ever_matched: set[str] = set()  # every topic subscribePattern matched
        self._listing = shared_listing()  # asked in each plan and in the commit() after it

    @property
    def _consumer(self) -> KafkaConsumer:
        """The driver's consumer with the group id, made on first use (executors that
        only ``read`` never make one)."""
        if self._client is None:
            consumer = KafkaConsumer(group_id=self.config.kafka.group_id, **self.settings)
            self._client = never_create_topics(consumer)
        return self._client

    def _retried(self, what: str, call: Callable[[KafkaConsumer], _T]) -> _T:
        """``call(consumer)``; after a Kafka error, again with a new consumer every
        ``RETRY_PAUSE_S`` until the brokers have failed for longer than
        :data:`~ackstream.kafka.settings.OUTAGE_LIMIT_S` (see :class:`Outage`)."""
        from kafka.errors import KafkaError

        outage = Outage(str(self.config.kafka.bootstrap_servers), clock=time.monotonic)
        while True:
            try:
                return call(self._consumer)
            except KafkaError as error:
                self._listing.forget()
                self._check_not_deleted()  # the topic gone, not the brokers?
                self.close()
                outage.failed(what, error)
                time.sleep(RETRY_PAUSE_S)

    def _check_not_deleted(self) -> None:
        """Stop, naming them, if topics the query reads were deleted from the brokers
        (see :mod:`ackstream.kafka.topics`)."""
        config = self.config
        if config.kafka.assign:
            option, read = "assign", {t for t, _ in config.kafka.assign}
        elif config.kafka.subscribe_pattern:
            option, read = "subscribePattern", self._ever_matched
        else:
            option, read = "subscribe", set(config.kafka.topics)
        gone = deleted_topics(read, lambda: self._listing.names(self._consumer, read))
        if gone:
            raise EnvironmentProblem(
                f"topic {', '.join(map(repr, gone))} (option {option}) was deleted from "
                f"{config.kafka.bootstrap_servers} while the query ran: its records not yet acked "
                "can be neither replayed nor dead-lettered",
                "Start the query from a new checkpoint, with the topic re-created or no "
                "longer read",
            )

    def check(self) -> None:
        """Fail before the query starts if the brokers do not answer or a subscribed topic
        does not exist (later, Spark would report it from inside a running query). The
        check is bounded: a broker that holds the connection without answering (a
        listener speaking another security protocol can) fails it like a silent one."""
        outcome: list[AckstreamError | None] = []
        probe = threading.Thread(target=self._probe, args=(outcome,), daemon=True)
        probe.start()
        probe.join(CHECK_TIMEOUT_MS / 1000 + 5)
        if not outcome:  # the probe hangs on: leave it, it holds nothing of ours
            raise self._silent()
        if outcome[0] is not None:
            raise outcome[0]

    def _probe(self, outcome: list[AckstreamError | None]) -> None:
        from kafka.errors import KafkaError

        config = self.config
        problem: AckstreamError | None = None
        settings = {**self.settings, "bootstrap_timeout_ms": CHECK_TIMEOUT_MS}  # bounded
        try:
            consumer = KafkaConsumer(group_id=None, **settings)
        except KafkaError:
            outcome.append(self._silent())
            return
        try:
            option = "assign" if config.kafka.assign else "subscribe"
            missing = [t for t in config.kafka.topics if not consumer.partitions_for_topic(t)]
            missing += [
                f"{t}[{p}]"
                for t, p in config.kafka.assign
                if t not in missing and p not in (consumer.partitions_for_topic(t) or ())
            ]
            if missing:
                problem = EnvironmentProblem(
                    f"topic(s) or partition(s) {', '.join(missing)} (option {option}) do not "
                    f"exist on {config.kafka.bootstrap_servers}",
                    "Create them first, or fix the name.",
                )
            else:
                problem = self._starts_not_read(consumer)
        except KafkaError as error:
            problem = EnvironmentProblem(
                f"the Kafka broker at {config.kafka.bootstrap_servers} did not answer: {error}",
                "Check that it is up and reachable from here.",
            )
        finally:
            consumer.close(autocommit=False)
        outcome.append(problem)

    def _starts_not_read(self, consumer: KafkaConsumer) -> OptionError | None:
        """A start position (``startingOffsets``, ``startingOffsetsByTimestamp``) for a
        partition that is not read: one the topic lacks, or not among ``assign``'s
        (a topic a ``subscribePattern`` may match later is not checked)."""
        config = self.config
        for option, given, named in (
            ("startingOffsets", config.kafka.starting_offsets, config.kafka.starting_map()),
            (
                "startingOffsetsByTimestamp",
                config.kafka.starting_timestamps,
                config.kafka.timestamp_map(),
            ),
        ):
            for topic, parts in (named or {}).items():
                read = (
                    {p for t, p in config.kafka.assign if t == topic}
                    if config.kafka.assign
                    else consumer.partitions_for_topic(topic)
                )
                extra = sorted(set(parts) - set(read)) if read else []
                if extra:
                    return OptionError(
                        option,
                        given,
                        f"partitions that are read: {topic} has no partition "
                        f"{', '.join(map(str, extra))} to read (it reads "
                        f"{', '.join(map(str, sorted(read or ()))) or 'none'})",
                    )
        return None

    def _silent(self) -> EnvironmentProblem:
        protocol = dict(self.config.kafka.options).get("security.protocol", "PLAINTEXT")
        return EnvironmentProblem(
            f"no Kafka broker answers at {self.config.kafka.bootstrap_servers} (option "
            f"kafka.bootstrap.servers) with kafka.security.protocol={protocol} within "
            f"{CHECK_TIMEOUT_MS / 1000:g} s",
            "Start the broker, or give the host:port it listens on"
            + (
                ", or the security protocol its listener speaks."
                if protocol != "PLAINTEXT"
                else "."
            ),
        )

    def partitions(self) -> list[Partition]:
        """The partitions read, as the brokers list them now: asked once per planning
        round, first, so a topic read that was deleted stops the query, named, before
        a call waits on it."""
        self._check_not_deleted()
        if self.config.kafka.assign:
            return list(self.config.kafka.assign)
        out = []
        for topic in self._topics():
            parts = self._retried(f"partitions of {topic}", _partitions_of(topic))
            if not parts and not self.config.kafka.subscribe_pattern:
                raise AckstreamError(
                    f"topic {topic!r} (option 'subscribe') does not exist on "
                    f"{self.config.kafka.bootstrap_servers}: create it first"
                )
            out += [(topic, p) for p in sorted(parts or ())]
        return out

    def _topics(self) -> list[str]:
        """The subscribed topics, or those matching ``subscribePattern`` (whole name, as
        Java's consumer matches; internal ``__`` topics left out), asked of the brokers
        at most once per ``kafka.metadata.max.age.ms``, as a Kafka client refreshes."""
        pattern = self.config.kafka.subscribe_pattern
        if not pattern:
            return list(self.config.kafka.topics)
        asked, topics = self._matched
        if time.monotonic() - asked >= self.settings.get("metadata_max_age_ms", 300_000) / 1000:
            regex = re.compile(pattern)
            listed = self._listing.names(self._consumer)  # the deletion check's, if just asked
            topics = sorted(t for t in listed if regex.fullmatch(t) and not t.startswith("__"))
            self._matched = (time.monotonic(), topics)
            self._ever_matched.update(topics)
        return topics

    def offsets_for_times(self, times: dict[Partition, int]) -> dict[Partition, int | None]:
        """The first offset whose timestamp is at or after ``times[tp]`` (ms) per
        partition (the broker's ListOffsets by time); None where no record is that late."""
        got = self._consumer.offsets_for_times(
            {TopicPartition(*tp): ms for tp, ms in times.items()}
        )
        return {(k.topic, k.partition): None if v is None else v.offset for k, v in got.items()}

    def earliest(self, tps: list[Partition]) -> dict[Partition, int]:
        parts = [TopicPartition(*tp) for tp in tps]

        got = self._retried("earliest offsets", lambda consumer: consumer.beginning_offsets(parts))
        return {(k.topic, k.partition): v for k, v in got.items()}

    def latest(
        self, tps: list[Partition], positions: dict[Partition, int] | None = None
    ) -> dict[Partition, int]:
        """The next offset to be written per partition (see ``ackstream.kafka.offsets``)."""
        parts = [TopicPartition(*tp) for tp in tps]

        got = self._retried("latest offsets", lambda consumer: end_offsets(consumer, parts))
        return {(part.topic, part.partition): end for part, end in got.items()}

    def committed(self, tps: list[Partition]) -> dict[Partition, tuple[int, str]]:
        """The group's committed offset and metadata per partition (absent: no commit)."""
        out = {}
        for tp in tps:
            got = self._retried(
                f"the group's committed offset of {tp[0]}[{tp[1]}]", _committed_of(tp)
            )
            if got is not None and got.offset is not None and got.offset >= 0:
                out[tp] = (got.offset, got.metadata or "")
        return out

    def commit(self, offsets: dict[Partition, tuple[int, str]]) -> None:
        if offsets:
            commits = {
                TopicPartition(*tp): OffsetAndMetadata(off, meta, -1)
                for tp, (off, meta) in offsets.items()
            }
            self._retried("a commit", lambda consumer: consumer.commit(commits))

    def fetch(
        self, coords: list[tuple[Partition, int]]
    ) -> dict[tuple[Partition, int], tuple[Any, ...]]:
        """``(key, value, timestamp_ms, headers)`` of single records (for dead letters)."""
        by_tp: dict[Partition, list[int]] = {}
        for tp, off in coords:
            by_tp.setdefault(tp, []).append(off)
        out = {}
        for tp, offsets in by_tp.items():
            for rec in read_records(self._consumer, tp, ranges(offsets), fail_on_data_loss=False):
                out[(tp, rec.offset)] = (rec.key, rec.value, rec.timestamp, rec.headers or None)
        return out

    def close(self) -> None:
        if self._client is not None:
            self._client.close(autocommit=False)
            self._client = None

    def read(self, task: ReadTask) -> Iterator[pa.RecordBatch]:
        """Arrow batches of one task: the range at attempt 0, then the replays.

        Batches are bounded by rows and bytes (an Arrow binary column holds at most
        2 GiB). With tracking on, two kinds of offset never reach the bolts: a record
        whose value is over ``ackstream.maxValueBytes`` (rejected) and an offset with
        no record (a compacted topic, a transaction marker: done). They end the task
        as held-back rows whose ``_reason`` says which (``ackstream.sources.rows``):
        the driver learns of them from the batch itself, as no executor writes to a
        channel the driver may not see.
        """
        config = self.config
        consumer = _pooled_reader(self.settings)
        finished = False
        tp = (task.topic, task.partition)
        held: list[tuple[int, int, str]] = []  # (offset, attempt, reason)
        limit = config.value_limit
        try:
            replayed = dict(task.replays)
            passes = [
                ([(task.start, task.end)], range(task.start, task.end), {}),
                (ranges(replayed), replayed, replayed),
            ]
            for spans, offsets, attempts in passes:
                rows, size, seen = [], 0, set()
                for rec in read_records(
                    consumer, tp, spans, fail_on_data_loss=config.kafka.fail_on_data_loss
                ):
                    offset, key, value = rec.offset, rec.key, rec.value
                    seen.add(offset)
                    attempt = attempts.get(offset, 0)
                    if limit is not None and value is not None and len(value) > limit:
                        why = too_big_reason(len(value), limit)
                        held.append((offset, attempt, why))
                        continue
                    stamp = (rec.timestamp, rec.timestamp_type, rec.headers)
                    rows.append((offset, attempt, key, value, *stamp))
                    size += len(value or b"") + len(key or b"")
                    if len(rows) >= MAX_RECORDS or size >= BYTES_PER_BATCH:
                        yield _batch(config, task, rows)
                        rows, size = [], 0
                if rows:
                    yield _batch(config, task, rows)
                held += [(off, attempts.get(off, 0), NO_RECORD) for off in set(offsets) - seen]
            if config.tracking and held:
                offsets_held, attempts_held, reasons = zip(*sorted(held))
                yield held_batch(
                    config.id_namespace,
                    *tp,
                    offsets_held,
                    attempts_held,
                    reasons,
                    include_headers=config.kafka.include_headers,
                )
            finished = True
        finally:
            _return_reader(self.settings, consumer, keep=finished)


#: Idle reading consumers of this Python process by client settings. Spark reuses its
#: Python workers, so a task takes the consumer the worker's previous task used: a new
#: consumer costs its connections and a metadata round trip, and kafka-python then
#: backs off 100 ms (``retry_backoff_ms``) before its first fetch, on every task. An
#: idle consumer sends nothing (kafka-python fetches inside ``poll``) and holds at most
#: the records of its last fetch beyond its task's range, dropped on the next seek.
_IDLE_READERS: dict[str, list[KafkaConsumer]] = {}
_IDLE_LOCK = threading.Lock()


def _pool_key(settings: dict[str, Any]) -> str:
    return repr(sorted(settings.items()))


def _pooled_reader(settings: dict[str, Any]) -> KafkaConsumer:
    with _IDLE_LOCK:
        idle = _IDLE_READERS.get(_pool_key(settings))
        if idle:
            return idle.pop()
    return never_create_topics(KafkaConsumer(group_id=None, **settings))


def _return_reader(settings: dict[str, Any], consumer: KafkaConsumer, keep: bool) -> None:
    """Keep a consumer whose task read to its end for the next task; close any other
    (an error or an abandoned read may leave it in any state)."""
    if keep:
        with _IDLE_LOCK:
            _IDLE_READERS.setdefault(_pool_key(settings), []).append(consumer)
    else:
        consumer.close(autocommit=False)


def _batch(config: SourceConfig, task: ReadTask, rows: list[_Record]) -> pa.RecordBatch:
    offsets, attempts, keys, values, stamps, types, headers = zip(*rows)
    return spout_batch(
        config.id_namespace,
        task.topic,
        task.partition,
        offsets,
        attempts,
        keys,
        values,
        stamps,
        timestamp_types=types,
        headers=headers if config.kafka.include_headers else None,
    )


def _partitions_of(topic: str) -> Callable[[KafkaConsumer], Any]:
    """What :meth:`KafkaUpstream._retried` calls to ask a consumer for ``topic``'s partitions."""
    return lambda consumer: consumer.partitions_for_topic(topic)


def _committed_of(tp: Partition) -> Callable[[KafkaConsumer], Any]:
    """What :meth:`KafkaUpstream._retried` calls to ask for the group's commit of ``tp``."""
    return lambda consumer: consumer.committed(TopicPartition(*tp), metadata=True)
