"""Mistakes in a topology's declaration fail at ``start()``, naming the stage, before
any query starts (``ackstream.topology.declared``)."""

import pytest
from pyspark.sql import functions as F

from ackstream.channels.local import LocalChannel
from ackstream.errors import StageError
from ackstream.sinks.memory import MemorySink
from ackstream.topology import Topology
from ackstream.topology.declared import analyse, started

pytestmark = pytest.mark.spark


def generator(spark, tmp_path, name):
    topology = Topology(name, spark, LocalChannel(str(tmp_path / "ch")))
    return topology


def stream_of(topology):
    return topology.read_stream({"ackstream.upstream": "generator"})


@pytest.mark.parametrize(
    "declare, stage, said",
    [
        (
            lambda t: t.sql(
                "SELECT *, CAST(value AS STRING) AS text FROM tuples", name="decode"
            ).sql("SELECT *, upper(txt) AS loud FROM tuples", name="shout"),
            "shout",
            "`txt` cannot be resolved",
        ),
        (
            lambda t: t.map(lambda df: df.withColumn("n", F.expr("no_such_fn(value)")), name="m"),
            "m",
            "no_such_fn",
        ),
        (lambda t: t.fail_where("amout < 0", name="negative"), "negative", "`amout`"),
        (lambda t: t.map(lambda df: df.select("value"), name="narrow"), "narrow", "lineage"),
        (
            lambda t: t.explode(F.split(F.col("value").cast("string"), " "), "word").aggregate(
                "wrd", F.count("*").alias("n"), name="count"
            ),
            "count",
            "`wrd`",
        ),
    ],
    ids=["sql column", "function", "fail condition", "lineage dropped", "after explode"],
)
def test_a_stage_that_does_not_fit_its_input_fails_at_start_naming_it(
    spark, tmp_path, declare, stage, said
):
    topology = declare(generator(spark, tmp_path, f"declared-{stage}")).sink(MemorySink())
    before = {q.id for q in spark.streams.active}
    with pytest.raises(StageError) as refused:
        topology.start(stream_of(topology), str(tmp_path / "ckpt"))
    assert refused.value.stage == stage and said in str(refused.value), refused.value
    assert {q.id for q in spark.streams.active} == before  # nothing started
    assert all(t is not topology for t, _ in started())


def test_a_topology_that_fits_passes_and_leaves_no_view_behind(spark, tmp_path):
    topology = (
        generator(spark, tmp_path, "declared-fine")
        .sql("SELECT *, CAST(value AS STRING) AS text FROM tuples", name="decode")
        .reject_where("text IS NULL", "no text")
        .explode(F.split(F.col("text"), " "), "word")
        .pandas_bolt(lambda df: df[["word"]].assign(n=1), "word string, n long")
        .aggregate("word", F.sum("n").alias("n"))
        .sink(MemorySink())
    )
    analyse(topology, stream_of(topology))
    assert "tuples" not in {t.name for t in spark.catalog.listTables()}


def test_spark_s_errors_still_convert_after_the_analysis(spark, tmp_path, monkeypatch):
    """The analysis quiets pyspark's error loggers: if it made them itself, as plain
    loggers, pyspark would be given those, and converting any later Spark error would
    raise a TypeError instead."""
    import logging

    from pyspark.errors import ArrayIndexOutOfBoundsException

    from ackstream.spark.driver import PYSPARK_ERROR_LOGGERS

    for name in PYSPARK_ERROR_LOGGERS:  # as in a fresh process: not made yet
        monkeypatch.delitem(logging.Logger.manager.loggerDict, name, raising=False)
    topology = generator(spark, tmp_path, "declared-then-error").fail_where(
        "amout < 0", name="negative"
    )
    with pytest.raises(StageError):
        topology.sink(MemorySink()).start(stream_of(topology), str(tmp_path / "ckpt"))
    with pytest.raises(ArrayIndexOutOfBoundsException):
        spark.sql("SELECT split(CAST(id AS STRING), ',')[5] FROM range(1)").collect()


def test_every_stage_kind_answers_what_start_checks(spark):
    """Each stage kind declares its own output for ``start()`` to analyse (asked, never
    switched on its class): the stateless kinds give a frame over a frame of no rows,
    the kinds that hold rows across batches say None. A new kind that forgets to
    declare falls to the base's None and fails here unless it holds rows."""
    import ackstream.topology.pandas_bolt  # noqa: F401 - its stage kind is a subclass too
    import ackstream.topology.waiting_join  # noqa: F401
    import ackstream.topology.window  # noqa: F401
    from ackstream.topology.bolts import Stage
    from ackstream.topology.modes import UNTRACKED

    def kinds(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from kinds(sub)

    holding = {"window", "join"}
    frame = spark.range(0).selectExpr("CAST(id AS STRING) AS word", "id AS n")
    made = {
        "map": lambda c: c(1, lambda df: df.withColumn("m", F.col("n") + 1)),
        "filter": lambda c: c(1, "n > 0"),
        "sql": lambda c: c(1, "SELECT *, n + 1 AS m FROM tuples"),
        "fail_where": lambda c: c(1, "n < 0"),
        "reject_where": lambda c: c(1, "n < 0"),
        "explode": lambda c: c(1, F.array("word"), "w"),
        "aggregate": lambda c: c(1, ["word"], [F.count("*").alias("c")]),
        "pandas_bolt": lambda c: c(1, lambda pdf: pdf, "word string, n long"),
    }
    seen = set()
    for cls in set(kinds(Stage)):
        seen.add(cls.kind)
        if cls.kind in holding:
            assert cls.declared_output is Stage.declared_output, cls.kind
            continue
        assert cls.kind in made, f"{cls.kind}: a new stage kind, add how start() checks it"
        stage = made[cls.kind](cls)
        out = stage.declared_output(frame, UNTRACKED)
        stage.analysed(frame)
        assert out is not None and out.schema.fields, cls.kind
    assert holding <= seen and set(made) <= seen
