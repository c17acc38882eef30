"""Spark's Kafka source reading a batch's new ranges gives the Python reader's rows."""

import pytest

from ackstream.config import parse
from ackstream.session import has_kafka_connector
from ackstream.sources.kafka import KafkaUpstream
from ackstream.sources.rows import ReadTask
from ackstream.sources.spark_reader import read_new_ranges

pytestmark = [pytest.mark.broker]


@pytest.fixture
def connector(spark):
    if not has_kafka_connector(spark):
        pytest.skip("Spark's Kafka connector is not on this session's class path")


def test_both_readers_give_the_same_rows_roots_and_held_back_values(
    spark, connector, broker, new_topic
):
    """Root, edge and attempt by the same hash, the same columns and values, and a value
    over ``ackstream.maxValueBytes`` held back with the same reason."""
    from kafka import KafkaProducer

    topic = new_topic(partitions=2)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for i in range(30):
        value = b"x" * 300 if i == 7 else b"v%d" % i
        producer.send(topic, key=b"k%d" % i, value=value, partition=i % 2, headers=[("h", b"1")])
    producer.flush()
    producer.close()
    config = parse(
        {
            "kafka.bootstrap.servers": broker.bootstrap,
            "subscribe": topic,
            "ackstream.topology": "readers",
            "ackstream.maxValueBytes": "100",
            "includeHeaders": "true",
            "ackstream.recordReader": "spark",
        }
    )
    offset = {"v": 1, "ids": config.id_namespace, "read": {topic: {"0": [2, 15], "1": [0, 15]}}}
    columns = ["partition", "offset", "key", "value", "headers", "_root", "_edge", "_attempt"]

    by_spark = read_new_ranges(spark, config, offset)
    assert by_spark is not None
    spark_rows = {
        (r["partition"], r["offset"]): r.asDict()
        for r in by_spark.select(*columns, "_reason").collect()
    }
    upstream = KafkaUpstream(config)
    python_rows = {}
    for task in (ReadTask(topic, 0, 2, 15), ReadTask(topic, 1, 0, 15)):
        for batch in upstream.read(task):
            for row in batch.select([*columns, "_reason"]).to_pylist():
                python_rows[(row["partition"], row["offset"])] = row
    upstream.close()

    assert sorted(spark_rows) == sorted(python_rows)
    assert len(spark_rows) == 13 + 15
    for at, row in python_rows.items():
        mine = spark_rows[at]
        assert mine["_reason"] == row["_reason"]
        assert (mine["_root"], mine["_edge"], mine["_attempt"]) == (
            row["_root"],
            row["_edge"],
            row["_attempt"],
        )
        if row["_reason"] is None:  # a held-back row's payload is not the stages' to see
            assert mine["key"] == row["key"] and mine["value"] == row["value"]
            assert [(h["key"], bytes(h["value"])) for h in mine["headers"]] == [
                (h["key"], h["value"]) for h in row["headers"]
            ]
    assert "maxValueBytes" in python_rows[(1, 3)]["_reason"]  # record 7: partition 1, offset 3


def test_untracked_the_rows_have_no_held_back_column_and_keep_big_values(
    spark, connector, broker, new_topic
):
    """Untracked nothing is held back: a value over ``ackstream.maxValueBytes`` is read
    like any other, and no ``_reason`` column is left for the batch to filter and drop."""
    from kafka import KafkaProducer

    topic = new_topic()
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for value in (b"small", b"x" * 300):
        producer.send(topic, value=value, partition=0)
    producer.flush()
    producer.close()
    config = parse(
        {
            "kafka.bootstrap.servers": broker.bootstrap,
            "subscribe": topic,
            "ackstream.tracking": "false",
            "ackstream.maxValueBytes": "100",
            "ackstream.recordReader": "spark",
        }
    )
    offset = {"v": 1, "ids": config.id_namespace, "read": {topic: {"0": [0, 2]}}}
    frame = read_new_ranges(spark, config, offset)
    assert frame is not None
    assert "_reason" not in frame.columns
    assert sorted(len(row["value"]) for row in frame.collect()) == [5, 300]


def test_the_new_ranges_are_read_through_spark_s_version_2_source(
    spark, connector, broker, new_topic, capsys
):
    """Version 1 plans a nested SQL execution for every read; the session's own choice
    of version 1 sources is left as it was."""
    before = spark.conf.get("spark.sql.sources.useV1SourceList")
    assert "kafka" in before  # Spark's default: else this test proves nothing
    topic = new_topic()
    config = parse(
        {
            "kafka.bootstrap.servers": broker.bootstrap,
            "subscribe": topic,
            "ackstream.recordReader": "spark",
        }
    )
    offset = {"v": 1, "ids": config.id_namespace, "read": {topic: {"0": [0, 1]}}}
    frame = read_new_ranges(spark, config, offset)
    assert frame is not None
    capsys.readouterr()
    frame.explain(extended=True)
    plan = capsys.readouterr().out
    assert "RelationV2" in plan and "KafkaRelation" not in plan
    assert spark.conf.get("spark.sql.sources.useV1SourceList") == before


def test_an_offset_naming_no_new_range_reads_nothing(spark, connector, broker, new_topic):
    config = parse(
        {
            "kafka.bootstrap.servers": broker.bootstrap,
            "subscribe": new_topic(),
            "ackstream.recordReader": "spark",
        }
    )
    assert read_new_ranges(spark, config, {"v": 1, "read": {}, "replays": [["t", 0, 3, 1]]}) is None
