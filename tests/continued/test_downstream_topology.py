"""A downstream ackstream topology continues the trees an upstream one left open: one
batch of each on the test broker (its records, settled with the upstream's, say what
became of each upstream root), then both as streaming queries end to end."""

import uuid

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from ackstream import KafkaSink, MemorySink, Topology
from ackstream.channels.kafka import KafkaChannel
from ackstream.sinks.continued import TreeClient, continued_acks, lineage_of
from ackstream.testing import settle, tracked_frame, with_lineage
from ackstream.vocabulary.records import ACK, FAIL

from helpers import consume, produce, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def topic_frame(spark, bootstrap, topic, expected):
    """``topic``'s messages as the downstream source reads them: with headers and its
    own (local) lineage columns."""
    # each read is the whole topic: keep the last, not every read's messages added up
    messages = wait_for(
        lambda: read if len(read := consume(bootstrap, topic)) >= expected else None,
        interval=0.5,
        what=f"{expected} messages in {topic}",
    )
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


def upper_then_lower(spark, broker, a: str, b: str, middle: str, b_sink):
    """Topology ``a`` upper-cases the values into ``middle``, its trees left open, and
    ``b`` lower-cases them again into ``b_sink``, continuing ``a``'s trees on its channel."""
    upstream = (
        Topology(a, spark, KafkaChannel(broker.bootstrap, a), message_timeout_ms=60_000)
        .map(lambda df: df.withColumn("value", F.upper(F.col("value").cast("string"))))
        .sink(KafkaSink(broker.bootstrap, middle, continue_trees=True))
    )
    downstream = (
        Topology(b, spark, KafkaChannel(broker.bootstrap, a), continue_trees=True)
        .map(lambda df: df.withColumn("value", F.lower(F.col("value").cast("string"))))
        .sink(b_sink)
    )
    return upstream, downstream


@pytest.mark.e2e
def test_two_queries_every_upstream_record_is_acked_once_downstream_wrote_it(
    spark, broker, new_topic, tmp_path
):
    from kafka import KafkaConsumer, TopicPartition

    inbox, middle, outbox = new_topic(), new_topic(), new_topic()
    up, down = (f"{side}-{uuid.uuid4().hex[:8]}" for side in ("up", "down"))
    n = 20
    produce(broker.bootstrap, inbox, [f"r{i}" for i in range(n)])
    upstream, downstream = upper_then_lower(
        spark, broker, up, down, middle, KafkaSink(broker.bootstrap, outbox)
    )
    channel = upstream.channel
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
            interval=0.5,
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


def test_a_middle_hop_passes_the_upstream_trees_on_to_the_next_process(spark, broker, new_topic):
    """A -> B -> C: B continues A's trees and writes them on with a continuing sink; its
    messages name A's roots, and A's roots complete only when C acks them. B's aggregate
    puts two messages of one root ("a" twice in the first line) in one row: that row's
    message names the root once, and one ack of it completes the root."""
    first, second = new_topic(), new_topic()
    lines = ["a a b", "b c", "c"]
    a = (
        Topology("a", spark, None)
        .explode(F.split(F.col("value"), " "), "word")
        .map(lambda df: df.withColumn("key", F.col("word")).withColumn("value", F.col("word")))
        .sink(KafkaSink(broker.bootstrap, first, continue_trees=True))
    )
    frame = tracked_frame(spark, lines)
    r = [row["_root"] for row in frame.orderBy("offset").collect()]
    a_records = a.run_batch(frame)

    def middle(fail_word=None):
        topology = Topology("b", spark, None, continue_trees=True).map(
            lambda df: df.withColumn("word", F.col("value").cast("string"))
        )
        if fail_word:
            topology = topology.fail_where(F.col("word") == fail_word, "no " + fail_word)
        return (
            topology.aggregate("word", F.count("*").alias("n"))
            .map(lambda df: df.selectExpr("*", "word AS key", "word AS value"))
            .sink(KafkaSink(broker.bootstrap, second, continue_trees=True))
        )

    b_records = middle().run_batch(topic_frame(spark, broker.bootstrap, first, 6))
    passed = wait_for(
        lambda: read if len(read := consume(broker.bootstrap, second)) >= 3 else None,
        interval=0.5,
        what="3 messages in the second topic",
    )
    lineage = {m.value.decode(): lineage_of(m.headers) for m in passed}
    assert {word: set(roots) for word, (roots, _) in lineage.items()} == {
        "a": {r[0]},
        "b": {r[0], r[1]},
        "c": {r[1], r[2]},
    }
    assert all(len(roots) == len(set(roots)) for roots, _ in lineage.values())
    assert settle(both(a_records, b_records)) == {root: "pending" for root in r}

    def c_acks(kind=ACK, words=("a", "b", "c")):
        return continued_acks([lineage[w] for w in words], kind, 0, "refused by C")

    assert settle(pa.concat_tables([a_records, b_records, c_acks()])) == {
        root: "acked" for root in r
    }
    held_back = c_acks(words=("a", "b"))  # C has not acked "c" yet: its roots wait
    assert settle(pa.concat_tables([a_records, b_records, held_back])) == {
        r[0]: "acked",
        r[1]: "pending",
        r[2]: "pending",
    }
    failing = pa.concat_tables([a_records, b_records, held_back, c_acks(FAIL, ("c",))])
    assert settle(failing) == {r[0]: "acked", r[1]: "failed", r[2]: "failed"}
    # a fourth process, a topology continuing the trees once more, acks them as C did
    d = Topology("d", spark, None, continue_trees=True).sink(MemorySink())
    d_records = d.run_batch(topic_frame(spark, broker.bootstrap, second, 3))
    assert settle(pa.concat_tables([a_records, b_records, d_records])) == {
        root: "acked" for root in r
    }
    # and a fail in the middle hop fails the upstream roots of what it failed
    b_failing = middle("b").run_batch(topic_frame(spark, broker.bootstrap, first, 6))
    assert settle(both(a_records, b_failing)) == {r[0]: "failed", r[1]: "failed", r[2]: "pending"}


def test_a_topology_continuing_trees_may_write_them_on_with_a_continuing_sink():
    channel = KafkaChannel("127.0.0.1:9", "up")  # makes no connection until used
    topology = Topology("down", None, channel, continue_trees=True)
    topology.sink(KafkaSink("127.0.0.1:9", "next", continue_trees=True))
    assert topology.sinks[0].continues_trees
    assert topology.source_options()["includeHeaders"] == "true"
    assert topology.source_options()["ackstream.tracking"] == "false"


@pytest.mark.e2e
def test_three_processes_the_last_one_acks_or_fails_the_first_ones_records(
    spark, broker, new_topic, tmp_path
):
    """A (upper-case) -> B (lower-case, continuing A's trees and passing them on) -> C, a
    plain consumer acking with ``TreeClient`` on A's channel. A's offsets wait for C's
    acks; C failing one message replays its record from A's source, through B again."""
    from kafka import KafkaConsumer, TopicPartition

    inbox, first, second = new_topic(), new_topic(), new_topic()
    a, b = (f"{side}-{uuid.uuid4().hex[:8]}" for side in ("a", "b"))
    n = 10
    produce(broker.bootstrap, inbox, [f"r{i}" for i in range(n)])
    upstream, middle = upper_then_lower(
        spark, broker, a, b, first, KafkaSink(broker.bootstrap, second, continue_trees=True)
    )
    channel = upstream.channel
    options = {"kafka.bootstrap.servers": broker.bootstrap, "startingOffsets": "earliest"}
    queries = [
        upstream.start(
            upstream.read_stream(
                {**options, "subscribe": inbox, "ackstream.retryInitialDelay": "200ms"}
            ),
            str(tmp_path / "a"),
            trigger_ms=300,
        )
    ]
    # B starts once A wrote (two sources starting at once may outwait Spark on 2 cores)
    wait_for(
        lambda: len(consume(broker.bootstrap, first)) == n, timeout=150, interval=0.5, what="A's"
    )
    queries.append(
        middle.start(
            middle.read_stream({**options, "subscribe": first}),
            str(tmp_path / "b"),
            trigger_ms=300,
        )
    )
    group = KafkaConsumer(
        bootstrap_servers=broker.bootstrap, group_id=f"ackstream-{a}", enable_auto_commit=False
    )
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
    consumer.assign([TopicPartition(second, 0)])
    consumer.seek_to_beginning()
    client = TreeClient(KafkaChannel(broker.bootstrap, a))
    seen: list = []

    def read(until, what):
        def step():
            assert all(q.exception() is None for q in queries)
            for messages in consumer.poll(timeout_ms=200).values():
                seen.extend(messages)
            return until()

        wait_for(step, timeout=150, interval=0, what=what)

    def committed():
        return group.committed(TopicPartition(inbox, 0))

    try:
        read(lambda: len(seen) == n, "B's messages at C")
        assert committed() in (None, 0)  # nothing acked by the last process yet
        assert all(lineage_of(m.headers) for m in seen)
        (r7,) = [m for m in seen if m.value == b"r7"]
        assert client.fail(r7, reason="refused by C") == 1
        assert client.ack(*[m for m in seen if m.value != b"r7"]) == n - 1
        read(lambda: len(seen) == n + 1, "r7 replayed from A's source through B")
        assert seen[-1].value == b"r7"
        read(lambda: committed() == 7, "A's offsets committed up to r7")
        client.ack(seen[-1])
        read(lambda: committed() == n, "every A offset committed")
    finally:
        for query in queries:
            query.stop()
        group.close(autocommit=False)
        consumer.close(autocommit=False)
    done, _ = channel.completions_since(None)
    outcomes = sorted(
        (r["offset"], r["attempt"], r["status"], r["reason"])
        for r in done.to_pylist()
        if r["status"] in ("acked", "failed")
    )
    assert outcomes == sorted(
        [(i, 0, "acked", None) for i in range(n) if i != 7]
        + [(7, 0, "failed", "refused by C"), (7, 1, "acked", None)]
    )
