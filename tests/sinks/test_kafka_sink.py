"""The Kafka output sink on the test broker: rows are acked only once the broker has them."""

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ackstream.errors import OptionError, Unreachable
from ackstream.sinks.kafka import KafkaSink
from ackstream.spark.session import has_kafka_connector
from ackstream.testing import settle, tracked_frame
from ackstream.topology import Topology

from helpers import consume

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def read_topic(bootstrap, topic) -> list[str]:
    """The values of ``topic`` from its start to its end: the writes tested have returned,
    so every message they made is there."""
    return [m.value.decode() for m in consume(bootstrap, topic)]


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
    assert sorted(read_topic(broker.bootstrap, topic)) == ["A", "B", "C"]


def handed_back(unwritten) -> list[dict]:
    """The rows a write handed back (a DataFrame, as the Sink seam says), by edge."""
    assert isinstance(unwritten, DataFrame)
    return [r.asDict(recursive=True) for r in unwritten.orderBy("_edge").collect()]


def frame(spark, values, **columns):
    """Output rows as a multi-anchored topology hands them to the sink, plus ``columns``
    (name -> SQL expression) passed through."""
    rows = [
        (f"k{i}", v, None, 100 + i, [(i + 1, 1000 + i), (i + 2, 2000 + i)], 0, "payload")
        for i, v in enumerate(values)
    ]
    schema = (
        "key string, value string, _root bigint, _edge bigint, "
        "_anchors array<struct<root:bigint,edge:bigint>>, _attempt int, other string"
    )
    df = spark.createDataFrame(rows, schema)
    for name, expression in columns.items():
        df = df.withColumn(name, F.expr(expression))
    return df


@pytest.mark.parametrize("writer", ["python", "spark"])
def test_a_clean_batch_moves_no_row_to_the_driver(spark, broker, new_topic, monkeypatch, writer):
    """The Python producers hand back no row; Spark's writer collects nothing at all."""
    if writer == "spark" and not has_kafka_connector(spark):
        pytest.skip("Spark's Kafka connector is not on this session's class path")
    topic = new_topic()
    values = [f"v{i}" for i in range(50)]
    df = frame(spark, values).repartition(3)
    collected = []
    to_arrow = type(df).toArrow

    def spy(self):
        table = to_arrow(self)
        collected.append((table.column_names, table.num_rows))
        return table

    monkeypatch.setattr(type(df), "toArrow", spy)
    assert KafkaSink(broker.bootstrap, topic, writer=writer).write(df, 0) is None
    # the one collect is of the unwritten rows: lineage and why, no payload, none here
    unwritten = [(["_root", "_edge", "_anchors", "_attempt", "_reason"], 0)]
    assert collected == (unwritten if writer == "python" else [])
    assert sorted(read_topic(broker.bootstrap, topic)) == sorted(values)


@pytest.mark.parametrize("writer", ["python", "spark"])
def test_a_value_of_another_type_is_written_as_its_string(spark, broker, new_topic, writer, caplog):
    """Both writers take a value column of any type (by any name) as its string; Spark's
    writes it in its own job (no fallback to the per-row write)."""
    if writer == "spark" and not has_kafka_connector(spark):
        pytest.skip("Spark's Kafka connector is not on this session's class path")
    topic = new_topic()
    df = frame(spark, ["a", "b"], **{"the count": "_edge * 2"})
    with caplog.at_level("WARNING", logger="ackstream.sinks.kafka"):
        sink = KafkaSink(broker.bootstrap, topic, value="the count", writer=writer)
        assert sink.write(df, 0) is None
    assert not [r for r in caplog.records if r.name == "ackstream.sinks.kafka"]
    assert sorted(read_topic(broker.bootstrap, topic)) == ["200", "202"]


def test_a_write_leaves_the_session_s_choice_of_version_1_sources_as_it_was(
    spark, broker, new_topic
):
    """Spark's writer writes through version 2 for the job alone: the user's session keeps
    its list (Spark's default names kafka and the file formats)."""
    if not has_kafka_connector(spark):
        pytest.skip("Spark's Kafka connector is not on this session's class path")
    before = spark.conf.get("spark.sql.sources.useV1SourceList")
    assert "parquet" in before
    assert (
        KafkaSink(broker.bootstrap, new_topic(), writer="spark").write(frame(spark, ["a"]), 0)
        is None
    )
    assert spark.conf.get("spark.sql.sources.useV1SourceList") == before


def test_an_unwritten_row_comes_back_with_its_lineage_and_why(spark, broker, new_topic):
    topic = new_topic()
    values = ["a", "x" * 5000, "b"]
    sink = KafkaSink(broker.bootstrap, topic, producer_config={"max_request_size": 2000})
    unwritten = sink.write(frame(spark, values, _shard="7"), 3)
    assert unwritten.columns == ["_root", "_edge", "_anchors", "_attempt", "_shard", "_reason"]
    (row,) = handed_back(unwritten)
    assert row["_edge"] == 101 and row["_root"] is None and row["_shard"] == 7
    assert row["_anchors"] == [{"root": 2, "edge": 1001}, {"root": 3, "edge": 2001}]
    assert topic in row["_reason"] and "MessageSizeTooLargeError" in row["_reason"]
    assert sorted(read_topic(broker.bootstrap, topic)) == ["a", "b"]


def test_the_sink_pickles_after_a_write_and_writes_again(spark, broker, new_topic):
    """Spark Connect pickles the foreachBatch function, and the sink with it."""
    import pickle

    topic = new_topic()
    sink = KafkaSink(broker.bootstrap, topic)
    assert sink.write(frame(spark, ["a"]), 0) is None
    again = pickle.loads(pickle.dumps(sink))
    assert again.write(frame(spark, ["b"]), 1) is None
    sink.close()
    sink.close()  # harmless, and twice too
    assert sorted(read_topic(broker.bootstrap, topic)) == ["a", "b"]


def test_without_a_broker_the_write_is_unreachable_not_its_rows_failed(spark):
    sink = KafkaSink("127.0.0.1:1", "nowhere", producer_config={"bootstrap_timeout_ms": 500})
    with pytest.raises(
        Unreachable, match="KafkaSink to nowhere at 127.0.0.1:1 unreachable: .*no producer"
    ) as raised:
        sink.write(frame(spark, ["a", "b"]), 0)
    assert raised.value.answers() is False  # the probe: no broker answers either


def test_an_aggregate_row_the_broker_refused_fails_the_roots_of_its_group(spark, broker, new_topic):
    """A telescoped aggregate's rows carry ``_group``, not their roots: the sink hands
    it back, and the batch finds the roots of the refused row's group."""
    topic = new_topic()
    lines = ["a", "big", "b", "big", "a"]
    sink = KafkaSink(broker.bootstrap, topic, producer_config={"max_request_size": 2000})
    topology = (
        Topology("agg-to-kafka", spark, None)
        .aggregate("value", F.count("*").cast("string").alias("n"))
        .map(
            lambda df: df.withColumn("key", F.col("value")).withColumn(
                "value",
                F.when(F.col("key") == "big", F.repeat(F.lit("x"), 5000)).otherwise(F.col("n")),
            )
        )
        .sink(sink)
    )
    records = topology.run_batch(tracked_frame(spark, lines))
    rows = tracked_frame(spark, lines).orderBy("offset").collect()
    assert settle(records) == {
        r["_root"]: ("failed" if r["value"] == "big" else "acked") for r in rows
    }
    assert sorted(read_topic(broker.bootstrap, topic)) == ["1", "2"]


def test_a_row_the_broker_refuses_fails_spark_s_write_and_alone_comes_back(
    spark, broker, new_topic
):
    """Spark's writer fails as a whole on one refused row; the row-by-row write then
    names that row, and the others are in the topic (written once or twice)."""
    if not has_kafka_connector(spark):
        pytest.skip("Spark's Kafka connector is not on this session's class path")
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    topic = new_topic()
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:  # the topic takes at most 2,000 bytes a message
        resource = ConfigResource(ConfigResourceType.TOPIC, topic, {"max.message.bytes": "2000"})
        admin.alter_configs([resource])
    finally:
        admin.close()
    values = ["a", "b", "x" * 5000, "c"]
    sink = KafkaSink(broker.bootstrap, topic, writer="spark", flush_timeout_s=30)
    alone = frame(spark, values).repartitionByRange(len(values), "_edge")  # a task a row
    unwritten = sink.write(alone, 0)
    (row,) = handed_back(unwritten)
    assert row["_edge"] == 102 and "KafkaSink to" in row["_reason"]
    # the whole topic: rows the failed job wrote are there twice
    assert set(read_topic(broker.bootstrap, topic)) == {"a", "b", "c"}


def test_a_row_too_big_for_a_request_fails_spark_s_write_and_alone_comes_back(
    spark, broker, new_topic
):
    """Over the producers' 1 MB request size (the JVM's and kafka-python's default):
    Spark's job fails on it, and the row-by-row write names the row the producer
    refused; every other row is in the topic."""
    if not has_kafka_connector(spark):
        pytest.skip("Spark's Kafka connector is not on this session's class path")
    topic = new_topic()
    values = ["a", "x" * (1 << 20), "b"]
    sink = KafkaSink(broker.bootstrap, topic, writer="spark", flush_timeout_s=5)
    unwritten = sink.write(frame(spark, values), 0)
    (row,) = handed_back(unwritten)
    assert row["_edge"] == 101 and "refused by the producer" in row["_reason"]
    assert set(read_topic(broker.bootstrap, topic)) == {"a", "b"}


@pytest.mark.parametrize("writer", ["python", "spark"])
def test_a_record_with_neither_key_nor_value_is_written_beside_a_row_too_big(
    spark, broker, new_topic, writer
):
    """Kafka takes a record whose key and value are both null (Spark's writer does):
    the row-by-row write sends it too, whether it writes alone (``python``) or after
    Spark's job failed on a neighbour too big for a request (``spark``); only that
    neighbour comes back unwritten."""
    if writer == "spark" and not has_kafka_connector(spark):
        pytest.skip("Spark's Kafka connector is not on this session's class path")
    topic = new_topic()
    values = ["a", None, "x" * (1 << 20), "b"]
    rows = frame(spark, values).withColumn(
        "key", F.when(F.col("value").isNull(), F.lit(None)).otherwise(F.col("key"))
    )
    sink = KafkaSink(broker.bootstrap, topic, writer=writer, flush_timeout_s=5)
    unwritten = sink.write(rows, 0)
    (row,) = handed_back(unwritten)
    assert row["_edge"] == 102 and "refused by the producer" in row["_reason"]
    written = {(m.key, m.value) for m in consume(broker.bootstrap, topic)}
    assert written == {(b"k0", b"a"), (None, None), (b"k3", b"b")}


def test_a_writer_it_does_not_know_is_refused_by_name():
    with pytest.raises(OptionError, match="writer"):
        KafkaSink("127.0.0.1:9", "t", writer="jvm")


def test_a_stage_error_in_spark_s_write_is_the_batch_s_not_written_again_row_by_row(
    spark, broker, new_topic, monkeypatch
):
    """A row whose computation raises (a stage's error) fails Spark's write job: that is
    the batch's failure, raised as it is. Writing the batch again row by row would run
    the stages once more only to fail (or hang) the same way, and write the rows of the
    tasks that did finish a second time."""
    if not has_kafka_connector(spark):
        pytest.skip("Spark's Kafka connector is not on this session's class path")
    topic = new_topic()
    sink = KafkaSink(broker.bootstrap, topic, writer="spark")
    rows_by_row = []
    monkeypatch.setattr(sink, "_write", lambda *args, **kw: rows_by_row.append(args))
    values = ["a", "b", "poison", "c"]
    bad = frame(spark, values).withColumn(
        "value",
        F.when(F.col("value") == "poison", F.raise_error(F.lit("poison"))).otherwise(
            F.col("value")
        ),
    )
    with pytest.raises(Exception, match="poison"):
        sink.write(bad, 0)
    assert rows_by_row == []  # the row-by-row write was not entered


class _NoMetadata:
    """A producer whose every send waits out max.block.ms for the topic's metadata (the
    topic is gone), counting the sends."""

    sends = 0

    def send(self, *args, **kw):
        from kafka.errors import KafkaTimeoutError

        self.sends += 1
        raise KafkaTimeoutError("Failed to update metadata after 10.0 secs.")

    def flush(self, timeout=None):
        pass

    def close(self, timeout=None):
        pass


def test_a_topic_without_metadata_fails_the_rest_of_the_task_without_waiting_again():
    """Each send to a topic whose metadata cannot be had blocks max.block.ms: the first
    one's answer is every row's, or a task of a few thousand rows waits hours."""
    import pyarrow as pa

    from ackstream.sinks.kafka import ProduceTask
    from ackstream.vocabulary.lineage import REASON

    producer = _NoMetadata()

    class Task(ProduceTask):
        def _producer(self):
            return producer

    task = Task("127.0.0.1:9", "gone", None, "value", ("value",), {}, 1.0)
    batch = pa.RecordBatch.from_pydict({"value": [b"a", b"b", b"c"]})
    (back,) = list(task(iter([batch])))
    assert producer.sends == 1
    reasons = back.column(REASON).to_pylist()
    assert len(reasons) == 3 and all("Failed to update metadata" in r for r in reasons)
