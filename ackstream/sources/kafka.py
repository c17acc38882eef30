"""The Kafka upstream, spoken with kafka-python (the only source module importing it).

Driver side, :class:`KafkaUpstream` lists partitions, asks for earliest/latest
offsets, reads and writes the consumer group's committed offsets (a standalone
commit: ``assign()`` plus a group id, never a group join), and fetches single
records for dead letters. Executor side, :func:`read_task` reads one
:class:`~ackstream.sources.rows.ReadTask` with its own short-lived consumer.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pyarrow as pa
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from ackstream import ids
from ackstream.config import SourceConfig
from ackstream.errors import AckstreamError, EnvironmentProblem, OptionError
from ackstream.kafka_offsets import end_offsets
from ackstream.records import ACKED, COMPLETION_SCHEMA, REJECTED
from ackstream.sources.rows import ReadTask, spout_batch

__all__ = ["KafkaUpstream", "check_upstream", "consumer_settings", "read_task"]

TP = tuple[str, int]

#: A fetch that makes no progress for this long fails the task (names the partition).
FETCH_TIMEOUT_S = 60.0
ROWS_PER_BATCH = 10_000
#: How long the check before a query starts waits for the brokers to answer.
CHECK_TIMEOUT_MS = 10_000
#: Bytes of keys and values per Arrow batch (a binary column holds at most 2 GiB).
BYTES_PER_BATCH = 64 << 20


def consumer_settings(config: SourceConfig) -> dict:
    """kafka-python settings from the ``kafka.*`` options (``kafka.security.protocol`` ->
    ``security_protocol``); an unknown one is an :class:`OptionError`."""
    settings = {"bootstrap_servers": config.bootstrap_servers.split(","),
                "enable_auto_commit": False, "auto_offset_reset": "earliest",
                "client_id": f"ackstream-{config.topology}"}
    for key, value in config.kafka_options:
        name = key.replace(".", "_")
        if name not in KafkaConsumer.DEFAULT_CONFIG or name in ("group_id", "enable_auto_commit"):
            raise OptionError("kafka." + key, value, "a kafka-python consumer setting "
                              "(kafka.<setting with dots>, e.g. kafka.security.protocol)")
        settings[name] = _typed(option="kafka." + key, value=value,
                                default=KafkaConsumer.DEFAULT_CONFIG[name])
    return settings


def _typed(option: str, value: str, default):
    if isinstance(default, bool):
        if value.lower() not in ("true", "false"):
            raise OptionError(option, value, '"true" or "false"')
        return value.lower() == "true"
    if isinstance(default, int):
        try:
            return int(value)
        except ValueError:
            raise OptionError(option, value, "a whole number") from None
    return value


def check_upstream(config: SourceConfig) -> None:
    """Fail before the query starts if the brokers do not answer or a subscribed topic
    does not exist (later, Spark would report it from inside a running query)."""
    from kafka.errors import KafkaError

    servers = config.bootstrap_servers
    settings = {"bootstrap_timeout_ms": CHECK_TIMEOUT_MS, **consumer_settings(config)}
    try:
        consumer = KafkaConsumer(group_id=None, **settings)
    except KafkaError:
        raise EnvironmentProblem(
            f"no Kafka broker answers at {servers} (option kafka.bootstrap.servers) within "
            f"{settings['bootstrap_timeout_ms'] / 1000:g} s",
            "Start the broker, or give the host:port it listens on.") from None
    try:
        missing = [t for t in config.topics if not consumer.partitions_for_topic(t)]
    except KafkaError as problem:
        raise EnvironmentProblem(f"the Kafka broker at {servers} did not answer: {problem}",
                                 "Check that it is up and reachable from here.") from None
    finally:
        consumer.close(autocommit=False)
    if missing:
        raise EnvironmentProblem(
            f"topic(s) {', '.join(missing)} (option subscribe) do not exist on {servers}",
            "Create them first, or fix the name.")


class KafkaUpstream:
    """Driver-side access to the subscribed topics and the consumer group."""

    def __init__(self, config: SourceConfig):
        self.config = config
        self._consumer = KafkaConsumer(group_id=config.group_id, **consumer_settings(config))

    def partitions(self) -> list[TP]:
        out = []
        for topic in self.config.topics:
            parts = self._consumer.partitions_for_topic(topic)
            if not parts:
                raise AckstreamError(f"topic {topic!r} (option 'subscribe') does not exist on "
                                     f"{self.config.bootstrap_servers}: create it first")
            out += [(topic, p) for p in sorted(parts)]
        return out

    def earliest(self, tps: list[TP]) -> dict[TP, int]:
        got = self._consumer.beginning_offsets([TopicPartition(*tp) for tp in tps])
        return {(k.topic, k.partition): v for k, v in got.items()}

    def latest(self, tps: list[TP]) -> dict[TP, int]:
        """The next offset to be written per partition (see ``ackstream.kafka_offsets``)."""
        got = end_offsets(self._consumer, [TopicPartition(*tp) for tp in tps])
        return {(part.topic, part.partition): end for part, end in got.items()}

    def committed(self, tps: list[TP]) -> dict[TP, tuple[int, str]]:
        """The group's committed offset and metadata per partition (absent: no commit)."""
        out = {}
        for tp in tps:
            got = self._consumer.committed(TopicPartition(*tp), metadata=True)
            if got is not None and got.offset is not None and got.offset >= 0:
                out[tp] = (got.offset, got.metadata or "")
        return out

    def commit(self, offsets: dict[TP, tuple[int, str]]) -> None:
        if offsets:
            self._consumer.commit({TopicPartition(*tp): OffsetAndMetadata(off, meta, -1)
                                   for tp, (off, meta) in offsets.items()})

    def fetch(self, coords: list[tuple[TP, int]]) -> dict[tuple[TP, int], tuple]:
        """``(key, value, timestamp_ms)`` of single records (for dead letters)."""
        by_tp: dict[TP, list[int]] = {}
        for tp, off in coords:
            by_tp.setdefault(tp, []).append(off)
        out = {}
        for tp, offsets in by_tp.items():
            for off, rec in _fetch(self._consumer, tp, sorted(set(offsets))).items():
                out[(tp, off)] = rec
        return out

    def close(self) -> None:
        self._consumer.close(autocommit=False)


def read_task(config: SourceConfig, task: ReadTask) -> Iterator:
    """Arrow batches of one task: the range at attempt 0, then the replays.

    Batches are bounded by rows and bytes (an Arrow binary column holds at most
    2 GiB). With tracking on, two kinds of offset never reach the bolts, and the
    task reports their outcome itself to the completion channel: a record whose
    value is over ``ackstream.maxValueBytes`` is rejected (dead-lettered at once),
    and an offset with no record (a compacted topic, a transaction marker) is
    acked, so neither holds its partition's commit back. A topology that settles
    the batch's roots from its offset reports those roots acked later; the source
    lets a rejection win over an ack (see ``Tracker.complete``).
    """
    consumer = KafkaConsumer(group_id=None, **consumer_settings(config))
    tp = (task.topic, task.partition)
    skipped = _Skipped(config, tp)
    try:
        passes = [(list(range(task.start, task.end)), {}), ([o for o, _ in task.replays],
                                                            dict(task.replays))]
        for offsets, attempts in passes:
            rows, size, seen = [], 0, set()
            for offset, key, value, ts in _records(consumer, tp, sorted(offsets),
                                                   config.fail_on_data_loss):
                seen.add(offset)
                attempt = attempts.get(offset, 0)
                if config.tracking and value is not None and len(value) > config.max_value_bytes:
                    skipped.reject(offset, attempt, len(value))
                    continue
                rows.append((offset, attempt, key, value, ts))
                size += len(value or b"") + len(key or b"")
                if len(rows) >= ROWS_PER_BATCH or size >= BYTES_PER_BATCH:
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
        self.config, self.tp, self.rows = config, tp, []

    def reject(self, offset: int, attempt: int, size: int) -> None:
        self._add(offset, attempt, REJECTED,
                  f"value of {size} bytes is over ackstream.maxValueBytes "
                  f"({self.config.max_value_bytes}); raise that option to process it")

    def gap(self, offset: int, attempt: int) -> None:
        self._add(offset, attempt, ACKED, None)  # nothing to process

    def _add(self, offset, attempt, status, reason) -> None:
        self.rows.append({"status": status, "topic": self.tp[0], "partition": self.tp[1],
                          "offset": offset, "attempt": attempt, "latency_ms": 0,
                          "completed_ms": int(time.time() * 1000), "reason": reason})

    def write(self) -> None:
        if not self.rows:
            return
        from ackstream.sinks.channel import open_channel

        table = pa.Table.from_pylist(self.rows, schema=COMPLETION_SCHEMA)
        roots = ids.root_ids(self.config.topology, self.tp[0], self.tp[1],
                             table.column("offset").to_numpy(), table.column("attempt").to_numpy())
        channel = open_channel(self.config)
        try:
            channel.write_completions(table.set_column(0, "root", pa.array(roots, pa.int64())))
        finally:
            channel.close()


def _batch(config, task, rows):
    offsets, attempts, keys, values, stamps = zip(*rows)
    return spout_batch(config.topology, task.topic, task.partition, offsets, attempts, keys,
                       values, stamps)


def _fetch(consumer, tp: TP, offsets: list[int], fail_on_data_loss: bool = True) -> dict:
    """Records at the given sorted offsets of ``tp``: ``{offset: (key, value, ts_ms)}``."""
    return {off: (key, value, ts) for off, key, value, ts in
            _records(consumer, tp, offsets, fail_on_data_loss)}


def _records(consumer, tp: TP, offsets: list[int], fail_on_data_loss: bool = True):
    """``(offset, key, value, ts_ms)`` of the records at the given sorted offsets of
    ``tp``, in order, as they arrive.

    Reads each run of consecutive offsets with one seek. Offsets with no record (a
    compacted topic, transaction markers) are simply absent; records deleted by
    retention raise when ``fail_on_data_loss``.
    """
    if not offsets:
        return
    part = TopicPartition(*tp)
    consumer.assign([part])
    runs = []
    for off in offsets:
        if runs and runs[-1][1] == off:
            runs[-1][1] = off + 1
        else:
            runs.append([off, off + 1])
    wanted = set(offsets)
    for start, end in runs:
        consumer.seek(part, start)
        deadline = time.monotonic() + FETCH_TIMEOUT_S
        first = None
        while consumer.position(part) < end:
            polled = consumer.poll(timeout_ms=500, max_records=ROWS_PER_BATCH)
            progressed = False
            for rec in polled.get(part, ()):
                progressed = True
                if rec.offset in wanted and start <= rec.offset < end:
                    first = rec.offset if first is None else first
                    yield rec.offset, rec.key, rec.value, rec.timestamp
            if progressed:
                deadline = time.monotonic() + FETCH_TIMEOUT_S
            elif time.monotonic() > deadline:
                raise AckstreamError(f"no progress reading {tp[0]}[{tp[1]}] offsets "
                                     f"{start}..{end - 1} for {FETCH_TIMEOUT_S:.0f}s; is the "
                                     "broker up and the offset still retained?")
        if fail_on_data_loss and (first is None or first > start) and \
                consumer.beginning_offsets([part])[part] > start:
            raise AckstreamError(
                f"{tp[0]}[{tp[1]}] offset {start} was deleted by retention before it was "
                "read (data loss); set failOnDataLoss=false to skip such records")
