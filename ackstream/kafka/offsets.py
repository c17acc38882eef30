"""End offsets that are right on every Kafka-protocol broker we have met.

Some brokers (Tansu, seen here) answer ListOffsets with the base offset of the
last record batch + 1, not the last offset + 1: the records after the first one
of the last batch stay invisible until another batch arrives. So the last batch
is fetched and its true end taken (on Kafka this only confirms the answer).
Used by the source (new offsets to read) and the Kafka channel (new ack
records and completions).
"""

from __future__ import annotations

__all__ = ["end_offsets"]

#: Records one poll may return; a record batch is far smaller.
_MAX_RECORDS = 10_000


def end_offsets(consumer, partitions) -> dict:
    """``{TopicPartition: next offset to be written}``; leaves ``consumer`` assigned to
    the last of ``partitions``."""
    out = {}
    for part, end in consumer.end_offsets(list(partitions)).items():
        if end > 0:
            consumer.assign([part])
            consumer.seek(part, end - 1)
            records = consumer.poll(timeout_ms=1000, max_records=_MAX_RECORDS)
            end = max([end] + [r.offset + 1 for r in records.get(part, ())])
        out[part] = end
    return out
