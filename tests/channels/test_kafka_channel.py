"""The Kafka channel's clients: one consumer per channel and per acker planner, reused."""

import pickle
import uuid

import pyarrow as pa
import pytest

from ackstream.channels.ack_source import ChannelSource
from ackstream.channels.kafka import KafkaChannel
from ackstream.sources.offsets import PlannedRoots
from ackstream.testing import ack_records, fail
from ackstream.vocabulary.records import ACKED, COMPLETION_SCHEMA, INVALID

from helpers import consume, logged_offset, produce

pytestmark = pytest.mark.broker


@pytest.fixture
def consumers_made(monkeypatch):
    """The number of kafka-python consumers built so far, as a one-element list; not
    counted: the probes that check once per process whether the brokers answer end
    offsets right (one record batch a fetch, see :mod:`ackstream.kafka.offsets`), made
    or not depending on which tests ran before."""
    import kafka

    made = [0]

    class Counting(kafka.KafkaConsumer):  # a class still: its DEFAULT_CONFIG is read
        def __init__(self, *args, **kwargs):
            made[0] += kwargs.get("fetch_max_bytes") != 1
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(kafka, "KafkaConsumer", Counting)
    return made


def completions(*roots):
    return pa.Table.from_pylist(
        [{"root": r, "status": ACKED, "completed_ms": r} for r in roots], schema=COMPLETION_SCHEMA
    )


def test_a_channel_reads_through_one_consumer_until_closed(broker, consumers_made):
    channel = KafkaChannel(broker.bootstrap, f"reuse-{uuid.uuid4().hex[:8]}")
    channel.prepare()
    try:
        position = channel.end_position()
        seen = []
        for batch in range(4):  # new completions between reads are all seen, once
            channel.write_completions(completions(2 * batch, 2 * batch + 1), batch)
            table, position = channel.completions_since(position)
            seen += table.column("root").to_pylist()
            channel.write_acks(ack_records([fail(batch)]))
        assert sorted(seen) == list(range(8))
        assert channel.end_position() == position
        assert sorted(channel.ack_records().column("root").to_pylist()) == [0, 1, 2, 3]
        assert consumers_made[0] == 1

        copy = pickle.loads(pickle.dumps(channel))  # no client travels with it
        assert copy.completions_since(None)[0].num_rows == 8
        assert consumers_made[0] == 2
        copy.close()
    finally:
        channel.close()
        channel.close()
    assert channel.completions_since(None)[0].num_rows == 8  # closed: a new client
    assert consumers_made[0] == 3
    channel.close()


def test_the_acker_planner_keeps_one_consumer_and_its_tasks_make_their_own(broker, consumers_made):
    channel = KafkaChannel(broker.bootstrap, f"plan-{uuid.uuid4().hex[:8]}")
    channel.prepare()
    try:
        source = ChannelSource(
            {"kafka.bootstrap.servers": broker.bootstrap, "topic": channel.acks_topic}
        )
        reader = source.streamReader(source.schema())
        offset = reader.initialOffset()
        roots = []
        for root in range(3):
            channel.write_acks(ack_records([fail(root)]))
            end = reader.latestOffset(offset, None)
            for task in reader.partitions(offset, end):
                copy = pickle.loads(pickle.dumps(reader))  # as Spark ships it to a task
                roots += [r for b in copy.read(task) for r in b.column("root").to_pylist()]
            offset = end
        assert roots == [0, 1, 2]
        assert reader.latestOffset(offset, None) == offset
        # the channel's (it asks for its topics before a write), the planner's, then one
        # per read task
        assert consumers_made[0] == 1 + 1 + 3
    finally:
        reader.stop()
        reader.stop()
        channel.close()


def test_a_topic_that_takes_small_messages_gets_them_cut_smaller(broker):
    """Whatever a channel topic's ``max.message.bytes``, a batch goes through: refused
    messages are cut smaller and sent again, none twice; below a single record's size
    the error names the topic and the setting to raise."""
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    from ackstream.errors import EnvironmentProblem

    def limit(topic: str, size: int) -> None:
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        try:
            resource = ConfigResource(
                ConfigResourceType.TOPIC, topic, configs={"max.message.bytes": str(size)}
            )
            admin.alter_configs([resource])
        finally:
            admin.close()

    channel = KafkaChannel(broker.bootstrap, f"small-{uuid.uuid4().hex[:8]}")
    channel.prepare()
    try:
        limit(channel.done_topic, 30_000)
        n = 20_000
        failed = pa.Table.from_pylist(
            [{"root": i, "status": "failed", "reason": f"r{i}"} for i in range(n)],
            schema=COMPLETION_SCHEMA,
        )
        channel.write_completions(failed, 0)
        back, _ = channel.completions_since(None)
        assert sorted(back.column("root").to_pylist()) == list(range(n))  # each once
        sizes = [len(m.value) for m in consume(broker.bootstrap, channel.done_topic)]
        assert len(sizes) > 1 and max(sizes) <= 30_000

        limit(channel.acks_topic, 1_000)  # less than one record's message
        with pytest.raises(EnvironmentProblem, match=f"{channel.acks_topic}.*max.message.bytes"):
            channel.write_acks(ack_records([fail(1)]))
    finally:
        channel.close()


def test_a_forged_run_is_not_expanded_past_the_offsets_its_partition_holds(broker, new_topic):
    """A run of acked offsets is one row that claims its offsets: one forged message
    claiming ten million (once ten million rows, 4 GB) comes back as one invalid row,
    as does a run of a topic the brokers do not have, while a run its partition holds
    comes back one row per root."""
    topic = new_topic(partitions=1)
    produce(broker.bootstrap, topic, [f"v{i}" for i in range(20)])

    def run(topic: str, start: int, end: int) -> pa.Table:
        offset = logged_offset(source="t", read={topic: {"0": [start, end]}})
        return PlannedRoots.of_offsets([offset], now_ms=1_000).acked(1_003)

    channel = KafkaChannel(broker.bootstrap, f"forged-{uuid.uuid4().hex[:8]}")
    channel.prepare()
    try:
        start = channel.end_position()
        channel.write_completions(run(topic, 0, 10_000_000), 0)
        channel.write_completions(run("no-such-topic", 0, 1_000), 1)
        channel.write_completions(run(topic, 5, 15), 2)
        back, _ = channel.completions_since(start)
        as_written, _ = channel.completions_since(start, runs=True)
    finally:
        channel.close()
    assert as_written.num_rows == 3  # the source gets the runs as written, to check itself
    invalid = back.filter(pa.compute.equal(back.column("status"), INVALID))
    assert invalid.num_rows == 2
    assert all("a run of offsets 0 to " in why for why in invalid.column("reason").to_pylist())
    acked = back.filter(pa.compute.equal(back.column("status"), ACKED))
    assert sorted(acked.column("offset").to_pylist()) == list(range(5, 15))
