"""``ackstream-channel``: the acks topic of a Kafka channel as a Spark stream, for the acker.

Planning runs beside the driver, ``read()`` on executors; both read through
:mod:`ackstream.channels.kafka`'s helpers. Planning runs every acker trigger in one
long-lived process, so it keeps one consumer; each ``read()`` makes its own and
closes it (a task's worker process shares nothing with the planner). A message
that is not ack records becomes one null record carrying why, which the acker
reports as ``invalid``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from ackstream.channels.messages import (
    channel_consumer,
    check_not_deleted,
    decode,
    fetch_messages,
    message_ranges,
)
from ackstream.kafka.outage import Outage
from ackstream.kafka.settings import client_settings
from ackstream.kafka.topics import TopicListing
from ackstream.records import ACK_RECORD_DDL, ACK_RECORD_SCHEMA

__all__ = ["ChannelSource"]

log = logging.getLogger(__name__)


@dataclass
class MessageRange(InputPartition):
    """Messages ``[start, end)`` of one partition of the acks topic."""

    partition: int
    start: int
    end: int


class ChannelSource(DataSource):
    """Streams ack records from a channel topic (options: kafka.bootstrap.servers, topic,
    and the channel's other ``kafka.*`` client settings, security included)."""

    @classmethod
    def name(cls) -> str:
        return "ackstream-channel"

    def schema(self) -> str:
        return ACK_RECORD_DDL

    def streamReader(self, schema):
        settings = client_settings(
            {k: v for k, v in self.options.items() if str(k).lower().startswith("kafka.")}
        )
        return _ChannelReader(
            self.options["kafka.bootstrap.servers"], self.options["topic"], settings
        )


class _ChannelReader(DataSourceStreamReader):
    def __init__(self, bootstrap: str, topic: str, settings: dict | None = None):
        self.bootstrap, self.topic, self.settings = bootstrap, topic, dict(settings or {})
        self._consumer = None  # the planner's, made by the first latestOffset
        self._listing = TopicListing()
        self._outage = Outage(bootstrap)

    def __getstate__(self):
        return {**self.__dict__, "_consumer": None, "_listing": TopicListing()}

    def initialOffset(self) -> dict:
        return {}

    def latestOffset(self, start: dict, limit) -> dict:
        """The acks topic's end offsets. While the brokers do not answer (a lost leader,
        a stall), the acker sees no new acks rather than dying: each trigger tries a
        fresh client, and only an outage longer than ``OUTAGE_LIMIT_S`` fails it
        (:class:`~ackstream.kafka.outage.Outage`). The topic deleted fails it at once."""
        from kafka.errors import KafkaError

        try:
            if self._consumer is None:
                self._consumer = channel_consumer(self.bootstrap, self.settings)
            check_not_deleted(self.bootstrap, self.topic, self._consumer, self._listing)
            ranges = message_ranges(self.bootstrap, self.topic, start, consumer=self._consumer)
        except KafkaError as error:
            self._listing.forget()
            check_not_deleted(self.bootstrap, self.topic, self._consumer, self._listing)
            self.stop()  # the next trigger starts from a fresh client
            self._outage.failed(f"the acks topic {self.topic!r}", error)
            return dict(start)
        except Exception:
            self.stop()
            raise
        self._outage.answered()
        ends = dict(start)
        for partition, _, end in ranges:
            ends[str(partition)] = end
        return ends

    def partitions(self, start: dict, end: dict):
        return [
            MessageRange(int(p), int(start.get(p, 0)), int(e))
            for p, e in sorted(end.items())
            if int(e) > int(start.get(p, 0))
        ]

    def read(self, partition: MessageRange):  # type: ignore[override]  # ours, from partitions()
        for offset, message in fetch_messages(
            self.bootstrap,
            self.topic,
            partition.partition,
            partition.start,
            partition.end,
            settings=self.settings,
        ):
            table = decode(message, ACK_RECORD_SCHEMA, self.topic, partition.partition, offset)
            if isinstance(table, str):  # one null record carrying why: the acker reports it
                table = pa.Table.from_pylist([{"reason": table}], schema=ACK_RECORD_SCHEMA)
            yield from table.to_batches()

    def commit(self, end: dict) -> None:
        """Nothing to do: the acker's checkpoint holds its position."""

    def stop(self) -> None:
        """Close the planner's consumer (Spark calls this when the query stops)."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()
