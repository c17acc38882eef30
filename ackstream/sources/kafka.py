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

from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from ackstream.config import SourceConfig
from ackstream.errors import AckstreamError, OptionError
from ackstream.sources.rows import ReadTask, spout_batch

__all__ = ["KafkaUpstream", "consumer_settings", "read_task"]

TP = tuple[str, int]

#: A fetch that makes no progress for this long fails the task (names the partition).
FETCH_TIMEOUT_S = 60.0
ROWS_PER_BATCH = 10_000


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
        """The next offset to be written per partition.

        Some brokers (Tansu, seen here) answer ListOffsets with the base offset of the
        last record batch + 1, not the last offset + 1; so the last batch is fetched
        and its true end taken (on Kafka this confirms the answer).
        """
        got = self._consumer.end_offsets([TopicPartition(*tp) for tp in tps])
        out = {}
        for part, end in got.items():
            if end > 0:
                self._consumer.assign([part])
                self._consumer.seek(part, end - 1)
                records = self._consumer.poll(timeout_ms=1000, max_records=ROWS_PER_BATCH)
                end = max([end] + [r.offset + 1 for r in records.get(part, ())])
            out[(part.topic, part.partition)] = end
        return out

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
    """Arrow batches of one task: the range at attempt 0, then the replays."""
    consumer = KafkaConsumer(group_id=None, **consumer_settings(config))
    tp = (task.topic, task.partition)
    try:
        wanted = list(range(task.start, task.end))
        for chunk in range(0, len(wanted), ROWS_PER_BATCH):
            part = wanted[chunk: chunk + ROWS_PER_BATCH]
            got = _fetch(consumer, tp, part, config.fail_on_data_loss)
            yield _batch(config, task, got, [(o, 0) for o in part])
        if task.replays:
            offsets = sorted({o for o, _ in task.replays})
            got = _fetch(consumer, tp, offsets, config.fail_on_data_loss)
            yield _batch(config, task, got, sorted(task.replays))
    finally:
        consumer.close(autocommit=False)


def _batch(config, task, got, pairs):
    pairs = [(o, a) for o, a in pairs if o in got]
    return spout_batch(
        config.topology, task.topic, task.partition, [o for o, _ in pairs],
        [a for _, a in pairs], [got[o][0] for o, _ in pairs], [got[o][1] for o, _ in pairs],
        [got[o][2] for o, _ in pairs],
    )


def _fetch(consumer, tp: TP, offsets: list[int], fail_on_data_loss: bool = True) -> dict:
    """Records at the given sorted offsets of ``tp``: ``{offset: (key, value, ts_ms)}``.

    Reads each run of consecutive offsets with one seek. Offsets with no record (a
    compacted topic, transaction markers) are simply absent; records deleted by
    retention raise when ``fail_on_data_loss``.
    """
    if not offsets:
        return {}
    part = TopicPartition(*tp)
    consumer.assign([part])
    runs, out = [], {}
    for off in offsets:
        if runs and runs[-1][1] == off:
            runs[-1][1] = off + 1
        else:
            runs.append([off, off + 1])
    wanted = set(offsets)
    for start, end in runs:
        consumer.seek(part, start)
        deadline = time.monotonic() + FETCH_TIMEOUT_S
        while consumer.position(part) < end:
            polled = consumer.poll(timeout_ms=500, max_records=ROWS_PER_BATCH)
            progressed = False
            for rec in polled.get(part, ()):
                progressed = True
                if rec.offset in wanted:
                    out[rec.offset] = (rec.key, rec.value, rec.timestamp)
            if progressed:
                deadline = time.monotonic() + FETCH_TIMEOUT_S
            elif time.monotonic() > deadline:
                raise AckstreamError(f"no progress reading {tp[0]}[{tp[1]}] offsets "
                                     f"{start}..{end - 1} for {FETCH_TIMEOUT_S:.0f}s; is the "
                                     "broker up and the offset still retained?")
        first = min((o for o in out if start <= o < end), default=None)
        if fail_on_data_loss and (first is None or first > start) and \
                consumer.beginning_offsets([part])[part] > start:
            raise AckstreamError(
                f"{tp[0]}[{tp[1]}] offset {start} was deleted by retention before it was "
                "read (data loss); set failOnDataLoss=false to skip such records")
    return out
