"""A ``continue_trees`` KafkaSink in one topology batch, on the test broker: its
messages carry their rows' roots and a fresh edge, and the trees stay open until the
consumer's acks arrive (single roots, and an aggregate's rows, in both ack modes)."""

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from ackstream.sinks.continued import continued_acks, lineage_of
from ackstream.sinks.kafka import KafkaSink
from ackstream.testing import settle, tracked_frame
from ackstream.topology import Topology
from ackstream.vocabulary.records import ACK, FAIL

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def messages(bootstrap, topic, expected):
    """The ``(value, lineage)`` of the first ``expected`` messages of ``topic``."""
    import time

    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        out, deadline = [], time.monotonic() + 30
        while len(out) < expected and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                out += [(r.value.decode(), lineage_of(r.headers)) for r in records]
        return out
    finally:
        consumer.close()


def with_acks(records: pa.Table, *acks: pa.Table) -> pa.Table:
    return pa.concat_tables([records, *(a.select(records.column_names) for a in acks)])


def test_messages_carry_their_root_and_keep_the_tree_open_until_acked(spark, broker, new_topic):
    topic = new_topic()
    lines = ["a", "b", "c", "d"]
    topology = (
        Topology("continue", spark, None)
        .map(lambda df: df.withColumn("value", F.upper("value")))
        .sink(KafkaSink(broker.bootstrap, topic, continue_trees=True))
    )
    frame = tracked_frame(spark, lines)
    records = topology.run_batch(frame)
    roots = {r["value"].upper(): r["_root"] for r in frame.collect()}
    assert settle(records) == {root: "pending" for root in roots.values()}

    sent = dict(messages(broker.bootstrap, topic, 4))
    assert {value: lineage[0] for value, lineage in sent.items()} == {
        v: (r,) for v, r in roots.items()
    }
    edges = [lineage[1] for lineage in sent.values()]
    assert len(set(edges)) == 4 and 0 not in edges

    acked = continued_acks([sent["A"], sent["B"], sent["D"]], ACK, 1)
    failed = continued_acks([sent["C"]], FAIL, 1, "bad")
    outcome = settle(with_acks(records, acked, failed))
    assert outcome == {
        roots["A"]: "acked",
        roots["B"]: "acked",
        roots["C"]: "failed",
        roots["D"]: "acked",
    }
    # an ack of the wrong edge, or none, leaves the tree open
    wrong = continued_acks([((roots["A"],), sent["B"][1])], ACK, 1)
    assert settle(with_acks(records, wrong))[roots["A"]] == "pending"


@pytest.mark.parametrize("ack_mode", ["telescoped", "per_stage"])
def test_an_aggregate_row_continues_every_tree_it_is_anchored_to(
    spark, broker, new_topic, ack_mode
):
    topic = new_topic()
    lines = ["a b", "b c", "c"]
    topology = (
        Topology("continue-agg", spark, None, ack_mode=ack_mode)
        .explode(F.split(F.col("value"), " "), "word")
        .aggregate("word", F.count("*").alias("n"))
        .map(lambda df: df.selectExpr("*", "word AS key", "word AS value"))
        .sink(KafkaSink(broker.bootstrap, topic, continue_trees=True))
    )
    frame = tracked_frame(spark, lines)
    records = topology.run_batch(frame)
    r = [row["_root"] for row in frame.orderBy("offset").collect()]
    assert settle(records) == {root: "pending" for root in r}

    sent = dict(messages(broker.bootstrap, topic, 3))
    assert {w: set(lineage[0]) for w, lineage in sent.items()} == {
        "a": {r[0]},
        "b": {r[0], r[1]},
        "c": {r[1], r[2]},
    }
    # "c" not acked yet: its two roots stay open, the first completes
    partial = settle(with_acks(records, continued_acks([sent["a"], sent["b"]], ACK, 1)))
    assert partial == {r[0]: "acked", r[1]: "pending", r[2]: "pending"}
    every = continued_acks(list(sent.values()), ACK, 1)
    assert settle(with_acks(records, every)) == {root: "acked" for root in r}
