"""Spark Kafka source options on a real broker, at the upstream and spout (no Spark):
includeHeaders and timestampType, assign, subscribePattern, starting by timestamp."""

import json
import uuid

import pyarrow as pa
import pytest

from ackstream.channels.local import LocalChannel
from ackstream.config.source import parse
from ackstream.errors import EnvironmentProblem, OptionError
from ackstream.sources.rows import ReadTask, source_schema
from ackstream.sources.spout import open_spout
from ackstream.sources.starting import initial_offset
from ackstream.sources.upstream import open_upstream

from helpers import wait_for

pytestmark = pytest.mark.broker


def send(bootstrap, topic, records):
    """``records``: ``(partition, value, headers, timestamp_ms or None)`` each."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for partition, value, headers, ts in records:
        producer.send(
            topic, value=value, partition=partition, headers=headers or [], timestamp_ms=ts
        )
    producer.flush()
    producer.close()


@pytest.fixture
def upstream_of(broker, tmp_path):
    """``upstream_of(**options) -> (config, upstream)``, closed afterwards."""
    made = []

    def make(**options):
        config = parse(
            {
                "kafka.bootstrap.servers": broker.bootstrap,
                "ackstream.topology": f"opts-{uuid.uuid4().hex[:8]}",
                "ackstream.channel": str(tmp_path / "channel"),
                **options,
            }
        )
        made.append(open_upstream(config))
        return config, made[-1]

    yield make
    for upstream in made:
        upstream.close()


def test_include_headers_gives_sparks_headers_column_on_reads_and_replays(
    broker, new_topic, upstream_of
):
    topic = new_topic()
    send(
        broker.bootstrap,
        topic,
        [(0, b"a", [("trace", b"t1"), ("trace", b"t2")], None), (0, b"b", None, None)],
    )
    config, upstream = upstream_of(subscribe=topic, includeHeaders="true")
    task = ReadTask(topic, 0, 0, 2, replays=((0, 3),))  # offset 0 again, at attempt 3
    batches = list(upstream.read(task))
    assert all(b.schema == source_schema(include_headers=True) for b in batches)
    rows = pa.Table.from_batches(batches).to_pylist()
    two = [{"key": "trace", "value": b"t1"}, {"key": "trace", "value": b"t2"}]
    assert [(r["offset"], r["_attempt"], r["headers"]) for r in rows] == [
        (0, 0, two),
        (1, 0, None),  # no headers: null, as Spark's
        (0, 3, two),  # a replayed record has the same columns
    ]
    assert {r["timestampType"] for r in rows} == {0}  # the topic keeps create times
    _, plain = upstream_of(subscribe=topic)
    assert "headers" not in next(iter(plain.read(task))).schema.names


def test_assign_reads_the_named_partitions_only(broker, new_topic, upstream_of):
    topic = new_topic(3)
    config, upstream = upstream_of(assign=f'{{"{topic}": [2, 0]}}')
    upstream.check()
    assert upstream.partitions() == [(topic, 0), (topic, 2)]
    _, missing = upstream_of(assign=f'{{"{topic}": [0, 7]}}')
    with pytest.raises(EnvironmentProblem, match=rf"{topic}\[7\] \(option assign\)"):
        missing.check()


def test_subscribe_pattern_reads_new_matching_topics_from_their_start(
    broker, new_topic, upstream_of, tmp_path
):
    from broker import create_topic

    prefix = f"p{uuid.uuid4().hex[:8]}"
    first = create_topic(broker.bootstrap, name=f"{prefix}-a")
    new_topic()  # a topic the pattern does not match
    config, upstream = upstream_of(
        subscribePattern=f"{prefix}-.*",
        startingOffsets="earliest",
        **{"kafka.metadata.max.age.ms": "200"},
    )
    send(broker.bootstrap, first, [(0, b"x", None, None)])
    channel = LocalChannel(config.channel)
    spout = open_spout(config, upstream, channel, initial_offset(config, upstream, channel))
    try:
        assert spout.next_offset().read == {(first, 0): (0, 1)}
        second = create_topic(broker.bootstrap, name=f"{prefix}-b", partitions=2)
        send(broker.bootstrap, second, [(1, b"y", None, None), (1, b"z", None, None)])

        def planned():
            offset = spout.next_offset()
            return offset and offset.read

        assert wait_for(planned, timeout=30, what="the new topic planned") == {(second, 1): (0, 2)}
    finally:
        spout.close()


def test_starting_by_timestamp_starts_at_the_first_record_that_late(broker, new_topic, upstream_of):
    topic = new_topic(2)
    base = 1_700_000_000_000
    send(
        broker.bootstrap,
        topic,
        [(p, b"v", None, base + 1000 * i) for p in (0, 1) for i in range(5)],
    )

    def starts(**options):
        config, upstream = upstream_of(subscribe=topic, startingOffsets="earliest", **options)
        channel = LocalChannel(config.channel)
        parts = initial_offset(config, upstream, channel).parts
        return {p: at.end for (t, p), at in parts.items() if t == topic}

    assert starts(startingTimestamp=str(base + 2500)) == {0: 3, 1: 3}
    by_partition = f'{{"{topic}": {{"1": {base + 1000}}}}}'
    # the partition not named starts as startingOffsets says (earliest)
    assert starts(startingOffsetsByTimestamp=by_partition) == {0: 0, 1: 1}
    late = str(base + 60_000)
    with pytest.raises(OptionError, match=r"\[0\] starts at 0 and ends at 5, with no record") as e:
        starts(startingTimestamp=late)
    assert (e.value.option, e.value.value) == ("startingTimestamp", int(late))
    by_partition = f'{{"{topic}": {{"1": {late}}}}}'
    with pytest.raises(OptionError, match=rf"{topic}\[1\] starts at 0 and ends at 5") as e:
        starts(startingOffsetsByTimestamp=by_partition)
    assert e.value.option == "startingOffsetsByTimestamp"
    assert starts(startingTimestamp=late, startingOffsetsByTimestampStrategy="latest") == {
        0: 5,
        1: 5,
    }


def test_a_start_for_a_partition_not_read_is_refused_before_start(broker, new_topic, upstream_of):
    topic = new_topic(2)
    given = f'{{"{topic}": {{"0": 0, "5": 3}}}}'
    _, upstream = upstream_of(subscribe=topic, startingOffsets=given)
    with pytest.raises(OptionError, match=rf"{topic} has no partition 5") as refused:
        upstream.check()
    assert (refused.value.option, refused.value.value) == ("startingOffsets", given)
    _, assigned = upstream_of(assign=f'{{"{topic}": [0]}}', startingOffsets=given)
    with pytest.raises(OptionError, match=rf"{topic} has no partition 5 .*reads 0\)"):
        assigned.check()
    by_time = f'{{"{topic}": {{"1": 0, "2": 0}}}}'
    _, timed = upstream_of(subscribe=topic, startingOffsetsByTimestamp=by_time)
    with pytest.raises(OptionError, match="partition 2") as refused:
        timed.check()
    assert refused.value.option == "startingOffsetsByTimestamp"
    _, fine = upstream_of(subscribe=topic, startingOffsets=f'{{"{topic}": {{"1": -2}}}}')
    fine.check()


def test_a_start_outside_what_a_partition_holds_is_refused_naming_it_and_its_range(
    broker, new_topic, upstream_of
):
    """Past a partition's end or before its earliest offset (records deleted), a start
    in ``startingOffsets`` is refused with the partition's range, before the spout is
    built, so before it could commit anything; its end itself is a start (nothing new)."""
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient

    topic = new_topic(2)
    send(broker.bootstrap, topic, [(p, b"v", None, None) for p in (0, 1) for _ in range(5)])
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.delete_records({TopicPartition(topic, 1): 2})
    finally:
        admin.close()

    def starts(given):
        config, upstream = upstream_of(subscribe=topic, startingOffsets=json.dumps({topic: given}))
        parts = initial_offset(config, upstream, LocalChannel(config.channel)).parts
        return {p: at.end for (t, p), at in parts.items() if t == topic}

    with pytest.raises(
        OptionError, match=rf"{topic}\[0\] starts at 0 and ends at 5, and 99999 is past its end"
    ) as e:
        starts({"0": 99_999})
    assert (e.value.option, e.value.value) == (
        "startingOffsets",
        json.dumps({topic: {"0": 99_999}}),
    )
    with pytest.raises(
        OptionError, match=rf"{topic}\[1\] starts at 2 and ends at 5, and 1 is before"
    ):
        starts({"0": 0, "1": 1})
    assert starts({"0": 5, "1": -2}) == {0: 5, 1: 2}
