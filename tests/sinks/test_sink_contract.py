"""The Sink contract: one suite that every sink passes."""

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ackstream.errors import StageError
from ackstream.sinks import ConsoleSink, KafkaSink, MemorySink, ParquetSink, Sink
from ackstream.sinks.base import ContinuingSink
from ackstream.testing import settle, tracked_frame
from ackstream.topology import Topology

from helpers import consume

pytestmark = pytest.mark.spark


def kafka_values(bootstrap: str, topic: str, quiet_s: float = 0.0) -> list[str]:
    return [m.value.decode() for m in consume(bootstrap, topic, quiet_s=quiet_s)]


def parquet_rows(spark, path) -> list[dict]:
    """Every row a ParquetSink wrote under ``path`` (none: no Parquet file yet)."""
    if not any(p.suffix == ".parquet" for p in path.rglob("*")):
        return []
    return [r.asDict() for r in spark.read.parquet(str(path)).collect()]


@pytest.fixture(
    params=[
        "memory",
        "console",
        "parquet",
        pytest.param("kafka", marks=pytest.mark.broker),  # Spark's writer, with the connector
        pytest.param("kafka-python", marks=pytest.mark.broker),
    ]
)
def sink_and_reader(request, capsys, tmp_path):
    """``(sink, written)``: ``written()`` gives the values the sink wrote so far;
    ``written(quiet_s=...)``, from a broker, only once nothing more came for that long
    (a write still in flight shows)."""
    if request.param == "memory":
        sink = MemorySink()
        yield sink, lambda quiet_s=0: [r["value"] for r in sink.rows()]
    elif request.param == "console":
        sink = ConsoleSink(truncate=False)
        yield (
            sink,
            lambda quiet_s=0: [
                line.strip("| ").split("|")[-1].strip()
                for line in capsys.readouterr().out.splitlines()
                if line.startswith("|") and "value" not in line
            ],
        )
    elif request.param == "parquet":
        spark = request.getfixturevalue("spark")
        sink = ParquetSink(str(tmp_path / "out"))
        yield sink, lambda quiet_s=0: [r["value"] for r in parquet_rows(spark, tmp_path / "out")]
    else:
        bootstrap = request.getfixturevalue("broker").bootstrap
        topic = request.getfixturevalue("new_topic")()
        sink = KafkaSink(bootstrap, topic, writer="python" if "python" in request.param else "auto")
        yield sink, lambda quiet_s=0: kafka_values(bootstrap, topic, quiet_s)
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


def declared(sink):
    """The node a topology makes of ``sink`` when it is declared."""
    return Topology("asks", None, None).sink(sink).sinks[0]


def test_every_sink_says_it_continues_no_trees_and_the_topology_asks_it(sink_and_reader):
    """``Sink.continue_trees``: asked once, when the sink is declared."""
    sink, _ = sink_and_reader
    assert sink.continue_trees is False
    assert declared(sink).continues_trees is False


def test_a_sink_told_to_continue_trees_says_so_and_writes_them_on():
    sink = KafkaSink("127.0.0.1:9", "next", continue_trees=True)  # no connection yet
    assert sink.continue_trees is True
    assert isinstance(sink, ContinuingSink)
    assert declared(sink).continues_trees is True


def test_a_sink_of_ones_own_gets_the_protocols_answers():
    class Own(Sink):
        def write(self, outputs, batch_id):
            return None

    own = Own()
    assert own.continue_trees is False and own.close() is None
    assert declared(own).continues_trees is False


def test_what_is_not_a_sink_is_refused_when_declared_saying_what_to_subclass():
    class WriteOnly:
        def write(self, outputs, batch_id):
            return None

    with pytest.raises(StageError, match="sink#1.*WriteOnly is not a Sink: subclass") as raised:
        declared(WriteOnly())
    assert "ackstream.sinks.base.Sink" in str(raised.value) and "\n" not in str(raised.value)


def test_a_write_that_took_every_row_returns_none_and_the_rows_are_there(spark, sink_and_reader):
    sink, written = sink_and_reader
    assert sink.write(outputs(spark, ["a", "b", "c"]), 0) is None
    assert sorted(written()) == ["a", "b", "c"]


@pytest.mark.broker
def test_the_rows_a_sink_could_not_write_come_back_as_a_dataframe_and_their_roots_fail(
    spark, broker, new_topic
):
    """``Sink.write`` has one return type: None, or the unwritten rows as a DataFrame
    with their lineage (here the Kafka sink's, a row over the producers' request size,
    with why)."""
    sink = KafkaSink(broker.bootstrap, new_topic(), writer="python")
    big = "x" * 2_000_000
    unwritten = sink.write(outputs(spark, ["a", big]), 0)
    assert isinstance(unwritten, DataFrame)
    assert {"_root", "_edge", "_reason"} <= set(unwritten.columns) and unwritten.count() == 1
    frame = tracked_frame(spark, [big])
    roots = [r["_root"] for r in frame.collect()]
    records = Topology("too-big", spark, None).sink(sink).run_batch(frame)
    assert settle(records) == {root: "failed" for root in roots}


def test_an_empty_batch_writes_nothing(spark, sink_and_reader):
    sink, written = sink_and_reader
    assert sink.write(outputs(spark, ["x"]).where("false"), 1) is None
    assert written(quiet_s=1.5) == []


def test_users_never_see_the_lineage_columns(spark, sink_and_reader, capsys):
    sink, written = sink_and_reader
    sink.write(outputs(spark, ["a"]), 2)
    if isinstance(sink, MemorySink):
        assert "_root" not in sink.table().column_names
    assert all("_root" not in str(v) for v in written())


def test_a_parquet_sink_keeps_a_re_run_batch_once_and_no_lineage(spark, tmp_path):
    sink = ParquetSink(str(tmp_path / "out"))
    sink.write(outputs(spark, ["a", "b"]), 7)
    sink.write(outputs(spark, ["a", "b"]), 7)  # batch 7 again, after a crash
    sink.write(outputs(spark, ["c"]), 8)
    rows = parquet_rows(spark, tmp_path / "out")
    assert sorted((r["batch_id"], r["value"]) for r in rows) == [(7, "a"), (7, "b"), (8, "c")]
    assert not {"_root", "_edge"} & set(rows[0])


def test_a_memory_sink_refuses_to_travel_and_says_what_to_use_instead():
    import pickle

    with pytest.raises(TypeError, match="ParquetSink"):
        pickle.dumps(MemorySink())
