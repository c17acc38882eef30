"""A pandas bolt failing and rejecting rows through its collector, on the broker: the
failed records replay and are acked on their next attempt, the rejected ones are
dead-lettered with the stage and reason, every other record's output is written once,
and the bolt is called once for each row of each attempt (nothing was isolated)."""

from __future__ import annotations

import collections
import uuid

import pandas as pd
import pytest

from ackstream import KafkaChannel, KafkaSink, Topology

from helpers import consume, from_earliest, group_commits, stop_once_settled

pytestmark = [pytest.mark.spark, pytest.mark.broker]

RECORDS = 200


@pytest.mark.parametrize("ack_mode", ["telescoped", "per_stage"])
def test_collector_fails_replay_then_ack_and_rejects_are_dead_lettered(
    spark, broker, new_topic, tmp_path, ack_mode
):
    from kafka import KafkaProducer

    inbox, outbox = new_topic(partitions=2), new_topic(partitions=1)
    name = f"coll-{uuid.uuid4().hex[:8]}"
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for i in range(RECORDS):
        producer.send(inbox, f"v{i}".encode(), partition=i % 2)
    producer.flush()
    producer.close()
    seen = tmp_path / "seen"

    # defined here, not in the module: Spark's Python workers cannot import a test module
    def failing(i: int) -> bool:
        return i % 10 == 3

    def rejected(i: int) -> bool:
        return i % 50 == 7

    def check(frame: pd.DataFrame, collector) -> pd.DataFrame:
        """Fails some records on their first attempt, rejects others; notes each row."""
        number = frame["value"].map(lambda v: int(bytes(v)[1:]))
        rows = zip(frame["partition"], frame["offset"], frame["_attempt"])
        lines = [f"{p} {o} {a}\n" for p, o, a in rows]
        with open(seen, "a") as f:
            f.write("".join(lines))
        collector.fail(number.map(failing) & (frame["_attempt"] == 0), "try again")
        collector.reject(frame.index[number.map(rejected)], "not a record")
        return frame[["value"]]

    topology = (
        Topology(name, spark, KafkaChannel(broker.bootstrap, name), ack_mode=ack_mode)
        .pandas_bolt(check, "value binary", collector=True, name="check")
        .sink(KafkaSink(broker.bootstrap, outbox))
    )
    options = {
        "maxOffsetsPerTrigger": "100",
        "ackstream.retryInitialDelay": "200ms",
        "ackstream.maxRetries": "3",
    }
    stream = topology.read_stream(from_earliest(broker.bootstrap, inbox, **options))
    running = topology.start(stream, str(tmp_path / "checkpoint"), trigger_ms=200)
    figures = stop_once_settled(running, RECORDS, timeout_s=240)

    fail_set = {i for i in range(RECORDS) if failing(i)}  # none is also rejected
    reject_set = {i for i in range(RECORDS) if rejected(i)}
    assert figures["failed"] == len(fail_set)
    assert figures["rejected"] == figures["dead_lettered"] == len(reject_set)
    assert figures["acked"] == RECORDS - len(reject_set)
    assert group_commits(broker.bootstrap, name, inbox) == {0: RECORDS // 2, 1: RECORDS // 2}

    done, _ = KafkaChannel(broker.bootstrap, name).completions_since(None)
    outcome = {
        (r["partition"] + 2 * r["offset"], r["attempt"]): r["status"] for r in done.to_pylist()
    }
    for i in fail_set:
        assert (outcome[(i, 0)], outcome[(i, 1)]) == ("failed", "acked"), i
    for i in reject_set:
        assert outcome[(i, 0)] == "rejected" and (i, 1) not in outcome, i

    letters = {}
    for message in consume(broker.bootstrap, f"{name}.dead"):
        headers = {k: v.decode() for k, v in message.headers}
        number = int(headers["ackstream.partition"]) + 2 * int(headers["ackstream.offset"])
        letters[number] = headers["ackstream.reason"]
    assert letters == dict.fromkeys(reject_set, "rejected: check: not a record")

    written = collections.Counter(m.value.decode() for m in consume(broker.bootstrap, outbox))
    assert written == collections.Counter(f"v{i}" for i in range(RECORDS) if i not in reject_set)

    calls = collections.Counter(seen.read_text().splitlines())
    assert set(calls.values()) == {1}  # each row once an attempt: no part called again
    assert len(calls) == RECORDS + len(fail_set)
