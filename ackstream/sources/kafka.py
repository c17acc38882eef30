"""The Kafka upstream, spoken with kafka-python through :mod:`ackstream.kafka`.

Driver side, :class:`KafkaUpstream` lists partitions, asks for earliest/latest
offsets, reads and writes the consumer group's committed offsets (a standalone
commit: ``assign()`` plus a group id, never a group join), and fetches single
records for dead letters. Executor side, :meth:`KafkaUpstream.read` reads one
:class:`~ackstream.sources.rows.ReadTask` with its own short-lived consumer.

A driver-side call that fails with a Kafka error (a broker lost, a leader moved: the
consumer may wait out a whole request timeout on a dead connection) is tried again
with a new consumer, as Spark's Kafka source does (``fetchOffset.numRetries``), so
that one lost broker costs the planner a pause, not the query.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from ackstream import ids
from ackstream.channels import open_channel
from ackstream.clock import now_ms
from ackstream.config import SourceConfig
from ackstream.errors import AckstreamError, EnvironmentProblem
from ackstream.kafka.offsets import end_offsets
from ackstream.kafka.reading import MAX_RECORDS, read_ranges
from ackstream.kafka.settings import consumer_settings
from ackstream.records import ACKED, REJECTED, completion_table
from ackstream.sources.rows import TP, ReadTask, spout_batch
from ackstream.sources.tracking import ranges

__all__ = ["KafkaUpstream"]

log = logging.getLogger(__name__)

#: How long the check before a query starts waits for the brokers to answer.
CHECK_TIMEOUT_MS = 10_000
#: Bytes of keys and values per Arrow batch (a binary column holds at most 2 GiB).
BYTES_PER_BATCH = 64 << 20
#: Attempts at a driver-side broker call, each with a new consumer, before the query
#: fails; and the pause between two (Spark's Kafka source: 3 attempts, 1 s apart).
ATTEMPTS = 3
RETRY_PAUSE_S = 1.0


class KafkaUpstream:
    """The subscribed topics and the consumer group (see the module doc)."""

    def __init__(self, config: SourceConfig):
        self.config = config
        self.settings = consumer_settings(config)  # an unknown kafka.* option fails here
        self._client = None

    @property
    def _consumer(self):
        """The driver's consumer with the group id, made on first use (executors that
        only ``read`` never make one)."""
        if self._client is None:
            self._client = KafkaConsumer(group_id=self.config.group_id, **self.settings)
        return self._client

    def _retried(self, what: str, call: Callable[[KafkaConsumer], object]):
        """``call(consumer)``; after a Kafka error, again with a new consumer, up to
        ``ATTEMPTS`` times in all."""
        from kafka.errors import KafkaError

        for attempt in range(1, ATTEMPTS + 1):
            try:
                return call(self._consumer)
            except KafkaError as error:
                self.close()
                if attempt == ATTEMPTS:
                    raise EnvironmentProblem(
                        f"the Kafka brokers at {self.config.bootstrap_servers} did not "
                        f"answer ({what}) in {ATTEMPTS} attempts: {error!r}",
                        "Check that the brokers are up; a slow cluster may need a larger "
                        "kafka.request.timeout.ms.",
                    ) from error
                log.warning("%s failed (attempt %d of %d): %r", what, attempt, ATTEMPTS, error)
                time.sleep(RETRY_PAUSE_S)

    def check(self) -> None:
        """Fail before the query starts if the brokers do not answer or a subscribed topic
        does not exist (later, Spark would report it from inside a running query). The
        check is bounded: a broker that holds the connection without answering (a
        listener speaking another security protocol can) fails it like a silent one."""
        outcome: list = []
        probe = threading.Thread(target=self._probe, args=(outcome,), daemon=True)
        probe.start()
        probe.join(CHECK_TIMEOUT_MS / 1000 + 5)
        if not outcome:  # the probe hangs on: leave it, it holds nothing of ours
            raise self._silent()
        if outcome[0] is not None:
            raise outcome[0]

    def _probe(self, outcome: list) -> None:
        from kafka.errors import KafkaError

        config, problem = self.config, None
        settings = {"bootstrap_timeout_ms": CHECK_TIMEOUT_MS, **self.settings}
        try:
            consumer = KafkaConsumer(group_id=None, **settings)
        except KafkaError:
            outcome.append(self._silent())
            return
        try:
            missing = [t for t in config.topics if not consumer.partitions_for_topic(t)]
            if missing:
                problem = EnvironmentProblem(
                    f"topic(s) {', '.join(missing)} (option subscribe) do not exist on "
                    f"{config.bootstrap_servers}",
                    "Create them first, or fix the name.",
                )
        except KafkaError as error:
            problem = EnvironmentProblem(
                f"the Kafka broker at {config.bootstrap_servers} did not answer: {error}",
                "Check that it is up and reachable from here.",
            )
        finally:
            consumer.close(autocommit=False)
        outcome.append(problem)

    def _silent(self) -> EnvironmentProblem:
        protocol = dict(self.config.kafka_options).get("security.protocol", "PLAINTEXT")
        return EnvironmentProblem(
            f"no Kafka broker answers at {self.config.bootstrap_servers} (option "
            f"kafka.bootstrap.servers) with kafka.security.protocol={protocol} within "
            f"{CHECK_TIMEOUT_MS / 1000:g} s",
            "Start the broker, or give the host:port it listens on"
            + (
                ", or the security protocol its listener speaks."
                if protocol != "PLAINTEXT"
                else "."
            ),
        )

    def partitions(self) -> list[TP]:
        out = []
        for topic in self.config.topics:
            parts = self._retried(
                f"partitions of {topic}", lambda consumer, t=topic: consumer.partitions_for_topic(t)
            )
            if not parts:
                raise AckstreamError(
                    f"topic {topic!r} (option 'subscribe') does not exist on "
                    f"{self.config.bootstrap_servers}: create it first"
                )
            out += [(topic, p) for p in sorted(parts)]
        return out

    def earliest(self, tps: list[TP]) -> dict[TP, int]:
        parts = [TopicPartition(*tp) for tp in tps]
        got = self._retried("earliest offsets", lambda consumer: consumer.beginning_offsets(parts))
        return {(k.topic, k.partition): v for k, v in got.items()}

    def latest(self, tps: list[TP], positions: dict[TP, int] | None = None) -> dict[TP, int]:
        """The next offset to be written per partition (see ``ackstream.kafka.offsets``)."""
        parts = [TopicPartition(*tp) for tp in tps]
        got = self._retried("latest offsets", lambda consumer: end_offsets(consumer, parts))
        return {(part.topic, part.partition): end for part, end in got.items()}

    def committed(self, tps: list[TP]) -> dict[TP, tuple[int, str]]:
        """The group's committed offset and metadata per partition (absent: no commit)."""
        out = {}
        for tp in tps:
            got = self._retried(
                f"the group's committed offset of {tp[0]}[{tp[1]}]",
                lambda consumer, tp=tp: consumer.committed(TopicPartition(*tp), metadata=True),
            )
            if got is not None and got.offset is not None and got.offset >= 0:
                out[tp] = (got.offset, got.metadata or "")
        return out

    def commit(self, offsets: dict[TP, tuple[int, str]]) -> None:
        if offsets:
            commits = {
                TopicPartition(*tp): OffsetAndMetadata(off, meta, -1)
                for tp, (off, meta) in offsets.items()
            }
            self._retried("a commit", lambda consumer: consumer.commit(commits))

    def fetch(self, coords: list[tuple[TP, int]]) -> dict[tuple[TP, int], tuple]:
        """``(key, value, timestamp_ms)`` of single records (for dead letters)."""
        by_tp: dict[TP, list[int]] = {}
        for tp, off in coords:
            by_tp.setdefault(tp, []).append(off)
        out = {}
        for tp, offsets in by_tp.items():
            for off, key, value, ts in read_ranges(
                self._consumer, tp, ranges(offsets), fail_on_data_loss=False
            ):
                out[(tp, off)] = (key, value, ts)
        return out

    def close(self) -> None:
        if self._client is not None:
            self._client.close(autocommit=False)
            self._client = None

    def read(self, task: ReadTask) -> Iterator:
        """Arrow batches of one task: the range at attempt 0, then the replays.

        Batches are bounded by rows and bytes (an Arrow binary column holds at most
        2 GiB). With tracking on, two kinds of offset never reach the bolts, and the
        task reports their outcome itself to the completion channel: a record whose
        value is over ``ackstream.maxValueBytes`` is rejected (dead-lettered at once),
        and an offset with no record (a compacted topic, a transaction marker) is
        acked, so neither holds its partition's commit back. A topology that settles
        the batch's roots from its offset reports those roots acked later; the source
        lets a rejection win over an ack (see ``records.one_outcome_per_root``).
        """
        config = self.config
        consumer = KafkaConsumer(group_id=None, **self.settings)
        tp = (task.topic, task.partition)
        skipped = _Skipped(config, tp)
        try:
            replayed = dict(task.replays)
            passes = [
                ([(task.start, task.end)], range(task.start, task.end), {}),
                (ranges(replayed), replayed, replayed),
            ]
            for spans, offsets, attempts in passes:
                rows, size, seen = [], 0, set()
                for offset, key, value, ts in read_ranges(
                    consumer, tp, spans, fail_on_data_loss=config.fail_on_data_loss
                ):
                    seen.add(offset)
                    attempt = attempts.get(offset, 0)
                    if (
                        config.tracking
                        and value is not None
                        and len(value) > config.max_value_bytes
                    ):
                        skipped.reject(offset, attempt, len(value))
                        continue
                    rows.append((offset, attempt, key, value, ts))
                    size += len(value or b"") + len(key or b"")
                    if len(rows) >= MAX_RECORDS or size >= BYTES_PER_BATCH:
                        yield _batch(config, task, rows)
                        rows, size = [], 0
                if rows:
                    yield _batch(config, task, rows)
                for offset in set(offsets) - seen:
                    skipped.gap(offset, attempts.get(offset, 0))
            if config.tracking:
                skipped.write()
        finally:
            consumer.close(autocommit=False)


class _Skipped:
    """Offsets of one task that never reach the bolts, and their completions."""

    def __init__(self, config: SourceConfig, tp: TP):
        self.config, self.tp = config, tp
        self.offsets, self.attempts, self.statuses, self.reasons = [], [], [], []

    def reject(self, offset: int, attempt: int, size: int) -> None:
        self._add(
            offset,
            attempt,
            REJECTED,
            f"value of {size} bytes is over ackstream.maxValueBytes "
            f"({self.config.max_value_bytes}); raise that option to process it",
        )

    def gap(self, offset: int, attempt: int) -> None:
        self._add(offset, attempt, ACKED, None)  # nothing to process

    def _add(self, offset, attempt, status, reason) -> None:
        self.offsets.append(offset)
        self.attempts.append(attempt)
        self.statuses.append(status)
        self.reasons.append(reason)

    def write(self) -> None:
        if not self.offsets:
            return
        topic, partition = self.tp
        roots = ids.root_ids(self.config.topology, topic, partition, self.offsets, self.attempts)
        table = completion_table(
            roots,
            self.statuses,
            topic=topic,
            partition=partition,
            offset=self.offsets,
            attempt=self.attempts,
            latency_ms=0,
            completed_ms=now_ms(),
            reason=self.reasons,
        )
        channel = open_channel(self.config)
        try:
            channel.write_completions(table)
        finally:
            channel.close()


def _batch(config, task, rows):
    offsets, attempts, keys, values, stamps = zip(*rows)
    return spout_batch(
        config.topology, task.topic, task.partition, offsets, attempts, keys, values, stamps
    )
