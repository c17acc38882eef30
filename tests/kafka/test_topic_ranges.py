"""The ranges of a topic past a position, on the test broker: from the position, or where
the log starts for a partition without one; none when nothing is past it. A channel
consumer reading a range whose start retention took reads from where the log starts."""

import pytest

from ackstream.kafka.reading import topic_ranges

from helpers import produce

pytestmark = [pytest.mark.broker]


def five_records_three_taken(bootstrap: str, topic: str) -> None:
    """m0..m4 in partition 0 of ``topic``, the first three deleted as retention would."""
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient

    produce(bootstrap, topic, [f"m{i}" for i in range(5)])
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_records({TopicPartition(topic, 0): 3})
    finally:
        admin.close()


def test_ranges_start_at_the_position_or_the_log_start_and_end_at_the_end(broker, new_topic):
    from kafka import KafkaConsumer

    topic = new_topic(partitions=2)
    five_records_three_taken(broker.bootstrap, topic)
    produce(broker.bootstrap, topic, ["only"], partition=1)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
    try:
        assert topic_ranges(consumer, topic, {}) == [(0, 3, 5), (1, 0, 1)]
        assert topic_ranges(consumer, topic, {"0": 1, "1": 1}) == [(0, 1, 5)]
        assert topic_ranges(consumer, topic, {"0": 4}) == [(0, 4, 5), (1, 0, 1)]
        assert topic_ranges(consumer, topic, {"0": 5, "1": 1}) == []
    finally:
        consumer.close()


def test_a_channel_read_from_a_position_retention_took_starts_at_the_log_start(broker, new_topic):
    from ackstream.channels.messages import channel_consumer, fetch_messages

    topic = new_topic(partitions=1)
    five_records_three_taken(broker.bootstrap, topic)
    consumer = channel_consumer(broker.bootstrap)
    try:
        [(partition, start, end)] = topic_ranges(consumer, topic, {"0": 1})
        read = fetch_messages(broker.bootstrap, topic, partition, start, end, consumer=consumer)
        assert read == [(3, b"m3"), (4, b"m4")]
    finally:
        consumer.close()
