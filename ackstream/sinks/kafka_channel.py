"""The ack channel and the completion channel, Kafka transport.

Two topics per topology, ``<topology>.acks`` and ``<topology>.done``. Each Kafka
message carries a slice of records as one Arrow IPC stream (ack records or
completions), so a batch of a hundred thousand roots is a handful of messages,
and any process with kafka-python and pyarrow can write ack records.

The acker query reads the acks topic through a small Python data source,
``ackstream-channel``, registered on first use. Completions are produced from
the acker's ``foreachBatch`` and from topology batches (the trees they settle
themselves), on the driver, keyed by batch id; a batch re-run after a crash may
produce its completions twice, which the source ignores (a root it no longer
tracks is not acted on).
"""

from __future__ import annotations

import io
import logging
import threading

import pandas as pd
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from ackstream.kafka_offsets import end_offsets
from ackstream.records import ACK_RECORD_DDL, ACK_RECORD_SCHEMA, COMPLETION_SCHEMA, as_table

__all__ = ["ChannelSource", "KafkaChannel"]

log = logging.getLogger(__name__)

#: A topology's batches and its acker's write through one channel from two threads.
_PRODUCER_LOCK = threading.Lock()
#: Records per Kafka message: stays well under the broker's 1 MB default message size.
ROWS_PER_MESSAGE = 10_000


class KafkaChannel:
    """Ack and completion channels of ``topology`` on the broker at ``bootstrap``."""

    def __init__(self, bootstrap: str, topology: str, partitions: int = 2):
        self.bootstrap, self.topology, self.partitions = bootstrap, topology, partitions
        self.acks_topic, self.done_topic = f"{topology}.acks", f"{topology}.done"
        self._producer = None

    def __getstate__(self):
        return {**self.__dict__, "_producer": None}

    def prepare(self) -> None:
        """Create both topics if they do not exist yet."""
        from kafka.admin import KafkaAdminClient, NewTopic
        from kafka.errors import TopicAlreadyExistsError

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="ackstream")
        try:
            existing = set(admin.list_topics())
            wanted = [NewTopic(t, self.partitions, 1) for t in (self.acks_topic, self.done_topic)
                      if t not in existing]
            if wanted:
                try:
                    admin.create_topics(wanted)
                except TopicAlreadyExistsError:
                    pass
        finally:
            admin.close()

    # --- ack records ------------------------------------------------------------

    def write_acks(self, records: pa.Table | pd.DataFrame) -> None:
        """Append ack records; returns once the broker confirmed every message."""
        self._send(self.acks_topic, as_table(records, ACK_RECORD_SCHEMA), key=None)

    def ack_stream(self, spark, max_files_per_trigger: int | None = None):
        """The ack records as a streaming DataFrame, for the acker query."""
        spark.dataSource.register(ChannelSource)
        return (
            spark.readStream.format(ChannelSource.name())
            .option("kafka.bootstrap.servers", self.bootstrap)
            .option("topic", self.acks_topic)
            .load()
        )

    # --- completions ------------------------------------------------------------

    def write_completions(self, table: pa.Table, batch_id: int | None = None) -> None:
        """Produce completions; a query's batch keys them by its batch id."""
        if table.num_rows:
            key = None if batch_id is None else b"%d" % batch_id
            self._send(self.done_topic, as_table(table, COMPLETION_SCHEMA), key=key)

    def completions_since(self, position: dict | None = None) -> tuple[pa.Table, dict]:
        """Completions after ``position`` ({partition: next offset}) and the new position."""
        position = dict(position or {})
        tables = []
        for partition, start, end in _ranges(self.bootstrap, self.done_topic, position):
            for offset, message in _fetch(self.bootstrap, self.done_topic, partition, start, end):
                table = _decode(message, COMPLETION_SCHEMA, self.done_topic, partition, offset)
                tables += [table] if isinstance(table, pa.Table) else []
            position[str(partition)] = end
        table = pa.concat_tables(tables) if tables else COMPLETION_SCHEMA.empty_table()
        return table, position

    def end_position(self) -> dict:
        """The position after every completion written so far (see LocalChannel)."""
        position: dict = {}
        for partition, _, end in _ranges(self.bootstrap, self.done_topic, {}):
            position[str(partition)] = end
        return position

    # --- plumbing ---------------------------------------------------------------

    def _send(self, topic: str, table: pa.Table, key: bytes | None) -> None:
        with _PRODUCER_LOCK:
            if self._producer is None:
                from kafka import KafkaProducer

                self._producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks="all",
                                               linger_ms=5, max_request_size=8 << 20)
        futures = [self._producer.send(topic, key=key, value=_encode(piece))
                   for piece in table.to_batches(max_chunksize=ROWS_PER_MESSAGE)]
        self._producer.flush()
        for future in futures:
            future.get(timeout=30)  # raise if the broker did not take a message

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None


def _encode(batch: pa.RecordBatch) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def _decode(message, schema: pa.Schema, topic: str, partition: int, offset: int):
    """The records of one message, or a reason string when it is not an Arrow IPC
    stream of ``schema``: a foreign or corrupt message is reported, never fatal."""
    try:
        return as_table(pa.ipc.open_stream(message).read_all(), schema)
    except (pa.ArrowException, KeyError, TypeError, ValueError) as problem:
        what = "ack" if "kind" in schema.names else "completion"
        reason = f"message {topic}[{partition}]@{offset} is not {what} records: {problem}"
        log.warning("ackstream: skipped %s", reason)
        return reason



def _ranges(bootstrap: str, topic: str, position: dict):
    """(partition, start, end) for each partition of ``topic`` with messages past ``position``."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        ends = end_offsets(consumer, partitions) if partitions else {}
        starts = consumer.beginning_offsets(partitions) if partitions else {}
    finally:
        consumer.close()
    for tp in sorted(partitions, key=lambda tp: tp.partition):
        start = max(int(position.get(str(tp.partition), 0)), starts[tp])
        if ends[tp] > start:
            yield tp.partition, start, ends[tp]


def _fetch(bootstrap: str, topic: str, partition: int, start: int, end: int):
    """The values of messages ``start`` (inclusive) to ``end`` (exclusive) of one partition.

    Messages are decoded by the caller; ``(offset, value)`` pairs keep the offset
    for error reports."""
    from kafka import KafkaConsumer, TopicPartition

    tp = TopicPartition(topic, partition)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             max_partition_fetch_bytes=16 << 20, fetch_max_bytes=64 << 20)
    values: list[tuple[int, bytes]] = []
    try:
        consumer.assign([tp])
        consumer.seek(tp, start)
        while consumer.position(tp) < end:
            for record in consumer.poll(timeout_ms=1000).get(tp, ()):
                if record.offset < end:
                    values.append((record.offset, record.value))
    finally:
        consumer.close()
    return values


class _Range(InputPartition):
    def __init__(self, partition: int, start: int, end: int):
        self.partition, self.start, self.end = partition, start, end


class ChannelSource(DataSource):
    """Streams ack records from a channel topic (options: kafka.bootstrap.servers, topic)."""

    @classmethod
    def name(cls) -> str:
        return "ackstream-channel"

    def schema(self) -> str:
        return ACK_RECORD_DDL

    def streamReader(self, schema):
        return _ChannelReader(self.options["kafka.bootstrap.servers"], self.options["topic"])


class _ChannelReader(DataSourceStreamReader):
    def __init__(self, bootstrap: str, topic: str):
        self.bootstrap, self.topic = bootstrap, topic

    def initialOffset(self) -> dict:
        return {}

    def latestOffset(self, start: dict, limit) -> dict:
        ends = dict(start)
        for partition, _, end in _ranges(self.bootstrap, self.topic, start):
            ends[str(partition)] = end
        return ends

    def partitions(self, start: dict, end: dict):
        return [_Range(int(p), int(start.get(p, 0)), int(e)) for p, e in sorted(end.items())
                if int(e) > int(start.get(p, 0))]

    def read(self, partition: _Range):
        for offset, message in _fetch(self.bootstrap, self.topic, partition.partition,
                                      partition.start, partition.end):
            table = _decode(message, ACK_RECORD_SCHEMA, self.topic, partition.partition, offset)
            if isinstance(table, str):  # one null record carrying why: the acker reports it
                table = pa.Table.from_pylist([{"reason": table}], schema=ACK_RECORD_SCHEMA)
            yield from table.to_batches()

    def commit(self, end: dict) -> None:
        """Nothing to do: the acker's checkpoint holds its position."""
