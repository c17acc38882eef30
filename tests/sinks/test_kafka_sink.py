"""The Kafka output sink on the test broker: rows are acked only once the broker has them."""

import pytest
from pyspark.sql import functions as F

from ackstream.sinks.kafka import KafkaSink
from ackstream.testing import settle, tracked_frame
from ackstream.topology import Topology

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def read_topic(bootstrap, topic, expected, timeout_s=30):
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=timeout_s * 1000,
    )
    try:
        values = []
        for message in consumer:
            values.append(message.value.decode())
            if len(values) >= expected:
                break
        return values
    finally:
        consumer.close()


def test_rows_the_broker_refused_fail_their_roots(spark, broker, new_topic):
    topic = new_topic()
    lines = ["a", "b", "x" * 5000, "c"]
    sink = KafkaSink(broker.bootstrap, topic, producer_config={"max_request_size": 2000})
    topology = (
        Topology("to-kafka", spark, None)
        .map(lambda df: df.withColumn("value", F.upper("value")))
        .sink(sink)
    )
    try:
        records = topology.run_batch(tracked_frame(spark, lines))
    finally:
        sink.close()
    roots = [r["_root"] for r in tracked_frame(spark, lines).orderBy("offset").collect()]
    assert settle(records) == {r: ("failed" if i == 2 else "acked") for i, r in enumerate(roots)}
    assert sorted(read_topic(broker.bootstrap, topic, 3)) == ["A", "B", "C"]
