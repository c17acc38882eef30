"""The broker fixture speaks enough Kafka for the project: produce, fetch, group commits."""

import pytest

pytestmark = pytest.mark.broker


def test_produce_fetch_and_commit_round_trip(broker, new_topic):
    from kafka import KafkaConsumer, KafkaProducer, OffsetAndMetadata, TopicPartition

    topic = new_topic(partitions=2)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for i in range(10):
        producer.send(topic, value=f"v{i}".encode(), partition=i % 2)
    producer.flush()
    producer.close()

    tp = TopicPartition(topic, 1)
    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap, group_id="g1", enable_auto_commit=False
    )
    consumer.assign([tp])
    consumer.seek(tp, 0)
    values = []
    while len(values) < 5:
        for records in consumer.poll(timeout_ms=1000).values():
            values += [r.value for r in records]
    assert values == [b"v1", b"v3", b"v5", b"v7", b"v9"]
    consumer.commit({tp: OffsetAndMetadata(3, "", -1)})
    assert consumer.committed(tp) == 3
    consumer.close()
