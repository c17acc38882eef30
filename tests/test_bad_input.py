"""Bad input on the broker: malformed records end as dead letters with their
reason, never as a stopped query; an unreachable broker or a missing topic is an
error before the query starts."""

import json
import uuid

import pytest
from pyspark.sql import functions as F

from ackstream import MemorySink, Topology
from ackstream.channels.kafka import KafkaChannel
from ackstream.sources import kafka as kafka_source

from helpers import group_commits, stop_once_settled, tracked_kafka_stream

pytestmark = [pytest.mark.spark, pytest.mark.broker]

HUGE = 100_000
LIMIT = 4096


def test_malformed_records_are_dead_lettered_with_their_reason_once_and_never_replayed(
    spark, broker, new_topic, tmp_path
):
    from kafka import KafkaProducer

    from helpers import consume

    inbox, name = new_topic(partitions=1), f"bad-{uuid.uuid4().hex[:8]}"
    values = [json.dumps({"n": i}).encode() for i in range(12)]
    bad = {3: None, 5: b"\xff\xfe not utf-8", 7: b"{truncated json", 9: b"x" * HUGE}
    for offset, value in bad.items():
        values[offset] = value
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, max_request_size=1 << 20)
    for i, value in enumerate(values):
        producer.send(inbox, key=str(i).encode(), value=value, partition=0)
    producer.flush()
    producer.close()

    options = {"ackstream.maxValueBytes": LIMIT, "ackstream.messageTimeout": "20s"}
    stream = tracked_kafka_stream(spark, broker.bootstrap, inbox, name, "kafka", **options)
    sink = MemorySink()
    text = F.col("value").cast("string")
    topology = (
        Topology(name, spark, KafkaChannel(broker.bootstrap, name), message_timeout_ms=20_000)
        .reject_where(F.col("value").isNull(), "value is null")
        .reject_where(~F.is_valid_utf8(text), "value is not UTF-8")
        .map(lambda df: df.withColumn("doc", F.from_json(text, "n int")))
        .reject_where(F.col("doc.n").isNull(), F.concat(F.lit("not JSON: "), text))
        .sink(sink)
    )
    running = topology.start(stream, str(tmp_path / "checkpoint"), trigger_ms=300)
    stop_once_settled(running, len(values), timeout_s=120, still_active=True)

    assert group_commits(broker.bootstrap, name, inbox) == {0: len(values)}
    assert sorted(r["doc"]["n"] for r in sink.rows()) == sorted(set(range(12)) - set(bad))
    letters = {}
    for message in consume(broker.bootstrap, f"{name}.dead"):
        headers = {k: v.decode() for k, v in message.headers}
        letters[int(headers["ackstream.offset"])] = (headers, message.value)
    assert sorted(letters) == sorted(bad)  # each exactly once
    assert {h["ackstream.attempts"] for h, _ in letters.values()} == {"1"}  # no replays
    reasons = {offset: h["ackstream.reason"] for offset, (h, _) in letters.items()}
    assert reasons[3] == "rejected: value is null"
    assert reasons[5] == "rejected: value is not UTF-8"
    assert reasons[7] == "rejected: not JSON: {truncated json"
    assert reasons[9] == (
        f"rejected: value of {HUGE} bytes is over ackstream.maxValueBytes "
        f"({LIMIT}); raise that option to process it"
    )
    assert letters[7][1] == bad[7]  # the original value travels with its letter...
    assert letters[9][1] is None  # ...unless it is the reason (it stays in the topic)


def test_an_unreachable_broker_is_an_error_at_load(spark):
    with pytest.raises(Exception) as caught:
        (
            spark.readStream.format("ackstream")
            .option("kafka.bootstrap.servers", "127.0.0.1:9")
            .option("subscribe", "events")
            .load()
        )
    assert "no Kafka broker answers at 127.0.0.1:9 (option kafka.bootstrap.servers)" in str(
        caught.value
    )


def test_an_unreachable_broker_is_ackstreams_own_error_from_topology_read_stream(
    spark, tmp_path, monkeypatch
):
    """Checked in this process before load(): the error itself, not inside Spark's
    AnalysisException, and without starting Spark's Python worker first."""
    from ackstream import LocalChannel, MemorySink, Topology
    from ackstream.errors import EnvironmentProblem

    monkeypatch.setattr(kafka_source, "CHECK_TIMEOUT_MS", 1_000)  # nobody answers anyway

    topology = Topology("unreachable", spark, LocalChannel(str(tmp_path / "ch")))
    with pytest.raises(EnvironmentProblem) as caught:
        topology.sink(MemorySink()).read_stream(
            {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "events"}
        )
    assert caught.value.what.startswith("no Kafka broker answers at 127.0.0.1:9")


def test_a_security_protocol_the_broker_does_not_speak_is_a_bounded_error_naming_it(
    broker, monkeypatch
):
    import time

    from ackstream.config.source import parse
    from ackstream.errors import EnvironmentProblem
    from ackstream.sources.upstream import open_upstream

    config = parse(
        {
            "kafka.bootstrap.servers": broker.bootstrap,
            "subscribe": "events",
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.plain.username": "user",
            "kafka.sasl.plain.password": "secret",
        }
    )
    monkeypatch.setattr(kafka_source, "CHECK_TIMEOUT_MS", 1_000)  # the bound, shorter
    started = time.monotonic()
    with pytest.raises(EnvironmentProblem, match="kafka.security.protocol=SASL_SSL") as caught:
        open_upstream(config).check()
    assert time.monotonic() - started < 30
    assert "secret" not in str(caught.value)


def test_a_missing_topic_is_an_error_at_load(spark, broker):
    with pytest.raises(Exception) as caught:
        (
            spark.readStream.format("ackstream")
            .option("kafka.bootstrap.servers", broker.bootstrap)
            .option("subscribe", "no-such-topic-here")
            .load()
        )
    assert "no-such-topic-here (option subscribe) do not exist" in str(caught.value)


@pytest.mark.parametrize("reader", ["python", "spark"])
def test_a_start_past_a_partition_s_end_stops_the_query_naming_it_and_commits_nothing(
    spark, broker, new_topic, tmp_path, reader
):
    """``startingOffsets`` 99,999 on a partition of 100 records: the query's first
    planning stops it with the option, the partition and its range, and the group's
    committed offset is not moved (it was moved to 99,999, and the query then died
    saying the topic had been deleted and re-created)."""
    from kafka import KafkaProducer

    from ackstream.channels.local import LocalChannel
    from ackstream.spark.session import has_kafka_connector

    from helpers import wait_for

    if reader == "spark" and not has_kafka_connector(spark):
        pytest.skip("Spark's Kafka connector is not on this session's class path")
    inbox, name = new_topic(), f"past-{uuid.uuid4().hex[:8]}"
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for n in range(100):
        producer.send(inbox, b"%d" % n, partition=0)
    producer.flush()
    producer.close()
    topology = Topology(name, spark, LocalChannel(tmp_path / "channel")).sink(MemorySink())
    stream = topology.read_stream(
        {
            "kafka.bootstrap.servers": broker.bootstrap,
            "subscribe": inbox,
            "startingOffsets": json.dumps({inbox: {"0": 99_999}}),
            "ackstream.recordReader": reader,
        }
    )
    running = topology.start(stream, str(tmp_path / "checkpoint"), trigger_ms=200)
    try:
        error = wait_for(running.exception, timeout=120, interval=0.5, what="the query to fail")
    finally:
        running.stop()
    assert "option 'startingOffsets'" in str(error), error
    assert f"{inbox}[0] starts at 0 and ends at 100, and 99999 is past its end" in str(error)
    assert group_commits(broker.bootstrap, name, inbox) == {0: None}


def test_offsets_without_a_record_do_not_hold_the_commit_back(spark, broker, new_topic, tmp_path):
    """Transaction markers take offsets that carry no record; the source acks them itself
    (the source timeout is far away here, so only that can let the commit pass them)."""
    from kafka import KafkaProducer

    inbox, name = new_topic(partitions=1), f"gaps-{uuid.uuid4().hex[:8]}"
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=name)
    producer.init_transactions()
    for batch in ([b"a", b"b"], [b"c"]):  # offsets 0, 1, marker 2, 3, marker 4
        producer.begin_transaction()
        for value in batch:
            producer.send(inbox, value, partition=0)
        producer.commit_transaction()
    producer.close()

    stream = tracked_kafka_stream(
        spark,
        broker.bootstrap,
        inbox,
        name,
        tmp_path / "channel",
        **{"ackstream.messageTimeout": "5 min"},
    )
    sink = MemorySink()
    from ackstream.channels.local import LocalChannel

    running = (
        Topology(name, spark, LocalChannel(tmp_path / "channel"), message_timeout_ms=300_000)
        .sink(sink)
        .start(stream, str(tmp_path / "checkpoint"), trigger_ms=300)
    )
    stop_once_settled(running, 3, timeout_s=90)
    assert group_commits(broker.bootstrap, name, inbox) == {0: 5}  # past both markers
    assert sorted(r["value"] for r in sink.rows()) == [b"a", b"b", b"c"]


def test_a_poison_record_alone_in_its_batch_costs_only_that_record(
    spark, broker, new_topic, tmp_path
):
    """A pandas bolt that raises on one record, or returns a value of the wrong type for
    another, with one record a batch: each bad record alone fails every row of its chunk,
    and still only its root fails; the query goes on and dead-letters both."""
    import pandas as pd

    from ackstream.channels.local import LocalChannel

    from helpers import consume, produce

    inbox, name = new_topic(partitions=1), f"alone-{uuid.uuid4().hex[:8]}"
    values = [f"v{i}" for i in range(6)]
    values[2], values[4] = "poison", "wrong type"
    produce(broker.bootstrap, inbox, values)

    def bolt(frame):
        text = frame["value"].map(bytes.decode)
        if (text == "poison").any():
            raise ValueError("poison")
        return pd.DataFrame({"text": text, "size": [v if v == "wrong type" else 1 for v in text]})

    options = {
        "maxOffsetsPerTrigger": 1,
        "ackstream.deadLetterTopic": f"{name}.dead",
        "ackstream.maxRetries": 1,
        "ackstream.retryInitialDelay": "100ms",
    }
    stream = tracked_kafka_stream(
        spark, broker.bootstrap, inbox, name, tmp_path / "channel", **options
    )
    sink = MemorySink()
    running = (
        Topology(name, spark, LocalChannel(tmp_path / "channel"))
        .pandas_bolt(bolt, "text string, size long", name="sizes")
        .sink(sink)
        .start(stream, str(tmp_path / "checkpoint"), trigger_ms=200)
    )
    stop_once_settled(running, len(values), timeout_s=120, still_active=True)
    assert group_commits(broker.bootstrap, name, inbox) == {0: len(values)}
    assert sorted(r["text"] for r in sink.rows()) == ["v0", "v1", "v3", "v5"]
    reasons = {}
    for message in consume(broker.bootstrap, f"{name}.dead"):
        headers = {k: v.decode() for k, v in message.headers}
        reasons[int(headers["ackstream.offset"])] = headers["ackstream.reason"]
    assert reasons[2] == "failed: sizes: ValueError: poison"
    assert reasons[4].startswith("failed: sizes: column 'size' is declared int64")
    assert sorted(reasons) == [2, 4]
