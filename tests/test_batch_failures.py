"""Failures of a whole micro-batch on the broker: a SQL stage raising at run time on one
record, and a bolt that hangs on one record. Each costs only the record at fault (a
dead letter with its reason); the query goes on, and stop() returns whatever a stage
does."""

import threading
import time

import pandas as pd
import pytest
from pyspark.sql import functions as F

from ackstream import MemorySink, Topology
from ackstream.channels.local import LocalChannel
from ackstream.sinks.kafka import KafkaSink
from ackstream.spark.session import has_kafka_connector

from helpers import (
    consume,
    from_earliest,
    group_commits,
    new_inbox,
    stop_once_settled,
    tracked_kafka_stream,
    wait_for,
)

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def tracked_stream(spark, broker, inbox: str, name: str, channel, **options):
    """The source of ``name`` on ``inbox``: dead letters to ``<name>.dead``, quick replays."""
    options = {
        "ackstream.deadLetterTopic": f"{name}.dead",
        "ackstream.retryInitialDelay": "100ms",
        **options,
    }
    return tracked_kafka_stream(spark, broker.bootstrap, inbox, name, channel, **options)


def bolt_that(does, on: str):
    """A pandas bolt passing each record's text on, that first ``does()`` in a batch
    holding the record ``on``."""

    def bolt(frame):
        text = frame["value"].map(bytes.decode)
        if (text == on).any():
            does()
        return pd.DataFrame({"text": text})

    return bolt


def letters(bootstrap: str, topic: str) -> dict[int, str]:
    found = {}
    for message in consume(bootstrap, topic):
        headers = {k: v.decode() for k, v in message.headers}
        found[int(headers["ackstream.offset"])] = headers["ackstream.reason"]
    return found


@pytest.mark.e2e
def test_a_sql_stage_raising_on_one_record_dead_letters_only_that_record(
    spark, broker, new_topic, tmp_path
):
    """A DataFrame stage whose expression raises at run time for one record fails its
    batch's Spark job: the batch's roots are isolated, and only the record at fault is
    dead-lettered, with Spark's error as its reason."""
    values = [f"v{i}" for i in range(10)]
    values[6] = "poison"
    inbox, name = new_inbox(broker, new_topic, "sqlfail", values)

    def checked(df):
        text = F.col("value").cast("string")
        return df.withColumn(
            "text",
            F.when(text == "poison", F.raise_error(F.lit("poison in SQL"))).otherwise(text),
        )

    stream = tracked_stream(
        spark, broker, inbox, name, tmp_path / "channel", **{"ackstream.maxRetries": 1}
    )
    sink = MemorySink()
    running = (
        Topology(name, spark, LocalChannel(tmp_path / "channel"))
        .map(checked, name="check")
        .sink(sink)
        .start(stream, str(tmp_path / "checkpoint"), trigger_ms=200)
    )
    stop_once_settled(running, len(values), timeout_s=240, still_active=True)
    assert group_commits(broker.bootstrap, name, inbox) == {0: len(values)}
    assert sorted(set(r["text"] for r in sink.rows())) == sorted(set(values) - {"poison"})
    reasons = letters(broker.bootstrap, f"{name}.dead")
    assert sorted(reasons) == [6]
    assert reasons[6].startswith("batch_failed:") and "poison in SQL" in reasons[6]


@pytest.mark.e2e
@pytest.mark.parametrize("reader", ["python", "spark"])
def test_a_python_worker_exiting_on_one_record_dead_letters_it_naming_the_stage(
    spark, broker, new_topic, tmp_path, reader
):
    """A pandas bolt whose worker process exits on one record (``os._exit``) fails its
    batch's Spark job: the record at fault alone is dead-lettered, and its reason names
    the stage and that the Python worker exited (it was py4j's ``An error occurred
    while calling o4273.getResult.``)."""
    import os

    from ackstream.spark.session import has_kafka_connector

    if reader == "spark" and not has_kafka_connector(spark):
        pytest.skip("Spark's Kafka connector is not on this session's class path")
    values = ["a", "b", "exit", "c"]
    inbox, name = new_inbox(broker, new_topic, "exits", values)
    sink = MemorySink()
    topology = (
        Topology(name, spark, LocalChannel(tmp_path / "channel"))
        .pandas_bolt(bolt_that(lambda: os._exit(3), on="exit"), "text string", name="exiting")
        .sink(sink)
    )
    options = {
        "ackstream.deadLetterTopic": f"{name}.dead",
        "ackstream.retryInitialDelay": "100ms",
        "ackstream.maxRetries": 0,
        "ackstream.recordReader": reader,
    }
    stream = topology.read_stream(from_earliest(broker.bootstrap, inbox, **options))
    running = topology.start(stream, str(tmp_path / "checkpoint"), trigger_ms=200)
    stop_once_settled(running, len(values), timeout_s=240, still_active=True)
    assert sorted(set(r["text"] for r in sink.rows())) == ["a", "b", "c"]
    reasons = letters(broker.bootstrap, f"{name}.dead")
    assert sorted(reasons) == [2]
    assert reasons[2].startswith("batch_failed: a Python worker exited"), reasons[2]
    assert "'exiting'" in reasons[2] and "getResult" not in reasons[2], reasons[2]


@pytest.mark.e2e
def test_a_bolt_hanging_on_one_record_is_cancelled_at_the_deadline_and_dead_lettered(
    spark, broker, new_topic, tmp_path
):
    """Storm's message timeout for a hung bolt: the batch runs past ``batch_deadline_ms``,
    its jobs are cancelled, and the hanging record is isolated and dead-lettered with a
    reason naming the deadline; the others are written and the query goes on."""
    values = ["a", "b", "hang", "c"]
    inbox, name = new_inbox(broker, new_topic, "hang", values)
    stream = tracked_stream(
        spark, broker, inbox, name, tmp_path / "channel", **{"ackstream.maxRetries": 0}
    )
    sink = MemorySink()
    running = (
        Topology(name, spark, LocalChannel(tmp_path / "channel"), batch_deadline_ms=8_000)
        .pandas_bolt(bolt_that(lambda: time.sleep(3600), on="hang"), "text string", name="slow")
        .sink(sink)
        .start(stream, str(tmp_path / "checkpoint"), trigger_ms=200)
    )
    stop_once_settled(running, len(values), timeout_s=240, still_active=True)
    assert group_commits(broker.bootstrap, name, inbox) == {0: len(values)}
    assert sorted(set(r["text"] for r in sink.rows())) == ["a", "b", "c"]
    reasons = letters(broker.bootstrap, f"{name}.dead")
    assert sorted(reasons) == [2]
    assert reasons[2].startswith("batch_failed: batch_deadline_ms=8000 passed")
    assert "slow" in reasons[2]


@pytest.mark.e2e  # test_failure_path's stop tests and test_stop_queries cover it too
@pytest.mark.parametrize("writer", ["python", "spark"])
def test_stop_returns_while_a_stage_hangs(spark, broker, new_topic, tmp_path, writer):
    """No deadline, a stage that never returns before a Kafka sink: stop() cancels the
    batch's jobs and returns, whichever writer's job was computing the stage (Spark's
    writer once wrote the batch again row by row after the cancel, in a job nothing
    cancelled). Bounded by a generous poll, not a timing assertion."""
    if writer == "spark" and not has_kafka_connector(spark):
        pytest.skip("Spark's Kafka connector is not on this session's class path")
    inbox, name = new_inbox(broker, new_topic, "stuck", ["hang"])
    started = tmp_path / "started"

    def bolt(frame):
        started.touch()
        time.sleep(3600)
        return pd.DataFrame({"text": frame["value"].map(bytes.decode)})

    stream = tracked_stream(spark, broker, inbox, name, tmp_path / "channel")
    running = (
        Topology(name, spark, LocalChannel(tmp_path / "channel"), batch_deadline_ms=None)
        .pandas_bolt(bolt, "text string", name="stuck")
        .sink(KafkaSink(broker.bootstrap, new_topic(), key=None, value="text", writer=writer))
        .start(stream, str(tmp_path / "checkpoint"), trigger_ms=200)
    )
    wait_for(started.exists, timeout=120, what="the stage to start hanging")
    stopping = threading.Thread(target=running.stop, daemon=True)
    asked = time.monotonic()
    stopping.start()
    stopping.join(timeout=120)
    print(f"stop() with the {writer} writer returned in {time.monotonic() - asked:.1f} s")
    assert not stopping.is_alive(), "stop() did not return while a stage hung"
    assert not any(q.isActive for q in running.queries)
