"""Time windows holding partial aggregates (untracked): per window and key one merged
row, equal to Spark's own ``groupBy(window, key).agg`` over the same rows."""

import datetime
import os

import pyarrow.dataset as ds
import pytest
from pyspark.sql import functions as F

from ackstream.sinks.memory import MemorySink
from ackstream.topology import Topology
from ackstream.topology.bolts import BatchContext
from ackstream.topology.modes import UNTRACKED
from ackstream.topology.window import WindowStage
from ackstream.topology.window_closing import TimeClosing
from ackstream.topology.window_partials import partials_of

pytestmark = pytest.mark.spark
T = 1_000_000_000_000  # a multiple of every window below


def aggs():
    return [
        F.count("*").alias("n"),
        F.count("x").alias("present"),
        F.sum("x").alias("total"),
        F.min("x").alias("low"),
        F.max("x"),
        F.avg("x").alias("mean"),
        F.collect_list("x").alias("xs"),
        F.collect_set("x").alias("distinct_xs"),
    ]


def batches(spark, n_batches=4, per_batch=30):
    """Batch b: rows (k, x) with b's time, keys k0..k4, over 1.5 s of batches; every
    seventh x null (counted by count(*), not by count(x), skipped by the others)."""
    out = []
    for b in range(n_batches):
        rows = [
            (f"k{(b * 7 + i) % 5}", None if i % 7 == 3 else b * 100 + i) for i in range(per_batch)
        ]
        out.append((spark.createDataFrame(rows, "k string, x int"), T + b * 400))
    return out


def plain(value):
    """A row or struct as a dict of plain values, collected lists sorted (neither side
    orders them)."""
    if hasattr(value, "asDict"):
        value = value.asDict()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, datetime.datetime):  # the sink's are UTC-aware, collect's naive
        return value.replace(tzinfo=None)
    return sorted(value) if isinstance(value, list) else value


def normal(rows):
    return sorted(repr(plain(r)) for r in rows)


def test_merged_aggregates_equal_sparks_windowed_agg_across_batches(spark):
    """Four batches in 1 s tumbling windows, then an idle batch that closes the last:
    the window's rows equal groupBy(window, k).agg over every batch's rows at once."""
    sink = MemorySink()
    topology = (
        Topology("wa", spark, None, tracking=False).window("k", *aggs(), duration="1s").sink(sink)
    )
    data = batches(spark)
    for b, (frame, now) in enumerate(data):
        topology.run_batch(frame, b, now_ms=now)
    topology.run_batch(data[0][0].where("false"), len(data), now_ms=T + 5_000)
    everything = None
    for frame, now in data:
        timed = frame.withColumn("t", F.timestamp_millis(F.lit(now)))
        everything = timed if everything is None else everything.unionByName(timed)
    expected = everything.groupBy("k", F.window("t", "1 second")).agg(*aggs())
    assert sink.rows()  # windows closed
    assert normal(sink.rows()) == normal(expected.collect())
    assert list(plain(sink.rows()[0])) == expected.columns


def test_a_sliding_window_merges_each_window_apart(spark):
    """1 s windows every 500 ms: each row counts in two windows, as Spark's window()."""
    sink = MemorySink()
    topology = (
        Topology("ws", spark, None, tracking=False)
        .window("k", F.count("*").alias("n"), F.sum("x"), duration="1s", slide="500ms")
        .sink(sink)
    )
    data = batches(spark, 3, 10)
    for b, (frame, now) in enumerate(data):
        topology.run_batch(frame, b, now_ms=now)
    topology.run_batch(data[0][0].where("false"), 3, now_ms=T + 5_000)
    everything = None
    for frame, now in data:
        timed = frame.withColumn("t", F.timestamp_millis(F.lit(now)))
        everything = timed if everything is None else everything.unionByName(timed)
    expected = everything.groupBy("k", F.window("t", "1 second", "500 milliseconds")).agg(
        F.count("*").alias("n"), F.sum("x")
    )
    assert normal(sink.rows()) == normal(expected.collect())


def test_an_aggregate_that_cannot_merge_holds_rows_instead(spark):
    """count(distinct) and an expression over an aggregate are not partials: None."""
    frame = spark.createDataFrame([("a", 1)], "k string, x int")
    assert partials_of(spark, frame, [F.count_distinct("x")]) is None
    assert partials_of(spark, frame, [F.sort_array(F.collect_list("x"))]) is None
    assert partials_of(spark, frame, [F.percentile_approx("x", 0.5)]) is None
    assert [p.name for p in partials_of(spark, frame, aggs())] == [
        "n",
        "present",
        "total",
        "low",
        "max(x)",
        "mean",
        "xs",
        "distinct_xs",
    ]


def stage():
    return WindowStage(1, ["k"], aggs(), TimeClosing(10_000, 10_000), name="held")


def written_rows(folder):
    """Rows in every Parquet piece the window's store holds now (a batch's one folder
    holds its parts in sub-folders named ``_piece=...``)."""
    where = os.path.join(folder, "held")
    pieces = [p for p in os.listdir(where) if p.startswith(("rows-", "added-", "parts-"))]
    assert pieces
    return sum(
        ds.dataset(
            os.path.join(where, p), format="parquet", ignore_prefixes=[".", "_SUCCESS"]
        ).count_rows()
        for p in pieces
    )


def run(window, frame, b, now, folder):
    ctx = BatchContext(UNTRACKED, b, now, None, 60_000, folder)
    out = window.run(frame, ctx)
    rows = out.tuples.collect()
    for cached in out.cached:
        cached.unpersist()
    return rows


def test_state_survives_a_restart_and_holds_a_row_per_window_and_key(spark, tmp_path):
    """Many rows a batch, five keys in one 10 s window: the store holds five rows, not
    the rows seen; a new stage (a restarted driver) on the same folder carries on
    from them and closes the window with every batch counted."""
    folder = str(tmp_path / "held-store")
    data = batches(spark, 3, 200)
    for b, (frame, now) in enumerate(data[:2]):
        assert run(stage(), frame, b, now, folder) == []
        assert written_rows(folder) <= 5 * (b + 1)  # keys touched, not the 200 rows a batch
    restarted = stage()
    assert run(restarted, data[2][0], 2, data[2][1], folder) == []
    rows = run(restarted, data[0][0].where("false"), 3, T + 20_000, folder)
    assert sorted((r["k"], r["n"]) for r in rows) == [(f"k{i}", 120) for i in range(5)]
    xs = [r["x"] for frame, _ in data for r in frame.collect()]
    assert sum(r["total"] for r in rows) == sum(x for x in xs if x is not None)
    assert sum(r["present"] for r in rows) == sum(x is not None for x in xs) < len(xs)


def test_a_batch_run_again_writes_the_same_held_ids(spark, tmp_path):
    """Spark running batch 1 again after a crash: the same ids, so one version each."""
    folder = str(tmp_path / "held-store")
    data = batches(spark, 2, 20)
    window = stage()
    run(window, data[0][0], 0, data[0][1], folder)
    run(window, data[1][0], 1, data[1][1], folder)
    store = window.holding.store(folder)
    first = sorted(r["_hold"] for r in store.before(spark, 2).rows.collect())
    run(stage(), data[1][0], 1, data[1][1], folder)
    again = sorted(
        r["_hold"] for r in stage().holding.store(folder).before(spark, 2).rows.collect()
    )
    assert first == again and len(first) == 5


def test_a_store_that_held_rows_goes_on_holding_rows(spark, tmp_path):
    """A checkpoint whose window held rows (an aggregate that cannot merge, or saved
    before windows held partials), restarted with one that merges: it goes on
    holding rows, every row counted, rather than failing to read them as partials."""
    folder = str(tmp_path / "held-store")
    data = batches(spark, 2, 20)
    rows_first = WindowStage(1, ["k"], [F.count_distinct("x")], TimeClosing(10_000, 10_000), "held")
    run(rows_first, data[0][0], 0, data[0][1], folder)
    merging = WindowStage(1, ["k"], [F.count("*").alias("n")], TimeClosing(10_000, 10_000), "held")
    run(merging, data[1][0], 1, data[1][1], folder)
    rows = run(merging, data[0][0].where("false"), 2, T + 20_000, folder)
    assert sum(r["n"] for r in rows) == 40


def reads_nothing(frame):
    """Whether Spark planned ``frame`` as its empty relation (a job over it reads nothing)."""
    plan = frame._jdf.queryExecution().optimizedPlan().toString()  # noqa: SLF001
    return plan.startswith("LocalRelation <empty>")


def test_a_batch_that_closes_no_window_hands_on_an_empty_relation(spark, tmp_path):
    """The held state names the ends of its windows: a batch that closes none of them
    hands on Spark's empty relation, so that the sink's job reads nothing, after a
    restart too; the batch that closes them hands on their rows."""
    folder = str(tmp_path / "held-store")
    data = batches(spark, 2, 20)
    window = stage()
    outputs = []
    for b, (frame, now) in enumerate([*data, (data[0][0].where("false"), T + 20_000)]):
        if b == 1:
            window = stage()  # a restarted driver: the ends come from the store
        out = window.run(frame, BatchContext(UNTRACKED, b, now, None, 60_000, folder))
        outputs.append((reads_nothing(out.tuples), len(out.tuples.collect())))
        for cached in out.cached:
            cached.unpersist()
    assert outputs == [(True, 0), (True, 0), (False, 5)]
