"""The ranges of a topic past a position, on the test broker: from where the log starts
when retention took the records at the position, none when nothing is past it."""

import pytest

from ackstream.kafka.reading import topic_ranges

pytestmark = [pytest.mark.broker]


def test_ranges_start_where_the_log_starts_and_end_at_the_end(broker, new_topic):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import KafkaAdminClient

    topic = new_topic(partitions=2)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for i in range(5):
        producer.send(topic, b"m%d" % i, partition=0)
    producer.send(topic, b"only", partition=1)
    producer.flush()
    producer.close()
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.delete_records({TopicPartition(topic, 0): 3})  # as retention would
    finally:
        admin.close()
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
    try:
        assert topic_ranges(consumer, topic, {}) == [(0, 3, 5), (1, 0, 1)]
        assert topic_ranges(consumer, topic, {"0": 1, "1": 1}) == [(0, 3, 5)]
        assert topic_ranges(consumer, topic, {"0": 4}) == [(0, 4, 5), (1, 0, 1)]
        assert topic_ranges(consumer, topic, {"0": 5, "1": 1}) == []
    finally:
        consumer.close()
