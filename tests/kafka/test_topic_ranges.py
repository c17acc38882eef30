"""The ranges of a topic past a position, on the test broker: from the position, or where
the log starts for a partition without one; none when nothing is past it. A channel
consumer reading a range whose start retention took reads from where the log starts."""

import pytest

from ackstream.kafka.reading import topic_ranges

pytestmark = [pytest.mark.broker]


def test_ranges_start_at_the_position_or_the_log_start_and_end_at_the_end(broker, new_topic):
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
        assert topic_ranges(consumer, topic, {"0": 1, "1": 1}) == [(0, 1, 5)]
        assert topic_ranges(consumer, topic, {"0": 4}) == [(0, 4, 5), (1, 0, 1)]
        assert topic_ranges(consumer, topic, {"0": 5, "1": 1}) == []
    finally:
        consumer.close()


def test_a_channel_read_from_a_position_retention_took_starts_at_the_log_start(broker, new_topic):
    from kafka import KafkaProducer, TopicPartition
    from kafka.admin import KafkaAdminClient

    from ackstream.channels.messages import channel_consumer, fetch_messages

    topic = new_topic(partitions=1)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for i in range(5):
        producer.send(topic, b"m%d" % i, partition=0)
    producer.flush()
    producer.close()
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.delete_records({TopicPartition(topic, 0): 3})
    finally:
        admin.close()
    consumer = channel_consumer(broker.bootstrap)
    try:
        [(partition, start, end)] = topic_ranges(consumer, topic, {"0": 1})
        read = fetch_messages(broker.bootstrap, topic, partition, start, end, consumer=consumer)
        assert read == [(3, b"m3"), (4, b"m4")]
    finally:
        consumer.close()
