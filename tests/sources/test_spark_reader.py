"""Spark's Kafka source reading a batch's new ranges gives the Python reader's rows."""

import pytest

from ackstream.config.source import parse
from ackstream.sources.kafka import KafkaUpstream
from ackstream.sources.kafka_ranges import read_ranges
from ackstream.sources.rows import ReadTask, too_big_reason
from ackstream.sources.spark_reader import read_new_ranges
from ackstream.spark.session import has_kafka_connector

from helpers import logged_offset, produce

pytestmark = [pytest.mark.broker]


@pytest.fixture
def connector(spark):
    if not has_kafka_connector(spark):
        pytest.skip("Spark's Kafka connector is not on this session's class path")


def test_both_readers_give_the_same_rows_and_roots_and_refuse_the_same_values(
    spark, connector, broker, new_topic
):
    """Root, edge and attempt by the same hash, the same columns and values. A value over
    ``ackstream.maxValueBytes``: the Python reader holds it back with its reason; Spark's
    fails the job that reads it, with the same reason and the record's place, and a job
    that does not read values is not stopped by it."""
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
    offset = logged_offset(ids=config.id_namespace, read={topic: {"0": [2, 15], "1": [0, 15]}})
    columns = ["partition", "offset", "key", "value", "headers", "_root", "_edge", "_attempt"]

    by_spark = read_new_ranges(spark, config, offset)
    assert by_spark is not None
    assert "_reason" not in by_spark.columns
    small = by_spark.where("NOT (partition = 1 AND offset = 3)")  # record 7 left out
    spark_rows = {
        (r["partition"], r["offset"]): r.asDict() for r in small.select(*columns).collect()
    }
    lineage = by_spark.select("partition", "offset", "_root", "_edge", "_attempt").collect()
    upstream = KafkaUpstream(config)
    python_rows = {}
    for task in (ReadTask(topic, 0, 2, 15), ReadTask(topic, 1, 0, 15)):
        for batch in upstream.read(task):
            for row in batch.select([*columns, "_reason"]).to_pylist():
                python_rows[(row["partition"], row["offset"])] = row
    upstream.close()

    assert len(python_rows) == len(lineage) == 13 + 15
    for r in lineage:
        row = python_rows[(r["partition"], r["offset"])]
        assert (r["_root"], r["_edge"], r["_attempt"]) == (
            row["_root"],
            row["_edge"],
            row["_attempt"],
        )
    reason = python_rows.pop((1, 3))["_reason"]  # record 7: partition 1, offset 3
    assert reason == too_big_reason(300, 100)
    assert sorted(spark_rows) == sorted(python_rows)
    for at, row in python_rows.items():
        mine = spark_rows[at]
        assert row["_reason"] is None
        assert mine["key"] == row["key"] and mine["value"] == row["value"]
        assert [(h["key"], bytes(h["value"])) for h in mine["headers"]] == [
            (h["key"], h["value"]) for h in row["headers"]
        ]
    with pytest.raises(Exception) as failed:
        by_spark.select("value").collect()
    assert f"record {topic}-1 at offset 3: {reason}" in str(failed.value)


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
    offset = logged_offset(ids=config.id_namespace, read={topic: {"0": [0, 2]}})
    frame = read_new_ranges(spark, config, offset)
    assert frame is not None
    assert "_reason" not in frame.columns
    assert sorted(len(row["value"]) for row in frame.collect()) == [5, 300]


def test_with_no_size_limit_no_row_is_held_back_by_either_reader(
    spark, connector, broker, new_topic
):
    """``ackstream.maxValueBytes=none``, tracked: a big value is read like any other by
    both readers, and Spark's rows carry no ``_reason`` column for the batch to count."""
    from kafka import KafkaProducer
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    topic = new_topic()
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:  # the topic takes a value over the default 16 MB limit
        resource = ConfigResource(
            ConfigResourceType.TOPIC, topic, {"max.message.bytes": "20000000"}
        )
        admin.alter_configs([resource])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, max_request_size=20_000_000)
    for value in (b"small", b"x" * (17 << 20)):
        producer.send(topic, value=value, partition=0)
    producer.flush()
    producer.close()
    config = _config(broker, topic, **{"ackstream.maxValueBytes": "none"})
    offset = logged_offset(ids=config.id_namespace, read={topic: {"0": [0, 2]}})
    frame = read_new_ranges(spark, config, offset)
    assert frame is not None
    assert "_reason" not in frame.columns
    assert sorted(len(row["value"]) for row in frame.collect()) == [5, 17 << 20]
    upstream = KafkaUpstream(config)
    try:
        rows = [
            row for batch in upstream.read(ReadTask(topic, 0, 0, 2)) for row in batch.to_pylist()
        ]
    finally:
        upstream.close()
    assert [(len(row["value"]), row["_reason"]) for row in rows] == [(5, None), (17 << 20, None)]


def _plan(frame, capsys) -> str:
    capsys.readouterr()
    frame.explain(extended=True)
    return capsys.readouterr().out


def _config(broker, topic: str, **options: str):
    return parse(
        {
            "kafka.bootstrap.servers": broker.bootstrap,
            "subscribe": topic,
            "ackstream.recordReader": "spark",
            **options,
        }
    )


def _produce(broker, topic: str, count: int, partitions: int = 1) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for i in range(count):
        producer.send(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % partitions)
    producer.flush()
    producer.close()


def test_the_new_ranges_are_read_by_the_connector_s_record_rdd_without_planning_a_read(
    spark, connector, broker, new_topic, capsys
):
    """No Kafka relation, version 1 or 2, in the plan: each of those plans a read (an
    admin client asking the brokers) every time a plan holds it."""
    topic = new_topic()
    _produce(broker, topic, 3)
    config = _config(broker, topic)
    offset = logged_offset(ids=config.id_namespace, read={topic: {"0": [1, 3]}})
    frame = read_new_ranges(spark, config, offset)
    assert frame is not None
    plan = _plan(frame, capsys)
    assert "ExistingRDD" in plan
    assert "KafkaRelation" not in plan and "KafkaScan" not in plan
    assert sorted(r["value"] for r in frame.collect()) == [b"v1", b"v2"]


@pytest.mark.parametrize("headers", [False, True])
def test_the_record_rdd_gives_the_rows_spark_s_kafka_source_gives(
    spark, connector, broker, new_topic, headers
):
    """Every column of every row, as ``spark.read.format("kafka")`` reads the same
    ranges (headers or not)."""
    import json

    topic = new_topic(partitions=2)
    _produce(broker, topic, 40, partitions=2)
    config = _config(broker, topic, includeHeaders=str(headers).lower())
    ranges = [(topic, 0, 3, 17), (topic, 1, 0, 20)]
    mine = read_ranges(spark, config, ranges)
    theirs = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("assign", json.dumps({topic: [0, 1]}))
        .option("startingOffsets", json.dumps({topic: {"0": 3, "1": 0}}))
        .option("endingOffsets", json.dumps({topic: {"0": 17, "1": 20}}))
        .option("includeHeaders", str(headers).lower())
        .load()
    )
    assert mine.schema == theirs.schema
    assert mine.count() == 14 + 20
    assert mine.exceptAll(theirs).count() == 0 and theirs.exceptAll(mine).count() == 0


def test_options_that_split_ranges_read_through_spark_s_version_2_source(
    spark, connector, broker, new_topic, capsys
):
    """``minPartitions`` splits a range into tasks as Spark's source does, so such reads
    go through it: version 2 (version 1 plans a nested SQL execution for every read),
    and the session's own choice of version 1 sources is left as it was."""
    before = spark.conf.get("spark.sql.sources.useV1SourceList")
    assert "kafka" in before  # Spark's default: else this test proves nothing
    topic = new_topic()
    _produce(broker, topic, 8)
    config = _config(broker, topic, minPartitions="4")
    offset = logged_offset(ids=config.id_namespace, read={topic: {"0": [0, 8]}})
    frame = read_new_ranges(spark, config, offset)
    assert frame is not None
    plan = _plan(frame, capsys)
    assert "RelationV2" in plan and "KafkaRelation" not in plan
    assert spark.conf.get("spark.sql.sources.useV1SourceList") == before
    assert frame.rdd.getNumPartitions() >= 4
    assert frame.count() == 8


def test_an_offset_naming_no_new_range_reads_nothing(spark, connector, broker, new_topic):
    config = parse(
        {
            "kafka.bootstrap.servers": broker.bootstrap,
            "subscribe": new_topic(),
            "ackstream.recordReader": "spark",
        }
    )
    assert read_new_ranges(spark, config, logged_offset(replays=[["t", 0, 3, 1]])) is None


@pytest.mark.parametrize("given", [None, "250"])
def test_the_record_rdd_s_consumers_do_not_wait_for_new_records_unless_told_to(
    spark, connector, given
):
    """Its ranges are written already: a fetch held back for new records only delays
    the next one. A ``kafka.fetch.max.wait.ms`` the source was given wins."""
    from ackstream.sources.kafka_ranges import RecordRdd

    options = {"kafka.fetch.max.wait.ms": given} if given else {}
    config = parse(
        {
            "kafka.bootstrap.servers": "127.0.0.1:9",
            "subscribe": "t",
            "ackstream.recordReader": "spark",
            **options,
        }
    )
    params = RecordRdd.of(spark, config).params
    assert params.get("fetch.max.wait.ms") == (given or "10")
    assert params.get("group.id").startswith("spark-kafka-ackstream-")


def test_replays_are_read_by_spark_with_the_python_reader_s_rows(
    spark, connector, broker, new_topic
):
    """A failed batch's replays (runs of offsets at their attempts) read by Spark's reader
    carry the same roots, edges and attempts as the Python reader's, exactly the records
    replayed, whether a partition's runs are a few (filtered by their bounds) or many
    (scattered failures: filtered by a join); a record replayed alone stays with the
    Python reader."""
    from ackstream.sources.offsets import read_tasks, spark_reads_replays
    from ackstream.sources.spark_reader import read_replays

    topic = new_topic(partitions=2)
    produce(broker.bootstrap, topic, [f"v{i}" for i in range(200)], round_robin=2)
    config = parse(
        {
            "kafka.bootstrap.servers": broker.bootstrap,
            "subscribe": topic,
            "ackstream.topology": "replays",
            "ackstream.recordReader": "spark",
        }
    )
    assert not spark_reads_replays([[topic, 0, 2, 3, 1]])  # alone: the Python reader's
    few = [[topic, 0, 2, 6, 1], [topic, 0, 9, 12, 3], [topic, 1, 0, 20, 2], [topic, 0, 14, 15, 1]]
    many = [[topic, p, o, o + 1, 1 + o % 2] for p in (0, 1) for o in range(0, 100, 3)]
    columns = ["partition", "offset", "value", "_root", "_edge", "_attempt"]
    upstream = KafkaUpstream(config)
    try:
        for runs in (few, many):
            assert spark_reads_replays(runs)
            offset = logged_offset(ids=config.id_namespace, replays=runs, replays_by="spark")
            assert not [t for t in read_tasks(offset) if t.replays]  # no read task reads them
            by_spark = {
                (r["partition"], r["offset"]): r.asDict()
                for r in read_replays(spark, config, offset).select(*columns).collect()
            }
            wanted = {(p, o): att for _, p, lo, hi, att in offset.replays for o in range(lo, hi)}
            assert sorted(by_spark) == sorted(wanted)
            python = {}
            for task in read_tasks(logged_offset(replays=runs)):
                for batch in upstream.read(task):
                    for row in batch.select(columns).to_pylist():
                        python[(row["partition"], row["offset"])] = row
            assert python == by_spark
            assert {at: row["_attempt"] for at, row in by_spark.items()} == wanted
    finally:
        upstream.close()
