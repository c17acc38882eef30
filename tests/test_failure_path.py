"""The failure path at the sizes the record path runs: whole batches failing, on the Kafka
channel, with Spark's Kafka connector in the session (its reader and its writer).

A stage that fails every record (a Spark error out of the batch's jobs, or a row's
failure in a bolt), and a downstream outage that fails every record for a while and
then ends: the query stays alive, every record ends acked or dead-lettered with its
reason, nothing is lost, and the records held never pass ``maxPending``. ``make test``
runs them at a few thousand records a batch; the runs marked ``long`` at 20,000 and
100,000 (``make test-long``; ``make test-cluster`` runs the 20,000 ones).
"""

from __future__ import annotations

import threading
import time
import uuid

import pandas as pd
import pytest
from pyspark.sql import functions as F

from ackstream import KafkaChannel, KafkaSink, Topology
from ackstream.ui.status import source_metrics

from helpers import consume, delete_topic, group_commits, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.broker]

#: Records of the runs in ``make test``; the long runs take the sizes of the benchmarks.
SMALL = 3_000
LONG_SIZES = [pytest.param(n, marks=pytest.mark.long, id=f"{n}") for n in (20_000, 100_000)]


def produce_many(bootstrap: str, topic: str, n: int, partitions: int) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=1 << 20)
    try:
        for i in range(n):
            producer.send(topic, f"v{i}".encode(), partition=i % partitions)
        producer.flush()
    finally:
        producer.close()


def start(topology: Topology, broker, inbox: str, checkpoint, per_batch: int, **options):
    stream = topology.read_stream(
        {
            "kafka.bootstrap.servers": broker.bootstrap,
            "subscribe": inbox,
            "startingOffsets": "earliest",
            "maxOffsetsPerTrigger": str(per_batch),
            "ackstream.retryInitialDelay": "200ms",
            "ackstream.retryMaxDelay": "2s",
            **{key: str(value) for key, value in options.items()},
        }
    )
    return topology.start(stream, str(checkpoint), trigger_ms=200)


def settle(running, records: int, timeout_s: float, watch=None) -> dict:
    """Poll the source's figures until every record is acked or dead-lettered and none
    is pending or waiting; the query must stay alive throughout. ``watch(figures)`` sees
    each new set of figures."""
    deadline, figures = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        error = running.exception()
        assert error is None, f"the query stopped: {error}"
        latest = source_metrics(running.query.lastProgress)
        if latest is not None and latest != figures:
            figures = latest
            if watch is not None:
                watch(figures)
            done = figures.get("acked", 0) + figures.get("dead_lettered", 0)
            if done >= records and not figures["pending"] and not figures.get("waiting", 0):
                return figures
        running.query.awaitTermination(0.2)
    pytest.fail(f"not settled within {timeout_s:g} s; the source's last figures: {figures}")


def dead_letters(bootstrap: str, topic: str) -> dict[tuple[int, int], str]:
    found = {}
    for message in consume(bootstrap, topic):
        headers = {k: v.decode() for k, v in message.headers}
        key = (int(headers["ackstream.partition"]), int(headers["ackstream.offset"]))
        found[key] = headers["ackstream.reason"]
    return found


def topology_for(spark, broker, name: str, **kwargs) -> Topology:
    return Topology(name, spark, KafkaChannel(broker.bootstrap, name), **kwargs)


def run_every_record_failing_in_sql(spark, broker, new_topic, tmp_path, records: int):
    """A DataFrame stage whose expression raises for every record fails each batch's
    jobs: after one round of groups the records are retried together and dead-lettered
    with Spark's error, in a bounded number of batches. The query is stopped and
    started again from its checkpoint in the middle: it goes on from there (a batch's
    completions too big for one Kafka message once made every restart fail again)."""
    inbox, out = new_topic(partitions=2), new_topic(partitions=2)
    name = f"allsql-{uuid.uuid4().hex[:8]}"
    produce_many(broker.bootstrap, inbox, records, 2)

    def topology():
        return (
            topology_for(spark, broker, name)
            .map(
                lambda df: df.withColumn("value", F.raise_error(F.lit("every record"))), name="bad"
            )
            .sink(KafkaSink(broker.bootstrap, out))
        )

    options = {"ackstream.maxRetries": 2}
    running = start(topology(), broker, inbox, tmp_path / "ck", records, **options)
    try:
        wait_for(
            lambda: (
                running.exception() or (running.query.lastProgress or {}).get("batchId", 0) >= 3
            ),
            timeout=300,
            what="a few batches",
        )
        assert running.exception() is None
    finally:
        running.stop()
    running = start(topology(), broker, inbox, tmp_path / "ck", records, **options)
    try:
        figures = settle(running, records, timeout_s=600)
        assert running.is_active()
        batches = running.query.lastProgress["batchId"] + 1  # numbered on from the first run
    finally:
        running.stop()
    assert figures["dead_lettered"] == records and figures["acked"] == 0
    letters = dead_letters(broker.bootstrap, f"{name}.dead")
    assert len(letters) == records
    assert all(r.startswith("batch_failed:") and "every record" in r for r in letters.values())
    # a round of 8 groups (again after the restart), 3 attempts together, idle batches:
    # never a batch per record
    assert batches < 60, batches
    assert group_commits(broker.bootstrap, name, inbox) == {0: records // 2, 1: records // 2}


@pytest.mark.e2e
def test_a_sql_stage_failing_every_record_ends_in_dead_letters(spark, broker, new_topic, tmp_path):
    run_every_record_failing_in_sql(spark, broker, new_topic, tmp_path, SMALL)


@pytest.mark.parametrize("records", LONG_SIZES)
def test_a_sql_stage_failing_every_record_at_size(spark, broker, new_topic, tmp_path, records):
    run_every_record_failing_in_sql(spark, broker, new_topic, tmp_path, records)


def run_a_bolt_failing_every_record(spark, broker, new_topic, tmp_path, records, ack_mode):
    """A pandas bolt raising on every frame fails every row's root: each record is
    replayed with backoff and dead-lettered with the bolt's error after its retries."""
    inbox, out = new_topic(partitions=2), new_topic(partitions=2)
    name = f"allpd-{uuid.uuid4().hex[:8]}"
    produce_many(broker.bootstrap, inbox, records, 2)

    def bolt(frame: pd.DataFrame) -> pd.DataFrame:
        raise ConnectionError("the downstream service refused")

    topology = (
        topology_for(spark, broker, name, ack_mode=ack_mode)
        .pandas_bolt(bolt, "value string", name="call")
        .sink(KafkaSink(broker.bootstrap, out))
    )
    running = start(
        topology, broker, inbox, tmp_path / "ck", records, **{"ackstream.maxRetries": 1}
    )
    try:
        figures = settle(running, records, timeout_s=600)
        assert running.is_active()
    finally:
        running.stop()
    assert figures["dead_lettered"] == records
    letters = dead_letters(broker.bootstrap, f"{name}.dead")
    assert len(letters) == records
    assert all("ConnectionError: the downstream service refused" in r for r in letters.values())
    assert all("call" in r for r in letters.values())  # the stage is named


@pytest.mark.e2e
@pytest.mark.parametrize("ack_mode", ["telescoped", "per_stage"])
def test_a_bolt_failing_every_record_dead_letters_each(
    spark, broker, new_topic, tmp_path, ack_mode
):
    run_a_bolt_failing_every_record(spark, broker, new_topic, tmp_path, SMALL, ack_mode)


@pytest.mark.parametrize("records", LONG_SIZES)
@pytest.mark.parametrize("ack_mode", ["telescoped", "per_stage"])
def test_a_bolt_failing_every_record_at_size(spark, broker, new_topic, tmp_path, records, ack_mode):
    run_a_bolt_failing_every_record(spark, broker, new_topic, tmp_path, records, ack_mode)


def run_an_outage(spark, broker, new_topic, tmp_path, per_batch: int, outage_s: float):
    """Every record fails while the downstream is down (a bolt whose service call fails
    while a flag file exists), then goes through: nothing is lost or dead-lettered, the
    replays wait their backoff (seen in the source's figures), and the records held (in
    flight and waiting) never pass maxPending. The outage lasts ``outage_s`` from the
    first failure seen."""
    records, max_pending = 3 * per_batch, 2 * per_batch
    inbox, out = new_topic(partitions=2), new_topic(partitions=2)
    name = f"outage-{uuid.uuid4().hex[:8]}"
    produce_many(broker.bootstrap, inbox, records, 2)
    down = tmp_path / "down"
    down.touch()

    def call(frame: pd.DataFrame) -> pd.DataFrame:
        if down.exists():
            raise ConnectionError("the downstream service is down")
        return frame[["value"]]

    topology = (
        topology_for(spark, broker, name, message_timeout_ms=120_000)
        .pandas_bolt(call, "value binary", name="call")
        .sink(KafkaSink(broker.bootstrap, out))
    )
    held, waited, failing_since, ended = [], [], [], []

    def watch(figures):
        held.append(figures["pending"] + figures.get("waiting", 0))
        waited.append(figures.get("waiting", 0))
        if figures["failed"] and not failing_since:
            failing_since.append(time.monotonic())
        if failing_since and time.monotonic() - failing_since[0] > outage_s and down.exists():
            down.unlink()  # the outage ends
            ended.append(time.monotonic())

    running = start(
        topology,
        broker,
        inbox,
        tmp_path / "ck",
        per_batch,
        **{"ackstream.maxRetries": 100, "ackstream.maxPending": max_pending},
    )
    try:
        figures = settle(running, records, timeout_s=outage_s + 900, watch=watch)
        settled_at = time.monotonic()
        assert running.is_active()
    finally:
        running.stop()
    assert not down.exists()  # it settled after the outage, not before it ended
    print(  # the figures of the run, for the reliability page (pytest -s)
        f"outage of {outage_s} s at {per_batch} a batch: {figures['failed']} failures, "
        f"at most {max(held)} held of maxPending {max_pending}, every record acked "
        f"{settled_at - ended[0]:.0f} s after the outage ended"
    )
    assert figures["acked"] == records and figures["dead_lettered"] == 0
    assert figures["failed"] >= max_pending and max(waited) > 0  # it failed, and backed off
    assert max(held) <= max_pending
    assert not consume(broker.bootstrap, f"{name}.dead")
    assert {m.value for m in consume(broker.bootstrap, out)} == {
        f"v{i}".encode() for i in range(records)
    }


@pytest.mark.e2e
def test_a_downstream_outage_then_its_end_loses_nothing(spark, broker, new_topic, tmp_path):
    run_an_outage(spark, broker, new_topic, tmp_path, per_batch=1_000, outage_s=15)


@pytest.mark.long
def test_a_one_minute_outage_at_100000_a_batch(spark, broker, new_topic, tmp_path):
    run_an_outage(spark, broker, new_topic, tmp_path, per_batch=100_000, outage_s=60)


@pytest.mark.e2e
@pytest.mark.parametrize("writer", ["spark", "python"])
def test_stop_returns_while_a_stage_hangs_with_either_kafka_writer(
    spark, broker, new_topic, tmp_path, writer
):
    """A stage hangs, no deadline: stop() cancels the batch's jobs, and the sink does not
    write the batch again row by row (which ran the hung stage once more, in a job no
    stop cancelled). Bounded by a generous poll, not a timing assertion."""
    inbox, out = new_topic(partitions=1), new_topic(partitions=1)
    name = f"hung-{uuid.uuid4().hex[:8]}"
    produce_many(broker.bootstrap, inbox, 10, 1)
    started = tmp_path / "started"

    def bolt(frame: pd.DataFrame) -> pd.DataFrame:
        started.touch()
        time.sleep(3600)
        return frame[["value"]]

    topology = (
        topology_for(spark, broker, name, batch_deadline_ms=None)
        .pandas_bolt(bolt, "value binary", name="stuck")
        .sink(KafkaSink(broker.bootstrap, out, writer=writer))
    )
    running = start(topology, broker, inbox, tmp_path / "ck", 10)
    wait_for(started.exists, timeout=120, what="the stage to start hanging")
    began = time.monotonic()
    stopping = threading.Thread(target=running.stop, daemon=True)
    stopping.start()
    stopping.join(timeout=120)
    assert not stopping.is_alive(), "stop() did not return while a stage hung"
    print(f"stop() returned in {time.monotonic() - began:.1f} s with the {writer} writer")
    assert not any(q.isActive for q in running.queries)


@pytest.fixture(scope="module")
def strict_broker():
    """A broker of its own that creates no topic a client asks for (as production
    clusters are often set): a deleted topic stays deleted."""
    from broker import KafkaBroker

    running = KafkaBroker(**{"auto.create.topics.enable": "false"}).start()
    yield running
    running.stop()


def stopped_with(running, timeout_s: float):
    """The error the topology stopped with, polled for."""
    wait_for(lambda: running.exception() is not None, timeout=timeout_s, what="the query to stop")
    return str(running.exception())


@pytest.mark.long
@pytest.mark.parametrize("deleted", ["sink", "acks", "done"])
def test_a_topic_deleted_mid_run_stops_the_topology_naming_it(
    spark, strict_broker, tmp_path, deleted
):
    """The sink's output topic, or the channel's acks or completions topic, deleted while
    the topology runs on brokers that create no topics: the query stops with one error
    naming the topic (it waited for it, replaying, or timed out unnamed)."""
    from broker import create_topic

    bootstrap = strict_broker.bootstrap
    inbox, out = create_topic(bootstrap, 1), create_topic(bootstrap, 1)
    name = f"del-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, 1, name=f"{name}.dead")
    produce_many(bootstrap, inbox, 400, 1)
    topology = Topology(name, spark, KafkaChannel(bootstrap, name), ack_mode="per_stage").sink(
        KafkaSink(bootstrap, out)
    )
    running = start(topology, strict_broker, inbox, tmp_path / "ck", 20)
    try:
        wait_for(
            lambda: (source_metrics(running.query.lastProgress) or {}).get("acked", 0) > 0,
            timeout=300,
            what="the first acks",
        )
        topic = {"sink": out, "acks": f"{name}.acks", "done": f"{name}.done"}[deleted]
        delete_topic(bootstrap, topic)
        deleted_at = time.monotonic()
        produce_many(bootstrap, inbox, 400, 1)  # more to write, ack and complete
        error = stopped_with(running, timeout_s=120)
        print(f"{deleted} topic deleted: stopped {time.monotonic() - deleted_at:.0f} s after")
    finally:
        running.stop()
    assert repr(topic) in error, error
    assert "deleted" in error or "does not exist" in error, error
