"""The acks topic of a Kafka channel as a Spark stream, for the acker.

Two sources over the same topic: ``ackstream-channel`` streams the ack records
themselves; a :class:`ShardSource` runs a function over each partition's records of
a batch in the task that reads them and streams what it returns (the acker's one
ledger per shard, :mod:`ackstream.acker.shards`). A shard source's offsets carry the
batch's number and its planning time besides the partitions' positions, so a batch
Spark runs again after a crash passes the function the same of both; each batch
reads every partition that ever held a message, new records or not.

Planning runs beside the driver, ``read()`` on executors; both read through
:mod:`ackstream.channels.messages`' helpers. Planning runs every acker trigger in one
long-lived process, so it keeps one consumer; each ``read()`` makes its own and
closes it (a task's worker process shares nothing with the planner). A message
that is not ack records becomes one null record carrying why, which the acker
reports as ``invalid``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from ackstream.channels.base import ShardRunner
from ackstream.channels.messages import (
    channel_consumer,
    check_not_deleted,
    decode,
    fetch_messages,
    message_ranges,
)
from ackstream.errors import OptionError
from ackstream.kafka.outage import Outage
from ackstream.kafka.settings import client_settings
from ackstream.kafka.topics import TopicListing
from ackstream.vocabulary.records import ACK_RECORD_DDL, ACK_RECORD_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql.streaming.datasource import ReadLimit
    from pyspark.sql.types import StructType

__all__ = ["ChannelSource", "ShardSource"]

#: A reader's Spark offset: ``{"<partition>": next offset}`` (a shard reader's also
#: holds its batch's number and time).
Offset = dict[str, int]

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

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        settings = client_settings(
            {k: v for k, v in self.options.items() if str(k).lower().startswith("kafka.")}
        )
        return _ChannelReader(
            self.options["kafka.bootstrap.servers"], self.options["topic"], settings
        )


class _ChannelReader(DataSourceStreamReader):
    def __init__(self, bootstrap: str, topic: str, settings: dict[str, Any] | None = None) -> None:
        self.bootstrap, self.topic, self.settings = bootstrap, topic, dict(settings or {})
        self._consumer = None  # the planner's, made by the first latestOffset
        self._listing = TopicListing()
        self._outage = Outage(bootstrap)

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_consumer": None, "_listing": TopicListing()}

    def initialOffset(self) -> Offset:
        return {}

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:
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

    def partitions(self, start: Offset, end: Offset) -> list[InputPartition]:
        return [
            MessageRange(int(p), int(start.get(p, 0)), int(e))
            for p, e in sorted(end.items())
            if int(e) > int(start.get(p, 0))
        ]

    def read(  # type: ignore[override]  # ours, from partitions()
        self, partition: MessageRange
    ) -> Iterator[pa.RecordBatch]:
        yield from _records(self, partition).to_batches()

    def commit(self, end: Offset) -> None:
        """Nothing to do: the acker's checkpoint holds its position."""

    def stop(self) -> None:
        """Close the planner's consumer (Spark calls this when the query stops)."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()


def _records(reader: _ChannelReader, partition: MessageRange) -> pa.Table:
    """The ack records of ``partition``'s messages, read on an executor."""
    tables = [ACK_RECORD_SCHEMA.empty_table()]
    if partition.end > partition.start:
        for offset, message in fetch_messages(
            reader.bootstrap,
            reader.topic,
            partition.partition,
            partition.start,
            partition.end,
            settings=reader.settings,
        ):
            table = decode(message, ACK_RECORD_SCHEMA, reader.topic, partition.partition, offset)
            if isinstance(table, str):  # one null record carrying why: the acker reports it
                table = pa.Table.from_pylist([{"reason": table}], schema=ACK_RECORD_SCHEMA)
            tables.append(table)
    return pa.concat_tables(tables)


@dataclass
class ShardRange(MessageRange):
    """One partition's messages of a shard source's batch, with the batch's number and
    planning time."""

    batch: int = 0
    now_ms: int = 0


#: In a shard source's offsets, beside the partitions' positions.
_BATCH, _NOW = "batch", "now"


class ShardSource(ChannelSource):
    """Runs ``run_shard(records, partition, batch, now_ms)`` over each partition's ack
    records of a batch where they are read, and streams the rows it returns (its
    ``ddl``). Options as for ``ackstream-channel``, and ``shards``: the partitions the
    topic must have (a partition beyond them stops the query, naming it)."""

    run_shard: ShardRunner  # set by :meth:`running`, on the class it makes

    @classmethod
    def running(cls, run_shard: ShardRunner, name: str) -> type[ShardSource]:
        """A source class, registered as ``name``, that runs ``run_shard``."""
        return type(
            "ShardSource",
            (cls,),
            {"run_shard": run_shard, "name": classmethod(lambda _: name)},
        )

    def schema(self) -> str:
        return self.run_shard.ddl

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        settings = client_settings(
            {k: v for k, v in self.options.items() if str(k).lower().startswith("kafka.")}
        )
        return _ShardReader(
            self.options["kafka.bootstrap.servers"],
            self.options["topic"],
            settings,
            run_shard=self.run_shard,
            shards=int(self.options["shards"]),
        )


class _ShardReader(_ChannelReader):
    def __init__(
        self,
        bootstrap: str,
        topic: str,
        settings: dict[str, Any],
        *,
        run_shard: ShardRunner,
        shards: int,
    ) -> None:
        super().__init__(bootstrap, topic, settings)
        self.run_shard, self.shards = run_shard, shards

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:
        """The partitions' end offsets, and the next batch's number and time once any
        partition has new messages (the same offsets otherwise: no batch)."""
        positions = {p: e for p, e in start.items() if p not in (_BATCH, _NOW)}
        ends = super().latestOffset(positions, limit)
        beyond = sorted(int(p) for p in ends if int(p) >= self.shards)
        if beyond:
            raise OptionError(
                "ackers",
                self.shards,
                f"the partition count of the acks topic {self.topic!r}, which has partition "
                f"{max(beyond)} now (each partition is one acker shard: were partitions "
                "added while the acker ran?); start the topology and its acker from new "
                f"checkpoints with ackers={max(beyond) + 1}",
            )
        if ends == positions:
            return dict(start)
        return {**ends, _BATCH: int(start.get(_BATCH, -1)) + 1, _NOW: int(time.time() * 1000)}

    def partitions(self, start: Offset, end: Offset) -> list[InputPartition]:
        batch, now_ms = int(end.get(_BATCH, 0)), int(end.get(_NOW, 0))
        return [
            ShardRange(int(p), int(start.get(p, 0)), int(e), batch, now_ms)
            for p, e in sorted(end.items(), key=lambda item: item[0])
            if p not in (_BATCH, _NOW)
        ]

    def read(  # type: ignore[override]  # ours, from partitions()
        self, partition: ShardRange
    ) -> Iterator[tuple[object, ...]]:
        records = _records(self, partition)
        yield self.run_shard(records, partition.partition, partition.batch, partition.now_ms)
