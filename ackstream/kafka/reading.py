"""Read offset ranges of a partition, and find the ranges of a topic past a position."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ackstream.errors import AckstreamError, EnvironmentProblem
from ackstream.kafka.offsets import end_offsets
from ackstream.kafka.topics import deleted_topics
from ackstream.vocabulary.partition import Partition

if TYPE_CHECKING:
    from kafka import KafkaConsumer
    from kafka.consumer.fetcher import ConsumerRecord

#: Half-open ``[start, end)`` runs of offsets of one partition, each a pair.
Spans = Iterable[Sequence[int]]
#: A record as :func:`read_ranges` gives it: ``(offset, key, value, timestamp_ms)``.
Record = tuple[int, bytes | None, bytes | None, int]

__all__ = ["FETCH_TIMEOUT_S", "MAX_RECORDS", "read_ranges", "read_records", "topic_ranges"]

#: A fetch that makes no progress for this long raises (naming the partition).
FETCH_TIMEOUT_S = 60.0
#: A fetch that makes no progress asks this often whether its topic was deleted.
DELETED_CHECK_S = 5.0
#: Records one poll may return.
MAX_RECORDS = 10_000


def read_ranges(
    consumer: KafkaConsumer, tp: Partition, spans: Spans, *, fail_on_data_loss: bool = True
) -> Iterator[Record]:
    """``(offset, key, value, timestamp_ms)`` of each record :func:`read_records` reads."""
    for rec in read_records(consumer, tp, spans, fail_on_data_loss=fail_on_data_loss):
        yield rec.offset, rec.key, rec.value, rec.timestamp


#: Spans of a partition closer than this many offsets are read in one pass: a seek
#: drops what the consumer's last fetch brought beyond the span before, so records
#: replayed here and there, a seek each, cost a fetch each.
COALESCE_GAP = 10_000


def _covering(spans: Spans) -> Iterator[tuple[int, int, Callable[[int], bool]]]:
    """``(start, end, wanted)`` of each pass over the non-empty ``spans`` (sorted by
    start, as runs of offsets are): spans less than :data:`COALESCE_GAP` apart share a
    pass, and ``wanted(offset)`` says whether an offset is in one of them (asked in
    increasing order).

    >>> [(a, b, [o for o in range(a, b) if w(o)]) for a, b, w in _covering([(1, 3), (5, 6)])]
    [(1, 6, [1, 2, 5])]
    """
    passes: list[tuple[int, int, list[tuple[int, int]]]] = []
    for start, end in spans:
        if end <= start:
            continue
        if passes and start - passes[-1][1] <= COALESCE_GAP and start >= passes[-1][0]:
            first, last, inside = passes[-1]
            inside.append((start, end))
            passes[-1] = (first, max(last, end), inside)
        else:
            passes.append((start, end, [(start, end)]))
    for start, end, inside in passes:
        yield start, end, _within(inside)


def _within(spans: list[tuple[int, int]]) -> Callable[[int], bool]:
    """A test of offsets, asked in increasing order, for being in one of ``spans``."""
    if len(spans) == 1:
        return lambda offset: True
    position = [0]

    def wanted(offset: int) -> bool:
        i = position[0]
        while i < len(spans) and offset >= spans[i][1]:
            i += 1
        position[0] = i
        return i < len(spans) and offset >= spans[i][0]

    return wanted


def read_records(
    consumer: KafkaConsumer,
    tp: Partition,
    spans: Any,  # Spans; Any until the source's reader, which joins two kinds, names its type
    *,
    fail_on_data_loss: bool = True,
    stall_timeout_s: float = FETCH_TIMEOUT_S,
    deleted_check_s: float = DELETED_CHECK_S,
) -> Iterator[ConsumerRecord]:
    """kafka-python's ``ConsumerRecord`` of every record in the half-open ``[start,
    end)`` spans of partition ``tp``, in order, as they arrive; one seek per span.

    Offsets with no record (a compacted topic, transaction markers) are simply
    absent. Records deleted by retention raise when ``fail_on_data_loss``; so does
    a span that makes no progress for ``stall_timeout_s``, and, sooner, one whose
    topic the brokers no longer list (asked every ``deleted_check_s`` of no progress).
    ``consumer`` is left assigned to ``tp`` alone.
    """
    from kafka import TopicPartition

    part = TopicPartition(*tp)
    consumer.assign([part])
    for start, end, wanted in _covering(spans):
        consumer.seek(part, start)
        deadline = time.monotonic() + stall_timeout_s
        check_at = time.monotonic() + deleted_check_s
        first = None
        while consumer.position(part) < end:
            polled = consumer.poll(timeout_ms=500, max_records=MAX_RECORDS)
            progressed = False
            for rec in polled.get(part, ()):
                progressed = True
                if start <= rec.offset < end and wanted(rec.offset):
                    first = rec.offset if first is None else first
                    yield rec
            if progressed:
                deadline = time.monotonic() + stall_timeout_s
                check_at = time.monotonic() + deleted_check_s
            elif time.monotonic() > check_at:
                if deleted_topics([tp[0]], consumer.topics):
                    raise EnvironmentProblem(
                        f"topic {tp[0]!r} was deleted while offsets {start}..{end - 1} of its "
                        f"partition {tp[1]} were read",
                        "Start the query from a new checkpoint, with the topic re-created or "
                        "no longer read",
                    )
                check_at = time.monotonic() + deleted_check_s
            if not progressed and time.monotonic() > deadline:
                raise AckstreamError(
                    f"no progress reading {tp[0]}[{tp[1]}] offsets "
                    f"{start}..{end - 1} for {stall_timeout_s:.0f}s; is the "
                    "broker up and the offset still retained?"
                )
        if (
            fail_on_data_loss
            and (first is None or first > start)
            and consumer.beginning_offsets([part])[part] > start
        ):
            raise AckstreamError(
                f"{tp[0]}[{tp[1]}] offset {start} was deleted by retention before it was "
                "read (data loss); set failOnDataLoss=false to skip such records"
            )


def topic_ranges(
    consumer: KafkaConsumer, topic: str, position: Mapping[str, int]
) -> list[tuple[int, int, int]]:
    """``(partition, start, end)`` for each partition of ``topic`` with records past
    ``position`` (``{"<partition>": next offset}``), by partition; none if the topic
    does not exist. A partition in ``position`` starts there, one not in it where its
    log starts: a reader of a position that retention has deleted since starts at the
    log's first offset itself (a consumer with ``auto_offset_reset='earliest'``), so a
    position read on needs no second offset request."""
    from kafka import TopicPartition

    partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
    if not partitions:
        return []
    ends = end_offsets(consumer, partitions)
    newer = [tp for tp in partitions if ends[tp] > int(position.get(str(tp.partition), 0))]
    unplaced = [tp for tp in newer if str(tp.partition) not in position]
    starts = consumer.beginning_offsets(unplaced) if unplaced else {}
    out = []
    for tp in sorted(newer, key=lambda tp: tp.partition):
        start = starts[tp] if tp in starts else int(position[str(tp.partition)])
        if ends[tp] > start:
            out.append((tp.partition, start, ends[tp]))
    return out
