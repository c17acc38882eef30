"""One contract, two transports: the local-directory and the Kafka channel."""

import os
import time
import uuid

import pytest

from ackstream.channels.local import LocalChannel
from ackstream.testing import TupleGraph, ack_records, fail
from ackstream.vocabulary.records import ACKED, FAILED, INVALID

from helpers import logged_offset, produce, start_two_shard_acker, wait_for

pytestmark = pytest.mark.spark


@pytest.fixture(params=["local", pytest.param("kafka", marks=pytest.mark.broker)])
def channel(request, tmp_path):
    if request.param == "local":
        yield LocalChannel(tmp_path / "channel")
        return
    from ackstream.channels.kafka import KafkaChannel

    broker = request.getfixturevalue("broker")
    kafka = KafkaChannel(broker.bootstrap, f"topo-{uuid.uuid4().hex[:8]}")
    kafka.prepare()
    yield kafka
    kafka.close()


def test_acks_written_by_any_process_reach_the_acker_and_completions_come_back(
    spark, channel, tmp_path
):
    g, records = TupleGraph(), []
    for root in range(1, 41):
        spout = g.spout(root, topic="in", partition=0, offset=root)
        child = g.emit([spout])
        records += g.ack(spout) + (g.ack(child) if root != 13 else g.fail(child))
    now = int(time.time() * 1000)
    channel.write_acks(ack_records(g.init_records(ts=now) + records[:30]))
    query = start_two_shard_acker(spark, channel, tmp_path / "ck", 60_000)
    seen, position = [], None
    try:
        write_garbage(channel)
        channel.write_acks(ack_records(records[30:] + [fail(39)]))

        def poll():
            nonlocal position
            table, position = channel.completions_since(position)
            seen.extend(table.to_pylist())
            invalid = sum(c["status"] == INVALID for c in seen)
            return len(seen) - invalid >= 40 and invalid >= bad_messages

        # Kafka: each foreign message is reported as one invalid record; a local file with
        # the wrong column types is skipped by Spark's file source (logged there)
        bad_messages = 0 if isinstance(channel, LocalChannel) else 2
        wait_for(poll, what="40 completions and the foreign messages reported")
    finally:
        query.stop()
    invalid = [c for c in seen if c["status"] == INVALID]
    seen = [c for c in seen if c["status"] != INVALID]
    assert len(invalid) == bad_messages
    assert all(c["root"] is None and "is not ack records" in c["reason"] for c in invalid)
    status = {c["root"]: c["status"] for c in seen}
    assert len(seen) == 40 and len(status) == 40
    assert {r for r, s in status.items() if s == FAILED} == {13, 39}
    assert sum(s == ACKED for s in status.values()) == 38
    again, _ = channel.completions_since(position)
    assert again.num_rows == 0  # a position never yields the same completion twice


def write_garbage(channel):
    """Records a foreign writer got wrong: not Arrow at all, and the wrong columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    wrong = pa.table({"root": ["not a number"], "something": [1]})
    if isinstance(channel, LocalChannel):
        with open(f"{channel.acks_dir}/garbage.parquet", "wb") as junk:
            junk.write(b"nope")
        pq.write_table(wrong, f"{channel.acks_dir}/wrong-schema.parquet")
        return
    from kafka import KafkaProducer

    from ackstream.channels.messages import encode

    producer = KafkaProducer(bootstrap_servers=channel.bootstrap)
    producer.send(channel.acks_topic, b"nope")
    producer.send(channel.acks_topic, encode(wrong.to_batches()[0]))
    producer.flush()
    producer.close()


def test_a_local_batch_written_again_replaces_its_file(tmp_path):
    from ackstream.sinks.dead_letters import ParquetDeadLetters, read_dead_letters
    from ackstream.vocabulary.dead_letter import DeadLetter

    local = LocalChannel(tmp_path / "channel")
    first = ack_records([fail(1), fail(2)])
    local.write_acks(first)
    local.write_acks(first.iloc[::-1])  # the same records, another order: a re-run
    local.write_acks(ack_records([fail(3)]))
    assert len([f for f in os.listdir(local.acks_dir) if not f.startswith(".")]) == 2

    letters = ParquetDeadLetters(str(tmp_path / "dead"), "topo")
    batch = [DeadLetter("in", 0, 7, 3, "failed")]
    letters.write(batch, {})
    letters.write(batch, {})  # a restart writing the same letters again
    assert read_dead_letters(str(tmp_path / "dead")).num_rows == 1


@pytest.mark.broker
def test_every_message_of_one_record_batch_is_seen(broker):
    """Tansu reports the end of a partition as the last record batch's base offset + 1,
    which hid the later messages of a batch until another one came."""
    from kafka import KafkaProducer

    from ackstream.channels.kafka import KafkaChannel
    from ackstream.channels.messages import message_ranges

    channel = KafkaChannel(broker.bootstrap, f"batch-{uuid.uuid4().hex[:8]}")
    channel.prepare()
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=200)
    for n in range(3):  # small messages within the linger: one record batch
        producer.send(channel.acks_topic, value=b"message %d" % n, partition=0)
    producer.flush()
    producer.close()
    assert [
        (p, end - start)
        for p, start, end in message_ranges(broker.bootstrap, channel.acks_topic, {})
    ] == [(0, 3)]


def test_local_completions_from_several_writers_are_all_read_once(tmp_path):
    """The acker query and topology batches write completions with batch ids of their
    own (and a new checkpoint starts them at 0 again): a reader misses none of them."""
    import pyarrow as pa

    from ackstream.vocabulary.records import COMPLETION_SCHEMA

    def rows(*roots):
        return pa.Table.from_pylist(
            [{"root": r, "status": ACKED, "completed_ms": r} for r in roots],
            schema=COMPLETION_SCHEMA,
        )

    local = LocalChannel(tmp_path / "channel")
    local.write_completions(rows(1, 2), 0)  # the acker's batch 0
    local.write_completions(rows(3), 0)  # a topology's batch 0
    first, position = local.completions_since(None)
    local.write_completions(rows(1, 2), 0)  # the acker's batch 0 re-run after a crash
    local.write_completions(rows(4), 7)
    local.write_completions(rows(5), 0)  # a topology on a new checkpoint
    later, position = local.completions_since(position)
    assert sorted(first.column("root").to_pylist()) == [1, 2, 3]
    assert sorted(later.column("root").to_pylist()) == [4, 5]
    assert local.completions_since(position)[0].num_rows == 0
    assert LocalChannel(tmp_path / "channel").end_position() == position


def test_it_is_a_channel_that_a_source_can_name(channel):
    from ackstream.channels import Channel
    from ackstream.config.source import parse

    assert isinstance(channel, Channel)
    option = channel.source_options()["ackstream.channel"]
    config = parse(
        {"ackstream.upstream": "generator", "ackstream.channel": option}
        if option != "kafka"
        else {
            "kafka.bootstrap.servers": channel.bootstrap,
            "subscribe": "t",
            "ackstream.channel": option,
            "ackstream.topology": channel.topology,
        }
    )
    from ackstream.channels import open_channel

    opened = open_channel(config)
    try:
        assert opened.source_options() == channel.source_options()
    finally:
        opened.close()


def test_completions_are_read_once_from_a_position_and_a_new_reader_starts_at_the_end(channel):
    import pyarrow as pa

    from ackstream.vocabulary.records import COMPLETION_SCHEMA

    def rows(*roots):
        return pa.Table.from_pylist(
            [{"root": r, "status": ACKED, "completed_ms": r} for r in roots],
            schema=COMPLETION_SCHEMA,
        )

    start = channel.end_position()
    channel.write_completions(rows(1, 2), 0)
    first, position = channel.completions_since(start)
    channel.write_completions(rows(3), 1)
    later, position = channel.completions_since(position)
    assert sorted(first.column("root").to_pylist()) == [1, 2]
    assert later.column("root").to_pylist() == [3]
    assert channel.completions_since(position)[0].num_rows == 0
    assert channel.answering()  # an empty read of a working channel means nothing new
    assert channel.end_position() == position


def test_a_run_of_acked_offsets_comes_back_one_row_per_root_but_to_the_source(channel, request):
    from ackstream.sources.offsets import PlannedRoots

    topic = "events"
    if not isinstance(channel, LocalChannel):  # a run is expanded as far as its partition holds
        topic = request.getfixturevalue("new_topic")(partitions=2)
        produce(request.getfixturevalue("broker").bootstrap, topic, ["r"] * 25, partition=1)
    end = logged_offset(source="topo", read={topic: {"1": [5, 25]}})
    planned = PlannedRoots.of_offsets([end], now_ms=1_000)
    start = channel.end_position()
    channel.write_completions(planned.acked(1_003), 0)
    per_root, _ = channel.completions_since(start)
    as_written, _ = channel.completions_since(start, runs=True)
    roots = planned.inits.column("root").to_pylist()
    assert sorted(per_root.column("root").to_pylist()) == sorted(roots)
    assert per_root.column("end_offset").null_count == per_root.num_rows
    assert as_written.to_pylist() == [
        {**as_written.to_pylist()[0], "offset": 5, "end_offset": 25, "ids": "topo"}
    ]


def test_a_batch_of_any_size_is_written_and_read_back_whole(channel):
    """Neither transport depends on a batch fitting in one message: a whole batch of
    100,000 failed roots, each with a long reason, and as many fail records, come back
    whole (once a batch's completions with their reasons overflowed Kafka's message
    size and stopped the query)."""
    import pyarrow as pa

    from ackstream.vocabulary.records import COMPLETION_SCHEMA

    n, reason = 100_000, "batch_failed: SparkRuntimeException: downstream refused " * 8
    failed = pa.Table.from_pylist(
        [{"root": i, "status": FAILED, "reason": f"{reason} #{i}"} for i in range(n)],
        schema=COMPLETION_SCHEMA,
    )
    start = channel.end_position()
    channel.write_completions(failed, 0)
    back, _ = channel.completions_since(start)
    assert back.num_rows == n
    assert back.sort_by("root").column("reason").equals(failed.column("reason"))
    channel.write_acks(ack_records([fail(r, reason=reason) for r in range(n)]))
    assert channel.ack_records().num_rows == n


def test_every_ack_record_written_is_read_back(channel):
    channel.write_acks(ack_records([fail(5, reason="x"), fail(6)]))
    records = channel.ack_records()
    assert sorted(records.column("root").to_pylist()) == [5, 6]
    assert sorted(records.column("reason").to_pylist(), key=str) == [None, "x"]


def test_each_reset_of_a_root_arrives_even_when_the_records_are_alike(channel):
    """Storm's resetTimeout may be sent for one tuple again and again."""
    from ackstream.testing import reset

    for ts in (1_000, 2_000, 3_000):
        channel.write_acks(ack_records([reset(5, ts=ts)]))
    assert sorted(channel.ack_records().column("ts").to_pylist()) == [1_000, 2_000, 3_000]
