"""The acker on a Kafka channel: one ledger per partition of the acks topic, run by the
task that reads the partition; the driver gets one summary row per shard."""

import time
import uuid

import pytest
from kafka import KafkaConsumer, TopicPartition

from ackstream.acker.query import start_acker
from ackstream.acker.shards import ShardLedger
from ackstream.channels.kafka import KafkaChannel
from ackstream.channels.local import LocalChannel
from ackstream.channels.messages import decode
from ackstream.errors import OptionError
from ackstream.testing import TupleGraph, ack_records
from ackstream.vocabulary.records import (
    ACK_RECORD_SCHEMA,
    ACKED,
    CAUGHT_UP,
    TIMED_OUT,
    as_table,
    tick,
)

from helpers import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def trees(roots, *, leave_open=()):
    """Ack records of a spout tuple with two children per root, written as two halves;
    the roots in ``leave_open`` miss their last ack."""
    g, first, second = TupleGraph(seed=7), [], []
    for root in roots:
        spout = g.spout(root, topic="events", partition=0, offset=root)
        a, b = g.emit([spout]), g.emit([spout])
        first += g.ack(spout) + g.ack(a)
        second += [] if root in leave_open else g.ack(b)
    return g.init_records(ts=int(time.time() * 1000)) + first, second


@pytest.fixture
def channel(broker):
    made = KafkaChannel(broker.bootstrap, f"shards-{uuid.uuid4().hex[:8]}", partitions=2)
    made.prepare()
    yield made
    made.close()


def partition_roots(channel):
    """The roots of the ack records in each partition of the acks topic."""
    consumer = KafkaConsumer(bootstrap_servers=channel.bootstrap, consumer_timeout_ms=3_000)
    found = {}
    for partition in (0, 1):
        tp = TopicPartition(channel.acks_topic, partition)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        for message in consumer:
            table = decode(message.value, ACK_RECORD_SCHEMA, "t", partition, message.offset)
            found.setdefault(partition, set()).update(table.column("root").to_pylist())
    consumer.close()
    return found


def test_every_ack_record_of_a_root_goes_to_the_partition_of_its_shard(channel):
    first, second = trees(range(1, 21))
    channel.write_acks(ack_records(first))
    channel.write_acks(ack_records(second))
    found = partition_roots(channel)
    assert found == {0: set(range(2, 21, 2)), 1: set(range(1, 21, 2))}


def test_each_shard_settles_its_own_roots_and_the_driver_sees_a_row_per_shard(
    spark, channel, tmp_path
):
    first, second = trees(range(1, 41))
    channel.write_acks(ack_records(first))
    seen, position = [], None
    query = start_acker(spark, channel, checkpoint=str(tmp_path / "ck"), ackers=2, trigger_ms=100)
    try:
        channel.write_acks(ack_records(second))

        def all_acked():
            nonlocal position
            table, position = channel.completions_since(position)
            seen.extend(table.to_pylist())
            return len([c for c in seen if c["status"] == ACKED]) >= 40

        wait_for(all_acked, what="40 acked roots")
        rows = wait_for(  # a batch's progress comes after its shards wrote completions
            lambda: [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]],
            what="the batches' progress",
        )
    finally:
        query.stop()
    assert sorted(c["root"] for c in seen if c["status"] == ACKED) == list(range(1, 41))
    # the source's rows are the shards' summaries, never the 160 ack records
    assert rows and set(rows) == {2}
    assert sorted(p.name for p in (tmp_path / "ck").iterdir() if p.name.startswith("shard-")) == [
        "shard-0",
        "shard-1",
    ]


def test_a_restart_keeps_each_shards_pending_roots_and_an_idle_shard_times_out_its_own(
    spark, channel, tmp_path
):
    """Root 9 (shard 1) misses an ack; the ticks that wake the acker go to shard 0, and
    shard 1 still times root 9 out, after a restart between the two halves."""
    first, second = trees(range(1, 11), leave_open={9})
    channel.write_acks(ack_records(first))
    checkpoint = str(tmp_path / "ck")
    query = start_acker(
        spark, channel, checkpoint=checkpoint, ackers=2, message_timeout_ms=4_000, trigger_ms=100
    )
    try:
        wait_for(lambda: query.lastProgress and query.lastProgress["batchId"] >= 0, what="a batch")
    finally:
        query.stop()
    channel.write_acks(ack_records(second))
    seen, position, ticks = [], None, []
    query = start_acker(
        spark, channel, checkpoint=checkpoint, ackers=2, message_timeout_ms=4_000, trigger_ms=100
    )

    def timed_out():
        nonlocal position
        ticks.append(int(time.time() * 1000))
        channel.write_acks(tick(ticks[-1]))  # root 0: shard 0
        table, position = channel.completions_since(position)
        seen.extend(table.to_pylist())
        echoed = any(c["status"] == CAUGHT_UP for c in seen)  # may come a batch later
        return echoed and [c for c in seen if c["status"] == TIMED_OUT]

    try:
        rows = wait_for(timed_out, interval=1.0, what="root 9 to time out, a tick echoed")
    finally:
        query.stop()
    assert [(c["root"], c["offset"]) for c in rows] == [(9, 9)]
    assert sorted(c["root"] for c in seen if c["status"] == ACKED) == [
        r for r in range(1, 11) if r != 9
    ]
    echoes = [c["completed_ms"] for c in seen if c["status"] == CAUGHT_UP]
    assert echoes and set(echoes) <= set(ticks)


def test_ackers_other_than_the_acks_topics_partitions_is_an_error_naming_it(
    spark, channel, tmp_path
):
    with pytest.raises(OptionError, match="ackers.*3.*2, the partitions of the acks topic"):
        start_acker(spark, channel, checkpoint=str(tmp_path / "ck"), ackers=3)


def test_a_partition_added_to_the_acks_topic_stops_the_acker_naming_ackers(
    spark, channel, tmp_path
):
    from kafka.admin import KafkaAdminClient, NewPartitions

    query = start_acker(spark, channel, checkpoint=str(tmp_path / "ck"), ackers=2, trigger_ms=100)
    try:
        admin = KafkaAdminClient(bootstrap_servers=channel.bootstrap)
        admin.create_partitions({channel.acks_topic: NewPartitions(3)})
        admin.close()
        channel.close()  # its producer learns of the third partition afresh
        first, _ = trees(range(1, 31))
        channel.write_acks(ack_records(first))
        wait_for(lambda: not query.isActive, what="the acker to stop")
    finally:
        query.stop()
    assert "ackers" in str(query.exception()) and "partition 2" in str(query.exception())


def test_a_shard_batch_run_again_yields_the_same_completions(tmp_path):
    """A batch Spark runs again after a crash starts the shard from the table the batch
    before it left, whatever the first run saved."""
    first, second = (
        as_table(ack_records(half), ACK_RECORD_SCHEMA) for half in trees(range(2, 21, 2))
    )
    channel = LocalChannel(tmp_path / "channel")
    ledger = ShardLedger(channel, str(tmp_path / "ck"), 60_000)
    assert ledger(first, 0, 0, 1_000)[1:4] == (first.num_rows, 0, 10)
    once = ledger(second, 0, 1, 2_000)
    again = ledger(second, 0, 1, 2_000)
    assert once == again and once[2:4] == (10, 0)
    rows, _ = channel.completions_since(None)
    assert sorted(rows.column("root").to_pylist()) == list(range(2, 21, 2))  # written once


def test_the_acker_settles_while_a_long_job_of_the_topology_holds_every_core(
    spark, channel, tmp_path
):
    """A topology's batch job of many tasks takes both cores; the acker's jobs (in a pool
    of their own, the session scheduling fairly) get the next free core instead of
    waiting for the whole job, as they would first in, first out: there the acker went
    quiet for as long as the topology's longest job."""
    import threading

    query = start_acker(spark, channel, checkpoint=str(tmp_path / "ck"), ackers=2, trigger_ms=100)
    go, slept = tmp_path / "go", tmp_path / "slept"
    slept.mkdir()
    tasks = 400

    def task(i):
        import os
        import time

        if not os.path.exists(go):  # until the test has seen the acker settle
            time.sleep(0.1)
            open(os.path.join(slept, str(i)), "w").close()
        return i

    job = threading.Thread(
        target=lambda: spark.sparkContext.parallelize(range(tasks), tasks).map(task).count()
    )
    seen, position = [], None
    try:
        wait_for(lambda: query.lastProgress is not None, what="the acker's first trigger")
        job.start()
        wait_for(lambda: any(slept.iterdir()), what="the long job's first tasks")
        first, second = trees(range(1, 11))
        channel.write_acks(ack_records(first + second))

        def all_acked():
            nonlocal position
            table, position = channel.completions_since(position)
            seen.extend(table.to_pylist())
            return len([c for c in seen if c["status"] == ACKED]) >= 10

        wait_for(all_acked, timeout=120, what="10 acked roots")
        ran_before = len(list(slept.iterdir()))
    finally:
        go.touch()
        job.join()
        query.stop()
    assert ran_before < tasks - 20, f"the acker settled once {ran_before} of {tasks} tasks ran"
