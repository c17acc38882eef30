"""The ackstream source against a real Kafka-protocol broker, through the real acker."""

import time
import uuid

import pytest

from ackstream.channels.local import LocalChannel
from ackstream.testing import SpoutAcker, ack_records
from ackstream.testing import ack as ack_record
from ackstream.vocabulary.records import ACKED, FAILED

from helpers import (
    consume,
    start_foreach_batch,
    start_two_shard_acker,
    tracked_kafka_stream,
    wait_for,
)

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def produce(bootstrap, topic, n, partitions=1, first=0):
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for i in range(first, first + n):
        producer.send(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % partitions)
    producer.flush()
    producer.close()


class Group:
    """The consumer group's committed offsets, as a lag tool sees them."""

    def __init__(self, bootstrap, group):
        from kafka import KafkaConsumer

        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
        )

    def committed(self, topic, partitions=1):
        from kafka import TopicPartition

        return [self.consumer.committed(TopicPartition(topic, p)) for p in range(partitions)]

    def close(self):
        self.consumer.close(autocommit=False)


def dead_letters(bootstrap, topic):
    return [
        (m.key, m.value, {k: v.decode() for k, v in m.headers}) for m in consume(bootstrap, topic)
    ]


def source(spark, bootstrap, topic, channel_dir, group, **options):
    """The source of the topology ``group`` in the consumer group ``group``."""
    settings = {"kafka.group.id": group, "ackstream.sourceTimeout": "90s"}  # a cold acker is slow
    return tracked_kafka_stream(
        spark, bootstrap, topic, group, channel_dir, **{**settings, **options}
    )


def start_reading(spark, broker, setup, topic, spout, checkpoint, **options):
    """A query reading ``topic`` into ``spout`` from ``checkpoint`` with the source's
    ``options``, on the channel and in the group of ``setup``, which stops it."""
    channel, group, queries = setup
    frame = source(spark, broker.bootstrap, topic, channel.directory, group, **options)
    queries.append(start_foreach_batch(frame, spout, checkpoint))
    return queries[-1]


@pytest.fixture
def setup(spark, broker, tmp_path, request):
    """A channel, a running acker on it (message timeout: the test's ``acker_timeout_ms``
    marker, else 4 s) and a unique group; stops every query afterwards."""
    channel = LocalChannel(tmp_path / "channel")
    marker = request.node.get_closest_marker("acker_timeout_ms")
    timeout_ms = marker.args[0] if marker else 4000
    acker = start_two_shard_acker(spark, channel, tmp_path / "acker", timeout_ms, trigger_ms=200)
    group = f"g-{uuid.uuid4().hex[:8]}"
    queries = []
    yield channel, group, queries
    for q in queries + [acker]:
        q.stop()


def test_commits_follow_acks_failures_replay_after_backoff_and_dead_letter_once(
    spark, broker, new_topic, setup, tmp_path
):
    channel, group, queries = setup
    topic, dlq = new_topic(2), new_topic(1)
    produce(broker.bootstrap, topic, 20, partitions=2)  # 10 per partition
    # offset 3 of partition 0 fails on every attempt; offset 5 of partition 1 fails once
    topology = SpoutAcker(
        channel,
        fail=lambda f: (
            ((f["partition"] == 0) & (f["offset"] == 3))
            | ((f["partition"] == 1) & (f["offset"] == 5) & (f["_attempt"] == 0))
        ),
    )
    times = {}

    def timed(batch, batch_id):
        topology(batch, batch_id)
        for r in topology.rows:
            times.setdefault((r["partition"], r["offset"], r["_attempt"]), time.monotonic())

    options = {
        "ackstream.maxRetries": 2,
        "ackstream.retryInitialDelay": "1s",
        "ackstream.deadLetterTopic": dlq,
        "ackstream.messageTimeout": "4s",
    }
    start_reading(spark, broker, setup, topic, timed, tmp_path / "source", **options)
    lag = Group(broker.bootstrap, group)
    samples = []
    try:

        def settled():
            committed = lag.committed(topic, 2)
            samples.append((committed[0], (0, 3, 2) in times))
            return committed == [10, 10]

        wait_for(settled, timeout=90, interval=0.2, what="both partitions committed to 10")
    finally:
        lag.close()
    # never ahead of the acks: partition 0 stays at 3 until offset 3 is dead-lettered
    assert all(c is None or c <= 3 for c, last_attempt_seen in samples if not last_attempt_seen)
    assert any(c == 3 for c, _ in samples)
    attempts = sorted(k for k in times if k[2] > 0)
    assert attempts == [(0, 3, 1), (0, 3, 2), (1, 5, 1)]
    # attempt 1 waits 1 s, attempt 2 waits 2 s after the failure that precedes it
    assert times[(0, 3, 1)] - times[(0, 3, 0)] >= 1.0
    assert times[(0, 3, 2)] - times[(0, 3, 1)] >= 2.0
    letters = dead_letters(broker.bootstrap, dlq)
    assert len(letters) == 1
    key, value, headers = letters[0]
    assert (key, value) == (b"k6", b"v6")  # record 6 went to partition 0 at offset 3
    assert headers["ackstream.reason"] == FAILED and headers["ackstream.attempts"] == "3"
    assert (
        headers["ackstream.topic"],
        headers["ackstream.partition"],
        headers["ackstream.offset"],
    ) == (topic, "0", "3")


@pytest.mark.acker_timeout_ms(60_000)
def test_max_pending_holds_back_new_offsets(spark, broker, new_topic, setup, tmp_path):
    channel, group, queries = setup
    topic = new_topic(1)
    produce(broker.bootstrap, topic, 7)
    topology = SpoutAcker(channel, lose=lambda f: f["offset"] >= 0)  # init only: acks by hand
    options = {"ackstream.maxPending": 4, "ackstream.messageTimeout": "60s"}
    start_reading(spark, broker, setup, topic, topology, tmp_path / "source", **options)
    acked = 0
    for seen in (4, 7):
        wait_for(lambda n=seen: len(topology.rows) >= n, timeout=60, what=f"{seen} rows")
        time.sleep(1.5)  # an absence cannot be polled: about seven more triggers
        assert len(topology.rows) == seen  # no new offsets while 4 roots are in flight
        now = int(time.time() * 1000)
        channel.write_acks(
            ack_records(
                ack_record(r["_root"], r["_edge"], ts=now) for r in topology.rows[acked:seen]
            )
        )
        acked = seen
    assert [r["offset"] for r in topology.rows] == list(range(7))
    lag = Group(broker.bootstrap, group)
    try:
        wait_for(lambda: lag.committed(topic) == [7], timeout=60, what="commit to 7")
    finally:
        lag.close()


def test_restart_resumes_committed_offsets_and_pending_replays(
    spark, broker, new_topic, setup, tmp_path
):
    channel, group, queries = setup
    topic, dlq = new_topic(1), new_topic(1)
    produce(broker.bootstrap, topic, 6)
    # offset 2 fails once, offset 4 always: both are waiting for their replay at the stop
    first = SpoutAcker(
        channel, fail=lambda f: ((f["offset"] == 2) & (f["_attempt"] == 0)) | (f["offset"] == 4)
    )
    options = {
        "ackstream.retryInitialDelay": "3s",
        "ackstream.messageTimeout": "4s",
        "ackstream.maxRetries": 1,
        "ackstream.deadLetterTopic": dlq,
    }
    checkpoint = str(tmp_path / "source")
    lag = Group(broker.bootstrap, group)
    try:
        query = start_reading(spark, broker, setup, topic, first, checkpoint, **options)
        wait_for(lambda: lag.committed(topic) == [2], timeout=60, what="commit up to the fail")
        wait_for(
            lambda: (
                [r["status"] for r in channel.completions_since(None)[0].to_pylist()].count(FAILED)
                == 2
            ),
            timeout=30,
            what="both failures",
        )
        query.stop()
        assert [(r["offset"], r["_attempt"]) for r in first.rows] == [(o, 0) for o in range(6)]
        produce(broker.bootstrap, topic, 4, first=6)
        second = SpoutAcker(channel, fail=lambda f: f["offset"] == 4)
        start_reading(spark, broker, setup, topic, second, checkpoint, **options)
        wait_for(lambda: lag.committed(topic) == [10], timeout=60, what="commit to 10")
    finally:
        lag.close()
    again = sorted((r["offset"], r["_attempt"]) for r in second.rows)
    # the replays and the new records; the acked offsets 0, 1, 3, 5 stay done
    assert again == [(2, 1), (4, 1), (6, 0), (7, 0), (8, 0), (9, 0)]
    statuses = [r["status"] for r in channel.completions_since(None)[0].to_pylist()]
    assert statuses.count(FAILED) == 3 and statuses.count(ACKED) == 9
    letters = dead_letters(broker.bootstrap, dlq)
    assert [(h["ackstream.offset"], h["ackstream.attempts"]) for _, _, h in letters] == [("4", "2")]


def last_offset_log_entry(checkpoint):
    """The source's offset in the newest offset-log file of ``checkpoint``."""
    import json
    import os

    folder = os.path.join(checkpoint, "offsets")
    newest = max((f for f in os.listdir(folder) if f.isdigit()), key=int)
    with open(os.path.join(folder, newest)) as log:
        return json.loads(log.read().splitlines()[-1])


def empty_completions_after(channel, position):
    """Empty the channel's completion files after ``position``, as if they had aged out."""
    import os

    import pyarrow.parquet as pq

    from ackstream.vocabulary.records import COMPLETION_SCHEMA

    for name in os.listdir(channel.done_dir):  # <12-digit number>-<tag>.parquet
        if name[:12].isdigit() and int(name[:12]) > position:
            pq.write_table(COMPLETION_SCHEMA.empty_table(), os.path.join(channel.done_dir, name))


@pytest.mark.acker_timeout_ms(60_000)
def test_a_restart_resumes_acked_offsets_above_the_watermark_from_the_commit_metadata(
    spark, broker, new_topic, setup, tmp_path
):
    """Offsets acked above a pending one live in the group's commit metadata (Tansu drops
    it; Apache Kafka keeps it). The offset log, written when the batch was planned, does
    not know them, and their completions are gone from the channel (emptied here, as a
    channel's retention would): a restart from the same checkpoint replays only the
    pending offset."""
    import json

    from kafka import TopicPartition

    channel, group, queries = setup
    topic = new_topic(1)
    produce(broker.bootstrap, topic, 10)
    first = SpoutAcker(channel, lose=lambda f: f["offset"] == 2)  # 2 stays in flight
    checkpoint = str(tmp_path / "source")
    lag = Group(broker.bootstrap, group)
    tp = TopicPartition(topic, 0)
    try:
        options = {"ackstream.messageTimeout": "60s"}
        query = start_reading(spark, broker, setup, topic, first, checkpoint, **options)
        got = wait_for(
            lambda: (
                (c := lag.consumer.committed(tp, metadata=True)) is not None
                and c.offset == 2
                and json.loads(c.metadata or "{}").get("done")
                and c
            ),
            timeout=60,
            what="commit at 2 with the acked offsets above it",
        )
        wait_for(
            lambda: (
                json.loads(lag.consumer.committed(tp, metadata=True).metadata).get("done")
                == [[3, 10]]
            ),
            timeout=30,
            what="offsets 3 to 9 in the metadata",
        )
        query.stop()
        assert got.offset == 2
        assert sorted(r["offset"] for r in first.rows) == list(range(10))
        logged = last_offset_log_entry(checkpoint)
        part = logged["parts"][topic]["0"]
        assert part["wm"] == 0 and not part.get("done")  # the offset log does not know
        empty_completions_after(channel, logged["done"])  # nor does the channel any more

        second = SpoutAcker(channel)
        options = {"ackstream.messageTimeout": "3s", "ackstream.sourceTimeout": "6s"}
        start_reading(spark, broker, setup, topic, second, checkpoint, **options)
        wait_for(lambda: lag.committed(topic) == [10], timeout=60, what="commit to 10")
        meta = lag.consumer.committed(tp, metadata=True).metadata
    finally:
        lag.close()
    # offset 2 is replayed (again, if its ack took longer than the source timeout on a
    # busy machine); the acked offsets 3 to 9 are not
    assert {r["offset"] for r in second.rows} == {2}
    assert min(r["_attempt"] for r in second.rows) == 1
    assert json.loads(meta)["done"] == []


@pytest.mark.parametrize(
    "option, value",
    [
        ("ackstream.maxPending", "-4"),
        ("ackstream.messageTimeout", "soon"),
        ("ackstream.bogus", "1"),
    ],
)
def test_bad_options_fail_at_load_with_the_option_named(spark, option, value):
    with pytest.raises(Exception) as err:
        (
            spark.readStream.format("ackstream")
            .option("kafka.bootstrap.servers", "127.0.0.1:1")
            .option("subscribe", "t")
            .option(option, value)
            .load()
        )
    assert option.lower() in str(err.value).lower() and value in str(err.value)
    assert "OptionError" in str(err.value)


@pytest.mark.long  # a query with a replay: 31 s at a load of 1-3 on 2 cores
def test_include_headers_through_spark_a_replay_has_the_same_columns(
    spark, broker, new_topic, setup, tmp_path
):
    """Spark takes the headers column as declared, and a replayed record keeps it."""
    from kafka import KafkaProducer

    channel, group, queries = setup
    topic = new_topic(1)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    producer.send(topic, value=b"a", headers=[("trace", b"t0")])
    producer.send(topic, value=b"b")
    producer.flush()
    producer.close()
    topology = SpoutAcker(channel, fail=lambda f: (f["offset"] == 0) & (f["_attempt"] == 0))
    seen = []

    def collect(batch, batch_id):
        seen.extend(batch.select("offset", "_attempt", "timestampType", "headers").collect())
        topology(batch, batch_id)

    frame = source(
        spark,
        broker.bootstrap,
        topic,
        channel.directory,
        group,
        **{"includeHeaders": "true", "ackstream.retryInitialDelay": "0"},
    )
    assert frame.schema["headers"].dataType.simpleString() == (
        "array<struct<key:string,value:binary>>"
    )
    queries.append(start_foreach_batch(frame, collect, str(tmp_path / "source")))
    wait_for(lambda: any(r["_attempt"] == 1 for r in seen), timeout=60, what="the replay")
    rows = {(r["offset"], r["_attempt"]): r for r in seen}
    headers = [(h["key"], bytes(h["value"])) for h in rows[(0, 1)]["headers"]]
    assert (
        headers
        == [("trace", b"t0")]
        == [(h["key"], bytes(h["value"])) for h in rows[(0, 0)]["headers"]]
    )
    assert rows[(1, 0)]["headers"] is None
    assert {r["timestampType"] for r in seen} == {0}
