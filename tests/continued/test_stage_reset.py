"""Storm's ``collector.resetTimeout`` from a stage: a pandas bolt of a topology that
continues upstream trees keeps the trees of the rows it is still working on alive,
as ``TreeClient.reset_timeout`` does for a plain consumer."""

import time
import uuid
from collections import Counter

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from ackstream import KafkaSink, LocalChannel, MemorySink, Topology
from ackstream.channels.kafka import KafkaChannel
from ackstream.sinks.continued import lineage_headers
from ackstream.testing import tracked_frame, with_lineage
from ackstream.vocabulary.records import RESET

from helpers import group_commits, wait_for

pytestmark = [pytest.mark.spark]


def reset_records(channel: LocalChannel) -> list[tuple[int, int, int]]:
    """``(root, value, kind)`` of every ack record written to ``channel``."""
    table = pq.read_table(channel.acks_dir)
    return sorted(zip(*(table.column(c).to_pylist() for c in ("root", "value", "kind"))))


def test_a_bolt_resets_the_upstream_trees_of_the_rows_it_names(spark, tmp_path):
    def bolt(frame, collector):  # defined here: Spark pickles it by value
        collector.reset_timeout(frame.index[frame["value"] == "keep"])
        return frame[["value"]]

    channel = LocalChannel(tmp_path / "upstream")
    headers = "array<struct<key: string, value: binary>>"
    rows = [
        ("keep", 0, [*lineage_headers([11, 12], edge=5)]),
        ("drop", 1, [*lineage_headers([13], edge=6)]),
        ("keep", 2, None),  # no lineage: untracked, nothing to reset
    ]
    frame = with_lineage(
        spark.createDataFrame(
            [(v, "middle", 0, offset, h) for v, offset, h in rows],
            f"value string, topic string, partition int, offset long, headers {headers}",
        ),
        source="down",
    )
    topology = (
        Topology("down", spark, channel, continue_trees=True)
        .pandas_bolt(bolt, "value string", collector=True)
        .sink(MemorySink())
    )
    topology.run_batch(frame)
    assert reset_records(channel) == [(11, 0, RESET), (12, 0, RESET)]


def test_a_bolt_of_a_topology_with_its_own_records_resets_nothing(spark, tmp_path):
    channel, sink = LocalChannel(tmp_path / "own"), MemorySink()

    def bolt(frame, collector):  # its records wait for the batch: nothing to reset
        return frame[["value"]].assign(reset=collector.reset_timeout())

    topology = (
        Topology("own", spark, channel)
        .pandas_bolt(bolt, "value string, reset long", collector=True)
        .sink(sink)
    )
    records = topology.run_batch(tracked_frame(spark, ["a", "b"]))
    assert [row["reset"] for row in sink.rows()] == [0, 0]
    assert not records.filter(pc.not_equal(pc.bit_wise_and(records["kind"], RESET), 0)).num_rows
    assert not list((tmp_path / "own" / "acks").iterdir())


@pytest.mark.broker
@pytest.mark.e2e  # waits out two and a half message timeouts
def test_a_slow_bolt_keeps_alive_the_trees_it_resets_and_only_those(
    spark, broker, new_topic, tmp_path
):
    """A (message timeout 8 s) -> B, whose pandas bolt works 2.5 timeouts on the
    messages of first attempts and resets the trees of R0 and R1 meanwhile: those are
    acked at their first attempt; R2 and R3 time out in A's acker and are replayed
    until B is free to take them, and acked then."""
    from kafka import KafkaProducer

    timeout_s = 8
    inbox, middle = new_topic(), new_topic()
    a, b = (f"{side}-{uuid.uuid4().hex[:8]}" for side in ("a", "b"))
    n = 4
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for i in range(n):
        producer.send(inbox, value=f"r{i}".encode())
    producer.send(middle, value=b"warm-up")  # no lineage: B runs it untracked
    producer.flush()
    producer.close()
    channel = KafkaChannel(broker.bootstrap, a)
    upstream = (
        Topology(a, spark, channel, message_timeout_ms=timeout_s * 1000)
        .map(
            lambda df: df.withColumn(
                "value", F.concat(F.upper(F.col("value").cast("string")), F.lit("#"), "_attempt")
            )
        )
        .sink(KafkaSink(broker.bootstrap, middle, continue_trees=True))
    )

    def slow(frame, collector):
        values = frame["value"].str.decode("utf-8")
        first = values.str.endswith("#0")
        kept = frame.index[first & values.str[:2].isin(["R0", "R1"])]
        began = time.monotonic()
        while first.any() and time.monotonic() - began < 2.5 * timeout_s:
            collector.reset_timeout(kept)
            time.sleep(timeout_s / 4)
        return frame[["value"]]

    sink = MemorySink()
    downstream = (
        Topology(b, spark, KafkaChannel(broker.bootstrap, a), continue_trees=True)
        .pandas_bolt(slow, "value binary", collector=True)
        .sink(sink)
    )
    options = {"kafka.bootstrap.servers": broker.bootstrap, "startingOffsets": "earliest"}
    queries = [
        downstream.start(
            downstream.read_stream({**options, "subscribe": middle}),
            str(tmp_path / "b"),
            trigger_ms=300,
        )
    ]

    def running(condition):
        assert all(q.exception() is None for q in queries)
        return condition()

    try:
        # A starts once B has run its bolt: B takes A's messages at once, and the
        # timeouts measure the bolt's work, not Spark starting B's Python workers
        wait_for(lambda: running(lambda: sink.rows()), timeout=150, what="B warmed up")
        queries.append(
            upstream.start(
                upstream.read_stream(
                    {
                        **options,
                        "subscribe": inbox,
                        "ackstream.retryInitialDelay": "200ms",
                        "ackstream.maxRetries": "20",
                    }
                ),
                str(tmp_path / "a"),
                trigger_ms=300,
            )
        )
        wait_for(
            lambda: running(lambda: group_commits(broker.bootstrap, a, inbox) == {0: n}),
            timeout=240,
            interval=0.5,
            what="every A offset committed",
        )
    finally:
        for query in queries:
            query.stop()
    done, _ = channel.completions_since(None)
    outcomes: dict[int, list] = {i: [] for i in range(n)}
    for r in done.to_pylist():
        if r["status"] in ("acked", "failed", "timed_out"):
            outcomes[r["offset"]].append((r["attempt"], r["status"]))
    assert outcomes[0] == outcomes[1] == [(0, "acked")]  # reset: alive through the work
    for i in (2, 3):  # not reset: timed out while B worked, replayed, then acked
        attempts = sorted(outcomes[i])
        assert attempts[0] == (0, "timed_out") and attempts[-1][1] == "acked"
        assert {status for _, status in attempts[:-1]} == {"timed_out"}
    seen = Counter(row["value"].decode() for row in sink.rows())
    assert seen["R0#0"] == seen["R1#0"] == 1
