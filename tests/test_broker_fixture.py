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


def produce_and_consume(bootstrap, topic, values, partitions):
    """Produce ``values`` round robin with acks=all, then read the whole topic back."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", retries=10)
    for i, value in enumerate(values):
        producer.send(topic, value=value, partition=i % partitions)
    producer.flush(timeout=60)
    producer.close()
    parts = [TopicPartition(topic, p) for p in range(partitions)]
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        ends = consumer.end_offsets(parts)
        consumer.assign(parts)
        consumer.seek_to_beginning()
        got = []
        while any(consumer.position(p) < ends[p] for p in parts):
            for records in consumer.poll(timeout_ms=1000).values():
                got += [r.value for r in records]
        return sorted(got)
    finally:
        consumer.close()


@pytest.mark.e2e
def test_a_broker_killed_comes_back_from_its_log():
    from broker import KafkaBroker, create_topic

    # the restarted broker registers again once its old session ended (default 9 s)
    kafka = KafkaBroker(
        **{"broker.session.timeout.ms": 3000, "broker.heartbeat.interval.ms": 500}
    ).start()
    try:
        topic = create_topic(kafka.bootstrap, partitions=2)
        values = [b"v%d" % i for i in range(20)]
        assert produce_and_consume(kafka.bootstrap, topic, values, 2) == sorted(values)
        kafka.restart()  # SIGKILL, then start from the log on disk
        assert produce_and_consume(kafka.bootstrap, topic, [], 2) == sorted(values)
    finally:
        kafka.stop()


@pytest.mark.fault
@pytest.mark.long  # three brokers started and one killed: make test-cluster runs it
def test_a_three_broker_cluster_keeps_a_replicated_topic_through_a_lost_leader():
    """Replication factor 3, min.insync.replicas 2: with the leader of partition 0
    killed, acks=all writes still succeed, and the node comes back from its log."""
    from kafka.admin import KafkaAdminClient

    from broker import KafkaCluster, create_topic

    cluster = KafkaCluster().start()
    print(f"3 brokers ready in {cluster.started_s:.1f}s")
    try:
        topic = create_topic(cluster.bootstrap, partitions=2, replication=3)
        admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
        try:
            parts = admin.describe_topics([topic])[0]["partitions"]
        finally:
            admin.close()
        assert sorted(len(p["replica_nodes"]) for p in parts) == [3, 3]
        first = [b"a%d" % i for i in range(20)]
        assert produce_and_consume(cluster.bootstrap, topic, first, 2) == sorted(first)

        leader = next(p["leader_id"] for p in parts if p["partition_index"] == 0)
        node = next(n for n in cluster.nodes if n.node_id == leader)
        node.kill()
        survivors = ",".join(n.bootstrap for n in cluster.nodes if n is not node)
        second = [b"b%d" % i for i in range(20)]
        assert produce_and_consume(survivors, topic, second, 2) == sorted(first + second)
        cluster.restart(node)
        assert produce_and_consume(cluster.bootstrap, topic, [], 2) == sorted(first + second)
    finally:
        cluster.stop()
