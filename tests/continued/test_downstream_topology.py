"""A downstream ackstream topology continues the trees an upstream one left open: one
batch of each on the test broker (its records, settled with the upstream's, say what
became of each upstream root), then both as streaming queries end to end."""

import uuid

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from ackstream import KafkaSink, MemorySink, Topology
from ackstream.channels.kafka import KafkaChannel
from ackstream.testing import settle, tracked_frame, with_lineage

from helpers import consume, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def topic_frame(spark, bootstrap, topic, expected):
    """``topic``'s messages as the downstream source reads them: with headers and its
    own (local) lineage columns."""
    messages = []
    wait_for(lambda: messages.extend(consume(bootstrap, topic)) or len(messages) >= expected)
    rows = [
        (m.key, m.value, m.topic, m.partition, m.offset, [(k, v) for k, v in m.headers] or None)
        for m in messages
    ]
    schema = (
        "key binary, value binary, topic string, partition int, offset long, "
        "headers array<struct<key: string, value: binary>>"
    )
    return with_lineage(spark.createDataFrame(rows, schema), source="down")


def both(upstream: pa.Table, downstream: pa.Table) -> pa.Table:
    return pa.concat_tables([upstream, downstream.select(upstream.column_names)])


def test_a_downstream_batch_acks_or_fails_the_upstream_roots(spark, broker, new_topic):
    middle = new_topic()
    lines = ["a b", "b c", "c"]
    upstream = (
        Topology("up", spark, None)
        .explode(F.split(F.col("value"), " "), "word")
        .aggregate("word", F.count("*").alias("n"))
        .map(lambda df: df.selectExpr("*", "word AS key", "word AS value"))
        .sink(KafkaSink(broker.bootstrap, middle, continue_trees=True))
    )
    frame = tracked_frame(spark, lines)
    r = [row["_root"] for row in frame.orderBy("offset").collect()]
    up_records = upstream.run_batch(frame)
    sent = topic_frame(spark, broker.bootstrap, middle, 3)
    # a record without lineage is processed untracked: it changes no upstream root
    stray = with_lineage(
        spark.createDataFrame(
            [(None, b"stray", middle, 0, 99, None)],
            sent.drop("_root", "_edge", "_attempt").schema,
        ),
        source="down",
    )

    def downstream(fail_word=None):
        topology = Topology("down", spark, None, continue_trees=True).map(
            lambda df: df.withColumn("word", F.col("value").cast("string"))
        )
        if fail_word:
            topology = topology.fail_where(F.col("word") == fail_word, "no " + fail_word)
        return topology.sink(MemorySink())

    clean = downstream().run_batch(sent.unionByName(stray))
    assert settle(both(up_records, clean)) == {root: "acked" for root in r}
    # "c" (anchored to the 2nd and 3rd lines) fails downstream: those roots fail upstream
    failing = downstream("c").run_batch(sent)
    assert settle(both(up_records, failing)) == {r[0]: "acked", r[1]: "failed", r[2]: "failed"}
    assert settle(up_records) == {root: "pending" for root in r}


def test_two_queries_every_upstream_record_is_acked_once_downstream_wrote_it(
    spark, broker, new_topic, tmp_path
):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    inbox, middle, outbox = new_topic(), new_topic(), new_topic()
    up, down = (f"{side}-{uuid.uuid4().hex[:8]}" for side in ("up", "down"))
    n = 20
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for i in range(n):
        producer.send(inbox, value=f"r{i}".encode())
    producer.flush()
    producer.close()
    channel = KafkaChannel(broker.bootstrap, up)
    upstream = (
        Topology(up, spark, channel, message_timeout_ms=60_000)
        .map(lambda df: df.withColumn("value", F.upper(F.col("value").cast("string"))))
        .sink(KafkaSink(broker.bootstrap, middle, continue_trees=True))
    )
    downstream = (
        Topology(down, spark, KafkaChannel(broker.bootstrap, up), continue_trees=True)
        .map(lambda df: df.withColumn("value", F.lower(F.col("value").cast("string"))))
        .sink(KafkaSink(broker.bootstrap, outbox))
    )
    options = {"kafka.bootstrap.servers": broker.bootstrap, "startingOffsets": "earliest"}
    first = upstream.start(
        upstream.read_stream({**options, "subscribe": inbox}),
        str(tmp_path / "up"),
        trigger_ms=300,
    )
    group = KafkaConsumer(
        bootstrap_servers=broker.bootstrap, group_id=f"ackstream-{up}", enable_auto_commit=False
    )
    inbox_partition = TopicPartition(inbox, 0)
    second = None
    try:
        # nothing reads the middle topic yet: the upstream trees stay open
        wait_for(
            lambda: len(consume(broker.bootstrap, middle)) == n or first.exception(),
            timeout=150,
            what="the middle topic",
        )
        assert first.exception() is None
        assert group.committed(inbox_partition) in (None, 0)  # the group's start, at most
        second = downstream.start(
            downstream.read_stream({**options, "subscribe": middle}),
            str(tmp_path / "down"),
            trigger_ms=300,
        )
        wait_for(
            lambda: (
                group.committed(inbox_partition) == n or first.exception() or second.exception()
            ),
            timeout=150,
            interval=0.5,
            what="every upstream offset committed",
        )
        assert first.exception() is None and second.exception() is None
    finally:
        first.stop()
        if second is not None:
            second.stop()
        group.close(autocommit=False)
    written = sorted(m.value.decode() for m in consume(broker.bootstrap, outbox))
    assert written == sorted(f"r{i}" for i in range(n))
    done, _ = channel.completions_since(None)
    assert sorted((r["offset"], r["status"]) for r in done.to_pylist()) == [
        (i, "acked") for i in range(n)
    ]


def test_a_downstream_topology_cannot_yet_continue_the_trees_again():
    from ackstream.errors import OptionError

    channel = KafkaChannel("127.0.0.1:9", "up")  # makes no connection until used
    topology = Topology("down", None, channel, continue_trees=True)
    with pytest.raises(OptionError, match="third process"):
        topology.sink(KafkaSink("127.0.0.1:9", "next", continue_trees=True))
    assert topology.source_options()["includeHeaders"] == "true"
    assert topology.source_options()["ackstream.tracking"] == "false"
