"""The end-to-end run on the broker: sentences -> split -> count -> Kafka sink, with the
ack and completion channels on Kafka too, on either record reader."""

import uuid

import pytest
from pyspark.sql import functions as F

from ackstream import KafkaSink, Topology
from ackstream.channels.kafka import KafkaChannel
from ackstream.spark.session import has_kafka_connector
from ackstream.storage.offset_log import logged_offsets

from helpers import (
    consume,
    from_earliest,
    group_commits,
    producer_threads,
    sentences,
    stop_once_settled,
    wait_for,
)

pytestmark = [pytest.mark.spark, pytest.mark.broker, pytest.mark.e2e]


@pytest.mark.parametrize("reader", ["spark", "python"])
def test_every_offset_ends_committed_every_word_is_written_and_the_poison_is_dead_lettered(
    spark, broker, new_topic, tmp_path, reader
):
    """``spark``: Spark's Kafka source reads the new records (what ``read_stream``
    chooses when the connector is there), the Python read tasks the replays. A value
    over ``ackstream.maxValueBytes`` is rejected, never seen by a stage: the Python
    reader holds it back; Spark's fails its batch (here every record's first), whose
    records are replayed apart, and the Python reader then holds it back. Attempts
    therefore start at 1 with Spark's reader."""
    if reader == "spark" and not has_kafka_connector(spark):
        pytest.skip("Spark's Kafka connector is not on this session's class path")
    from kafka import KafkaProducer

    inbox, outbox = new_topic(partitions=2), new_topic(partitions=1)
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    lines = sentences(60)
    poison_at = 17
    lines[poison_at] = "poison pill sentence"
    huge_at = 30
    lines[huge_at] = " ".join(["huge"] * 300)  # 1,499 bytes
    first = 1 if reader == "spark" else 0  # the first attempt that reaches the stages
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for i, line in enumerate(lines):
        producer.send(inbox, value=line.encode(), partition=i % 2)
    producer.flush()
    producer.close()

    def refuse_poison(frame):
        """A pandas bolt that always fails on the poison word."""
        if (frame["word"] == "poison").any():
            raise ValueError("poison word")
        return frame[["word"]]

    topology = (
        Topology(name, spark, KafkaChannel(broker.bootstrap, name), message_timeout_ms=10_000)
        .map(lambda df: df.withColumn("line", F.col("value").cast("string")))
        .explode(F.split("line", " "), "word")
        .fail_where((F.col("_attempt") == first) & (F.rand(seed=7) < 0.05), name="flaky")
        .pandas_bolt(refuse_poison, "word string", name="refuse_poison")
        .aggregate("word", F.count("*").cast("string").alias("n"))
        .map(lambda df: df.withColumn("key", F.col("word")).withColumn("value", F.col("n")))
        .sink(KafkaSink(broker.bootstrap, outbox))
    )
    options = {
        "ackstream.sourceTimeout": "90s",
        "ackstream.retryInitialDelay": "200ms",
        "ackstream.maxRetries": "2",
        "ackstream.maxValueBytes": "1000",
        **({"ackstream.recordReader": "python"} if reader == "python" else {}),
    }
    stream = topology.read_stream(from_earliest(broker.bootstrap, inbox, **options))
    before = producer_threads()
    running = topology.start(stream, str(tmp_path / "checkpoint"), trigger_ms=300)
    stop_once_settled(running, len(lines), timeout_s=150)
    # the stopped topology leaves no producer behind: a producer's thread outliving
    # its brokers spins a core
    wait_for(lambda: not producer_threads() - before, timeout=10, what="producers closed")
    assert group_commits(broker.bootstrap, name, inbox) == {0: 30, 1: 30}

    logged = logged_offsets(spark, str(tmp_path / "checkpoint" / "topology"), 0)
    assert [offset.spark_reads_new for offset in logged] == [reader == "spark"]

    written = {m.key.decode() for m in consume(broker.bootstrap, outbox)}
    expected = {w for line in lines for w in line.split()} - {"poison", "huge"}
    assert expected <= written
    assert "poison" not in written and "huge" not in written

    done, _ = KafkaChannel(broker.bootstrap, name).completions_since(None)
    failed = {
        (r["partition"], r["offset"], r["attempt"])
        for r in done.to_pylist()
        if r["status"] == "failed"
    }
    poison = (poison_at % 2, poison_at // 2)
    assert {(p, o, a) for p, o, a in failed if (p, o) == poison} == {
        (*poison, a) for a in (first, first + 1, first + 2)
    }
    assert any((p, o) != poison for p, o, _ in failed), "the flaky bolt failed nothing"

    letters = {
        int(dict(m.headers)["ackstream.offset"]): m
        for m in consume(broker.bootstrap, f"{name}.dead")
    }
    assert sorted(letters) == sorted([poison_at // 2, huge_at // 2])
    huge = letters.pop(huge_at // 2)
    assert not huge.value  # a value too big is dead-lettered without it (keyless: b"")
    reason = dict(huge.headers)["ackstream.reason"].decode()
    assert reason.startswith("rejected: value of 1499 bytes is over ackstream.maxValueBytes")
    (letter,) = letters.values()
    headers = {k: v.decode() for k, v in letter.headers}
    assert letter.value == lines[poison_at].encode()
    assert headers["ackstream.offset"] == str(poison_at // 2)
    # the bolt's error on the last attempt, named with its stage
    assert headers["ackstream.reason"] == "failed: refuse_poison: ValueError: poison word"
