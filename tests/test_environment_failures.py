"""The world changes under a running topology. Each case ends in a clear
outcome (an error naming what happened, a dead letter with its reason, or
back-pressure), never in a hang or a silent loss."""

from __future__ import annotations

import shutil
import uuid

import pytest
from pyspark.sql import functions as F

from ackstream import MemorySink, Topology
from ackstream.channels.local import LocalChannel
from ackstream.errors import AckstreamError
from ackstream.storage.offset_log import logged_offsets
from ackstream.testing import wait_until_settled
from ackstream.vocabulary.batch_offset import BatchOffset

from helpers import (
    commits,
    consume,
    group_commits,
    stop_once_settled,
    tracked_kafka_stream,
    wait_for,
)

pytestmark = [pytest.mark.spark]


def kafka_stream(spark, bootstrap, topic, name, channel_dir, **options):
    """The source of ``name`` on ``topic``, its tuples timed out after 20 s."""
    options = {"ackstream.messageTimeout": "20s", **options}
    return tracked_kafka_stream(spark, bootstrap, topic, name, channel_dir, **options)


def produce(bootstrap, topic, values, max_request_size=1 << 20):
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, max_request_size=max_request_size)
    for value in values:
        producer.send(topic, value=value, partition=0)
    producer.flush()
    producer.close()


@pytest.mark.broker
def test_a_topic_deleted_mid_run_stops_the_query_naming_it(spark, broker, new_topic, tmp_path):
    from kafka.admin import KafkaAdminClient

    inbox, name = new_topic(partitions=1), f"gone-{uuid.uuid4().hex[:8]}"
    produce(broker.bootstrap, inbox, [b"a", b"b", b"c"])
    sink = MemorySink()
    channel = tmp_path / "channel"
    running = (
        Topology(name, spark, LocalChannel(channel), message_timeout_ms=20_000)
        .sink(sink)
        .start(
            kafka_stream(spark, broker.bootstrap, inbox, name, channel),
            str(tmp_path / "checkpoint"),
            trigger_ms=300,
        )
    )
    try:
        wait_until_settled(running, records=3, timeout_s=90)
        assert group_commits(broker.bootstrap, name, inbox) == {0: 3}
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        try:
            admin.delete_topics([inbox])
        finally:
            admin.close()
        # named within seconds: it once took 155 s, as an outage of the brokers
        error = wait_for(running.exception, timeout=30, interval=0.5, what="the query to fail")
    finally:
        running.stop()
    assert f"topic {inbox!r} (option subscribe)" in str(error), error
    assert "deleted" in str(error), error


def test_a_checkpoint_deleted_mid_run_is_an_error_naming_it(spark, tmp_path):
    channel, checkpoint = tmp_path / "channel", tmp_path / "checkpoint"
    sink = MemorySink()
    topology = Topology("lost-checkpoint", spark, LocalChannel(channel)).sink(sink)
    stream = topology.read_stream(generator_options(100_000))
    running = topology.start(stream, str(checkpoint), trigger_ms=300)
    try:
        wait_for(
            lambda: commits(channel) or running.exception(),
            timeout=90,
            interval=0.5,
            what="the first commit",
        )
        assert running.exception() is None, running.exception()
        shutil.rmtree(checkpoint)
        error = wait_for(running.exception, timeout=120, interval=0.5, what="the query to fail")
    finally:
        running.stop()
    # Spark's own error when the deletion lands in its write, ours between batches
    assert f"{checkpoint}/topology" in str(error), error


def test_a_batch_of_a_deleted_checkpoint_is_refused_naming_it(tmp_path):
    """Spark re-creates the offset log of a deleted checkpoint as it goes; the batch
    reading it back sees the query's metadata file gone and stops the query."""
    offsets = tmp_path / "offsets"
    offsets.mkdir()
    (offsets / "0").write_text('v1\n{}\n{"v": 1, "parts": {}}\n')
    with pytest.raises(AckstreamError, match=f"the checkpoint {tmp_path} was deleted"):
        logged_offsets(None, str(tmp_path), 0)
    (tmp_path / "metadata").write_text('{"id": "q"}\n')
    assert logged_offsets(None, str(tmp_path), 0) == [BatchOffset({})]


def generator_options(count: int, **options) -> dict:
    return {"ackstream.upstream": "generator", "ackstream.generator.count": count, **options}


@pytest.mark.broker
def test_a_20_mb_record_is_dead_lettered_with_its_reason(spark, broker, tmp_path):
    """A 20 MB record over ``maxValueBytes`` (16 MB by default) is rejected at once; a
    5 MB one is read, but too big for the sink's producers (the default 1 MB request),
    so it is replayed and then dead-lettered, its value dropped (the dead-letter topic
    refuses it too; the record stays upstream). Records around them go on."""
    from kafka.admin import KafkaAdminClient, NewTopic

    from ackstream import KafkaSink

    name = f"huge-{uuid.uuid4().hex[:8]}"
    inbox, outbox = f"{name}-in", f"{name}-out"
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.create_topics(
            [
                NewTopic(inbox, 1, 1, topic_configs={"max.message.bytes": str(32 << 20)}),
                NewTopic(outbox, 1, 1),
            ]
        )
    finally:
        admin.close()
    huge, big = b"h" * (20 << 20), b"b" * (5 << 20)
    produce(broker.bootstrap, inbox, [b"a", huge, b"c", big, b"e"], max_request_size=32 << 20)

    channel = tmp_path / "channel"
    stream = kafka_stream(
        spark,
        broker.bootstrap,
        inbox,
        name,
        channel,
        **{
            "ackstream.deadLetterTopic": f"{name}.dead",
            "ackstream.maxRetries": "1",
            "ackstream.retryInitialDelay": "200ms",
        },
    )
    running = (
        Topology(name, spark, LocalChannel(channel), message_timeout_ms=20_000)
        .map(lambda df: df.withColumn("key", F.lit(None).cast("binary")))
        .sink(KafkaSink(broker.bootstrap, outbox))
        .start(stream, str(tmp_path / "checkpoint"), trigger_ms=300)
    )
    stop_once_settled(running, 5, timeout_s=180)
    assert group_commits(broker.bootstrap, name, inbox) == {0: 5}

    # the 5 MB row fails Spark's write of its batch, which is then written row by row:
    # rows that job had written are there twice (at-least-once), the big one never
    assert set(m.value for m in consume(broker.bootstrap, outbox)) == {b"a", b"c", b"e"}
    letters = {}
    for message in consume(broker.bootstrap, f"{name}.dead"):
        headers = {k: v.decode() for k, v in message.headers}
        letters[int(headers["ackstream.offset"])] = (headers, message.value)
    assert sorted(letters) == [1, 3]
    assert letters[1][0]["ackstream.reason"] == (
        f"rejected: value of {len(huge)} bytes is over ackstream.maxValueBytes "
        f"({16 << 20}); raise that option to process it"
    )
    assert letters[1][0]["ackstream.attempts"] == "1"
    assert "MessageSizeTooLargeError" in letters[3][0]["ackstream.reason"], letters[3][0]
    assert letters[3][0]["ackstream.attempts"] == "2"
    assert letters[3][1] in (None, b"")  # too big for the dead-letter topic: left upstream
    assert letters[3][0]["ackstream.dropped"] == (
        f"value of {len(big)} bytes: too large for {name}.dead; the record stays in {inbox}"
    )


class CountingSink(MemorySink):
    """A memory sink that also keeps the number of rows of each batch."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def write(self, outputs, batch_id):
        self.sizes.append(outputs.count())
        return super().write(outputs, batch_id)


def burst(spark, tmp_path, records: int, max_pending: int, timeout: float):
    """``records`` available at once, at most ``max_pending`` in flight: each batch holds
    no more, and every record arrives (acks go through the acker query, per stage, so
    the source really waits for them)."""
    channel = tmp_path / "channel"
    sink = CountingSink()
    topology = Topology(
        "burst", spark, LocalChannel(channel), ack_mode="per_stage", message_timeout_ms=60_000
    ).sink(sink)
    stream = topology.read_stream(
        generator_options(records, **{"ackstream.maxPending": max_pending})
    )
    running = topology.start(stream, str(tmp_path / "checkpoint"), trigger_ms=200)
    stop_once_settled(running, records, timeout)
    assert max(sink.sizes) <= max_pending, sink.sizes
    assert len(sink.sizes) >= records // max_pending
    assert sum(commits(channel).values()) == records
    assert len({(r["partition"], r["offset"]) for r in sink.rows()}) == records


def test_a_burst_over_max_pending_is_held_back(spark, tmp_path):
    burst(spark, tmp_path, records=2_000, max_pending=500, timeout=120)


@pytest.mark.long
def test_a_burst_of_500000_records_is_held_back(spark, tmp_path):
    burst(spark, tmp_path, records=500_000, max_pending=20_000, timeout=1_800)
