"""Read tasks of the Kafka upstream in one Python worker, task after task."""

import pytest

from ackstream.config.source import parse
from ackstream.sources import kafka as kafka_upstream
from ackstream.sources.rows import ReadTask

from helpers import produce

pytestmark = [pytest.mark.broker]


def test_a_worker_reads_task_after_task_with_one_consumer(broker, new_topic, monkeypatch):
    """A new consumer per task paid its connections, metadata and kafka-python's 100 ms
    back-off before the first fetch; an abandoned read's consumer is not reused."""
    topic = new_topic(partitions=2)
    produce(broker.bootstrap, topic, [f"v{i}" for i in range(40)], round_robin=2)
    made = []
    real = kafka_upstream.KafkaConsumer

    def counted(*args, **kwargs):
        made.append(kwargs.get("group_id"))
        return real(*args, **kwargs)

    monkeypatch.setattr(kafka_upstream, "KafkaConsumer", counted)
    monkeypatch.setattr(kafka_upstream, "_IDLE_READERS", {})
    config = parse(
        {"kafka.bootstrap.servers": broker.bootstrap, "subscribe": topic, "ackstream.topology": "t"}
    )
    upstream = kafka_upstream.KafkaUpstream(config)

    def offsets(task):
        return [o for b in upstream.read(task) for o in b.column("offset").to_pylist()]

    assert offsets(ReadTask(topic, 0, 0, 10)) == list(range(10))
    assert offsets(ReadTask(topic, 1, 5, 20)) == list(range(5, 20))
    assert offsets(ReadTask(topic, 0, 10, 20)) == list(range(10, 20))  # no record left over
    assert made == [None]
    abandoned = upstream.read(ReadTask(topic, 0, 0, 20))
    next(abandoned)
    abandoned.close()
    assert offsets(ReadTask(topic, 1, 0, 3)) == [0, 1, 2]
    assert made == [None, None]
