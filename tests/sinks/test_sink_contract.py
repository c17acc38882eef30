"""The Sink contract: one suite that every sink passes."""

import pytest
from pyspark.sql import functions as F

from ackstream.sinks import ConsoleSink, KafkaSink, MemorySink, Sink
from ackstream.testing import tracked_frame

pytestmark = pytest.mark.spark


def kafka_values(bootstrap: str, topic: str) -> list[str]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=2000
    )
    try:
        return [m.value.decode() for m in consumer]
    finally:
        consumer.close()


@pytest.fixture(params=["memory", "console", pytest.param("kafka", marks=pytest.mark.broker)])
def sink_and_reader(request, capsys):
    """``(sink, written)``: ``written()`` gives the values the sink wrote so far."""
    if request.param == "memory":
        sink = MemorySink()
        yield sink, lambda: [r["value"] for r in sink.rows()]
    elif request.param == "console":
        sink = ConsoleSink(truncate=False)
        yield (
            sink,
            lambda: [
                line.strip("| ").split("|")[-1].strip()
                for line in capsys.readouterr().out.splitlines()
                if line.startswith("|") and "value" not in line
            ],
        )
    else:
        bootstrap = request.getfixturevalue("broker").bootstrap
        topic = request.getfixturevalue("new_topic")()
        sink = KafkaSink(bootstrap, topic)
        yield sink, lambda: kafka_values(bootstrap, topic)
    sink.close()


def outputs(spark, values):
    """Final tuples as a topology hands them to its sink: payload plus lineage columns."""
    return tracked_frame(spark, values).select(
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").alias("value"),
        "_root",
        "_edge",
    )


def test_every_sink_is_a_sink(sink_and_reader):
    sink, _ = sink_and_reader
    assert isinstance(sink, Sink)


def test_a_write_that_took_every_row_returns_none_and_the_rows_are_there(spark, sink_and_reader):
    sink, written = sink_and_reader
    assert sink.write(outputs(spark, ["a", "b", "c"]), 0) is None
    assert sorted(written()) == ["a", "b", "c"]


def test_an_empty_batch_writes_nothing(spark, sink_and_reader):
    sink, written = sink_and_reader
    assert sink.write(outputs(spark, ["x"]).where("false"), 1) is None
    assert written() == []


def test_users_never_see_the_lineage_columns(spark, sink_and_reader, capsys):
    sink, written = sink_and_reader
    sink.write(outputs(spark, ["a"]), 2)
    if isinstance(sink, MemorySink):
        assert "_root" not in sink.table().column_names
    assert all("_root" not in str(v) for v in written())
