"""Channel messages on Kafka: Arrow IPC streams of records, read by offset range.

Shared by the Kafka channel (on the driver) and the acks topic's Spark source
(:mod:`ackstream.channels.ack_source`, on the planner and the executors).
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ackstream.errors import EnvironmentProblem
from ackstream.kafka.offsets import end_offsets
from ackstream.kafka.reading import read_ranges, topic_ranges
from ackstream.kafka.settings import client_settings
from ackstream.kafka.topics import TopicListing, deleted_topics, never_create_topics
from ackstream.vocabulary.records import as_table

if TYPE_CHECKING:
    from kafka import KafkaConsumer

__all__ = [
    "MESSAGE_BYTES",
    "MessageTooLarge",
    "channel_consumer",
    "check_not_deleted",
    "decode",
    "encode",
    "encode_within",
    "fetch_messages",
    "message_ranges",
]

log = logging.getLogger(__name__)


#: Bytes of one channel message at most, unless the topic's brokers refuse that size:
#: under Kafka's default ``max.message.bytes`` (1 MiB), with room for the record
#: batch's own framing. No batch is too big for a channel: its records are split.
MESSAGE_BYTES = 900 << 10
#: Arrow's buffer compression for a message that would not fit plain: ack records
#: (random ids) gain little, completions and reasons (the same text many times) much.
_PACKED = pa.ipc.IpcWriteOptions(compression="zstd")


def encode(
    batch: pa.RecordBatch | pa.Table, options: pa.ipc.IpcWriteOptions | None = None
) -> bytes:
    """``batch`` as one Arrow IPC stream (compressed buffers with ``options``), its
    chunks combined first: a table put together from many small ones (a batch's
    completions, a run or a replay each) would be written a record batch per chunk,
    each with its own framing, so a few hundred kilobytes of rows made megabytes."""
    if isinstance(batch, pa.Table):
        batch = batch.combine_chunks()
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write(batch)
    return sink.getvalue()


def encode_within(table: pa.Table, budget: int = MESSAGE_BYTES) -> list[tuple[pa.Table, bytes]]:
    """``table`` as messages of at most ``budget`` bytes, each with the rows it holds (a
    message the brokers refuse anyway is split again from them). Plain when the whole
    table fits, else compressed, else cut into as many slices as the compressed size
    asks for, each cut again while it does not fit. A single row over ``budget`` is a
    :class:`MessageTooLarge`."""
    if not table.num_rows:
        return []
    plain = encode(table)
    if len(plain) <= budget:
        return [(table, plain)]
    return _packed_within(table, budget)


def _packed_within(table: pa.Table, budget: int) -> list[tuple[pa.Table, bytes]]:
    packed = encode(table, _PACKED)
    if len(packed) <= budget:
        return [(table, packed)]
    if table.num_rows == 1:
        raise MessageTooLarge(len(packed), budget)
    slices = min(table.num_rows, -(-len(packed) // budget) + 1)
    size = -(-table.num_rows // slices)
    return [
        message
        for start in range(0, table.num_rows, size)
        for message in _packed_within(table.slice(start, size), budget)
    ]


class MessageTooLarge(ValueError):
    """One record does not fit the message size a channel topic takes."""

    def __init__(self, size: int, budget: int):
        super().__init__(f"one record is {size} bytes, over the {budget} bytes a message may hold")
        self.size, self.budget = size, budget


def decode(
    message: bytes | None, schema: pa.Schema, topic: str, partition: int, offset: int
) -> pa.Table | str:
    """The records of one message, or a reason string when it is not an Arrow IPC
    stream of ``schema``: a foreign or corrupt message is reported, never fatal.
    Any exception counts: pyarrow raises ``OSError`` for about half of random byte
    strings, besides its own errors."""
    try:
        return as_table(pa.ipc.open_stream(message).read_all(), schema)
    except Exception as problem:  # whatever the bytes, the reader goes on
        what = "ack" if "kind" in schema.names else "completion"
        reason = f"message {topic}[{partition}]@{offset} is not {what} records: {problem}"
        log.warning("ackstream: skipped %s", reason)
        return reason


def channel_consumer(bootstrap: str, settings: dict[str, Any] | None = None) -> KafkaConsumer:
    """A consumer that reads channel topics by offset: no group, no commits. Its
    fetches wait at most 50 ms for data: a prefetch left pending at a partition's end
    would otherwise hold the next read of a reused consumer for the broker's wait. A
    read from an offset that retention deleted starts where the log starts now (see
    :func:`~ackstream.kafka.reading.topic_ranges`).
    ``settings``: the shared client settings (security...), see
    :func:`ackstream.kafka.settings.client_settings`."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        **(settings if settings is not None else client_settings({})),
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=16 << 20,
        fetch_max_bytes=64 << 20,
        fetch_max_wait_ms=50,
    )
    return never_create_topics(consumer)  # the channel makes its topics (prepare)


def check_not_deleted(
    bootstrap: str, topic: str, consumer: KafkaConsumer | None, listing: TopicListing
) -> None:
    """Stop, naming it, if the channel's ``topic`` was deleted from the brokers while the
    query ran (see :mod:`ackstream.kafka.topics`): kafka-python would wait for it as for
    brokers that are down, then time out. Without a client (the brokers did not answer
    to make one) nothing can be told."""
    if consumer is not None and deleted_topics([topic], lambda: listing.names(consumer, [topic])):
        raise EnvironmentProblem(
            f"topic {topic!r} of the topology's Kafka channel was deleted from {bootstrap} "
            "while the query ran: the ack records or completions it held are lost",
            "Stop the topology and its acker, and start both from new checkpoints: the "
            "source resumes from its consumer group's commits (startingOffsets=committed) "
            "and reads the records not yet acked again",
        )


def message_ranges(
    bootstrap: str,
    topic: str,
    position: Mapping[str, int],
    *,
    consumer: KafkaConsumer | None = None,
    settings: dict[str, Any] | None = None,
) -> list[tuple[int, int, int]]:
    """(partition, start, end) for each partition of ``topic`` with messages past
    ``position``; with ``consumer`` (see :func:`channel_consumer`), through it, else
    through a consumer of its own with ``settings`` that it closes."""
    with _using(bootstrap, consumer, settings) as client:
        return topic_ranges(client, topic, position)


def fetch_messages(
    bootstrap: str,
    topic: str,
    partition: int,
    start: int,
    end: int,
    *,
    consumer: KafkaConsumer | None = None,
    settings: dict[str, Any] | None = None,
) -> list[tuple[int, bytes | None]]:
    """``(offset, value)`` of the messages ``start`` (inclusive) to ``end`` (exclusive) of
    one partition; the caller decodes them, the offset names a bad one. ``consumer``
    as for :func:`message_ranges`."""
    with _using(bootstrap, consumer, settings) as client:
        return [
            (offset, value)
            for offset, _, value, _ in read_ranges(
                client, (topic, partition), [(start, end)], fail_on_data_loss=False
            )
        ]


def partition_ends(
    consumer: KafkaConsumer, partitions: Iterable[tuple[str, int]]
) -> dict[tuple[str, int], int]:
    """``{(topic, partition): end offset}`` of those of ``partitions`` the brokers of
    ``consumer`` have (a partition they do not have is left out, never waited for):
    what a run of acked offsets is checked against before it is expanded
    (:func:`~ackstream.vocabulary.ranges.checked`)."""
    from kafka import TopicPartition

    wanted = sorted(set(partitions), key=str)
    if not wanted:
        return {}
    listed = consumer.topics()
    there = [
        TopicPartition(topic, p)
        for topic, p in wanted
        if topic in listed and p in (consumer.partitions_for_topic(topic) or ())
    ]
    ends = end_offsets(consumer, there) if there else {}
    return {(tp.topic, tp.partition): end for tp, end in ends.items()}


@contextlib.contextmanager
def _using(
    bootstrap: str, consumer: KafkaConsumer | None, settings: dict[str, Any] | None
) -> Iterator[KafkaConsumer]:
    if consumer is not None:
        yield consumer
        return
    consumer = channel_consumer(bootstrap, settings)
    try:
        yield consumer
    finally:
        consumer.close()
