"""End offsets: ListOffsets is trusted only where the broker was seen to answer it right.

A fake log of record batches stands for the two kinds of broker (one answering
the last offset + 1, one answering the last batch's base offset + 1, as Tansu
does); Apache Kafka shows the first kind for real.
"""

import itertools
from types import SimpleNamespace

import pytest

from ackstream.kafka import offsets as kafka_offsets

_servers = itertools.count()


class FakeBroker:
    """One partition's record batches (lists of offsets); ``lags`` answers ListOffsets
    with the last batch's base offset + 1."""

    def __init__(self, batches, lags: bool):
        self.batches, self.lags = batches, lags
        self.bootstrap = f"fake-{next(_servers)}:9092"
        self.fetches = 0

    def end(self) -> int:
        last = self.batches[-1]
        return last[0] + 1 if self.lags else last[-1] + 1


class FakeConsumer:
    def __init__(self, broker: FakeBroker, one_batch: bool = False):
        self.broker, self.one_batch = broker, one_batch
        self.config = {"bootstrap_servers": broker.bootstrap}
        self.position = None

    def end_offsets(self, parts):
        return {p: self.broker.end() for p in parts}

    def assign(self, parts):
        pass

    def seek(self, part, offset):
        self.position = offset

    def poll(self, timeout_ms, max_records):
        self.broker.fetches += 1
        batches = [b for b in self.broker.batches if b[-1] >= self.position]
        batches = batches[:1] if self.one_batch else batches
        return {"p0": [SimpleNamespace(offset=o) for b in batches for o in b if o >= self.position]}

    def close(self):
        pass


@pytest.fixture(autouse=True)
def one_batch_probe(monkeypatch):
    monkeypatch.setattr(
        kafka_offsets,
        "_one_batch_consumer",
        lambda consumer: FakeConsumer(consumer.broker, one_batch=True),
    )


@pytest.mark.parametrize(
    "lags, tail_fetches",
    [
        pytest.param(True, 1, id="a batch base is caught and its tails fetched, no second check"),
        pytest.param(False, 0, id="answering right is trusted and no tail is fetched"),
    ],
)
def test_a_broker_is_checked_once_and_its_tails_fetched_only_if_it_lags(lags, tail_fetches):
    broker = FakeBroker([[0, 1, 2], [3, 4, 5]], lags=lags)
    consumer = FakeConsumer(broker)
    assert kafka_offsets.end_offsets(consumer, ["p0"]) == {"p0": 6}
    assert kafka_offsets.lists_offsets_right(consumer) is (not lags)
    broker.batches.append([6, 7])
    before = broker.fetches
    assert kafka_offsets.end_offsets(consumer, ["p0"]) == {"p0": 8}
    assert broker.fetches == before + tail_fetches


def test_single_record_batches_prove_nothing_and_the_tails_are_fetched():
    """A lagging broker answers right while the last batch holds one record; after
    that the first longer batch shows it lags."""
    broker = FakeBroker([[0], [1], [2]], lags=True)
    consumer = FakeConsumer(broker)
    assert kafka_offsets.end_offsets(consumer, ["p0"]) == {"p0": 3}
    assert kafka_offsets.lists_offsets_right(consumer) is None
    broker.batches.append([3, 4, 5])
    assert kafka_offsets.end_offsets(consumer, ["p0"]) == {"p0": 6}
    assert kafka_offsets.lists_offsets_right(consumer) is False


@pytest.mark.broker
def test_apache_kafka_is_seen_to_answer_list_offsets_right(broker, new_topic, monkeypatch):
    """One record batch of three messages: Kafka's ListOffsets says 3 and the check
    trusts it, so the next call fetches no tail."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    monkeypatch.undo()  # the real one-batch consumer
    monkeypatch.setattr(kafka_offsets, "_verdicts", {})
    monkeypatch.setattr(kafka_offsets, "_tries", {})
    topic = new_topic()
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=200)
    for n in range(3):
        producer.send(topic, value=b"message %d" % n, partition=0)
    producer.flush()
    producer.close()
    tp = TopicPartition(topic, 0)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
    try:
        assert kafka_offsets.lists_offsets_right(consumer) is None
        assert kafka_offsets.end_offsets(consumer, [tp]) == {tp: 3}
        assert kafka_offsets.lists_offsets_right(consumer) is True

        def no_tail(*args, **kwargs):
            raise AssertionError("a tail was fetched though ListOffsets is trusted")

        monkeypatch.setattr(consumer, "poll", no_tail)
        monkeypatch.setattr(consumer, "seek", no_tail)
        assert kafka_offsets.end_offsets(consumer, [tp]) == {tp: 3}
    finally:
        monkeypatch.undo()
        consumer.close()
