"""End offsets: ListOffsets where the broker answers it right, the partition's tail where not.

Apache Kafka answers ListOffsets (latest) with the last offset + 1. Some brokers
(Tansu, seen here) answer with the base offset of the last record batch + 1: the
records after the first one of the last batch stay invisible until another batch
arrives. Which kind the brokers at one set of bootstrap servers are is checked at
run time, once per process, and remembered:

- the record batch holding the answer's last offset (fetched alone) goes on past
  the answer: the brokers lag. From then on the last batch of every partition is
  fetched and its true end taken;
- the record batch holding the last two offsets before the answer ends right there:
  the brokers are right (a broker that answers a batch's base offset + 1 never
  gives that answer). From then on ListOffsets is trusted as it is.

Until one of the two has been seen (a log written one record per batch proves
neither), every call fetches the tails, which is right on every broker.
Used by the source (new offsets to read) and the Kafka channel (new ack
records and completions).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kafka import KafkaConsumer, TopicPartition

__all__ = ["end_offsets"]

#: Records one poll may return; a record batch is far smaller.
_MAX_RECORDS = 10_000
#: Partitions one check looks at, and calls that try one, before giving up on a
#: verdict (then the tails are fetched, as before the check).
_CHECK_PARTITIONS = 4
_CHECK_TRIES = 5

#: ``{bootstrap servers: True (ListOffsets is right) or False (it lags)}``.
_verdicts: dict[tuple[str, ...], bool] = {}
_tries: dict[tuple[str, ...], int] = {}

#: ``{TopicPartition: next offset to be written}``
Ends = dict["TopicPartition", int]


def end_offsets(consumer: KafkaConsumer, partitions: Iterable[TopicPartition]) -> Ends:
    """``{TopicPartition: next offset to be written}``; may leave ``consumer`` assigned
    to one of ``partitions``."""
    ends: Ends = consumer.end_offsets(list(partitions))
    key = _servers(consumer)
    if key not in _verdicts and _tries.get(key, 0) < _CHECK_TRIES:
        verdict = _check(consumer, ends)
        if verdict is not None:
            _verdicts[key] = verdict
        else:
            _tries[key] = _tries.get(key, 0) + 1
    if _verdicts.get(key):
        return ends
    return _tails(consumer, ends)


def lists_offsets_right(consumer: KafkaConsumer) -> bool | None:
    """The verdict on the brokers ``consumer`` talks to: None while none was reached."""
    return _verdicts.get(_servers(consumer))


def _servers(consumer: KafkaConsumer) -> tuple[str, ...]:
    servers = consumer.config["bootstrap_servers"]
    return tuple(sorted(servers.split(",") if isinstance(servers, str) else servers))


def _tails(consumer: KafkaConsumer, ends: Ends) -> Ends:
    out = {}
    for part, end in ends.items():
        if end > 0:
            consumer.assign([part])
            consumer.seek(part, end - 1)
            records = consumer.poll(timeout_ms=1000, max_records=_MAX_RECORDS)
            end = max([end] + [r.offset + 1 for r in records.get(part, ())])
        out[part] = end
    return out


def _one_batch_consumer(consumer: KafkaConsumer) -> KafkaConsumer:
    """A consumer like ``consumer`` whose every fetch returns exactly one record batch
    (a broker returns the first batch whole even when it is over the byte limit)."""
    from kafka import KafkaConsumer

    settings = {k: v for k, v in consumer.config.items() if k in KafkaConsumer.DEFAULT_CONFIG}
    settings.update(
        group_id=None, enable_auto_commit=False, max_partition_fetch_bytes=1, fetch_max_bytes=1
    )
    return KafkaConsumer(**settings)


def _batch_at(probe: KafkaConsumer, part: TopicPartition, offset: int) -> list[int]:
    probe.seek(part, offset)
    return [r.offset for r in probe.poll(timeout_ms=1000, max_records=_MAX_RECORDS).get(part, ())]


def _check(consumer: KafkaConsumer, ends: Ends) -> bool | None:
    """False: a batch goes on past its partition's answer; True: a batch ends right at
    its partition's answer with two records; None: no partition showed either."""
    candidates = [(part, end) for part, end in ends.items() if end >= 2][:_CHECK_PARTITIONS]
    if not candidates:
        return None
    probe = _one_batch_consumer(consumer)
    try:
        for part, end in candidates:
            probe.assign([part])
            if any(o >= end for o in _batch_at(probe, part, end - 1)):
                return False
            batch = _batch_at(probe, part, end - 2)
            if batch and batch[0] == end - 2 and batch[-1] == end - 1:
                return True
    finally:
        probe.close()
    return None
