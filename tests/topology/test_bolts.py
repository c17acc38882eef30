"""Bolt stages on static DataFrames: anchoring and acking checked against the ledger."""

import functools

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from ackstream.errors import OptionError, StageError
from ackstream.sinks.base import Sink
from ackstream.sinks.memory import MemorySink
from ackstream.testing import TupleGraph, settle, tracked_frame
from ackstream.topology import Topology
from ackstream.topology.anchoring import anchor_pairs
from ackstream.topology.batch import init_records
from ackstream.topology.bolts import AggregateStage, BatchContext, ExplodeStage
from ackstream.topology.modes import ACK_MODES, PER_STAGE
from ackstream.topology.modes import ack_records as records_of
from ackstream.vocabulary import ids
from ackstream.vocabulary.records import ACK_RECORD_SCHEMA, FAIL, INIT

pytestmark = pytest.mark.spark

LINES = ["a b c", "b boom", "", "c c", "d"]


def settle_rows(records) -> dict:
    """Per root, the completion the ledger gives ``records`` (Arrow) at once."""
    from ackstream.acker.ledger import Pending, step

    _, done = step(Pending.empty(0), records.to_pandas(), 0, 60_000)
    return {row["root"]: row for row in done.to_dict("records")}


def roots_of(spark, values):
    return [r["_root"] for r in tracked_frame(spark, values).orderBy("offset").collect()]


def failed_lines(spark, topology, lines):
    """Which of ``lines`` failed their roots in one batch through ``topology``; the other
    lines' roots are acked, and no other root settled."""
    roots = roots_of(spark, lines)
    outcome = settle(topology.run_batch(tracked_frame(spark, lines)))
    assert set(outcome) == set(roots)
    assert {outcome[r] for r in roots} <= {"failed", "acked"}
    return {i for i, r in enumerate(roots) if outcome[r] == "failed"}


def word_count(spark, sink, **kw):
    return (
        Topology("wc", spark, None, **kw)
        .explode(F.split("value", " "), "word")
        .filter(F.col("word") != "")
        .fail_where(F.col("word") == "boom")
        .aggregate("word", F.count("*").alias("n"))
        .sink(sink)
    )


MODES = pytest.mark.parametrize("ack_mode", sorted(ACK_MODES))
#: batch 0 of a per-stage topology, at time 0, as a stage run alone sees it
PER_STAGE_BATCH = BatchContext(PER_STAGE, 0, 0, None, 30_000, None)


@MODES
def test_word_count_acks_every_root_and_fails_the_one_with_a_failing_row(spark, ack_mode):
    sink = MemorySink()
    records = word_count(spark, sink, ack_mode=ack_mode).run_batch(tracked_frame(spark, LINES))
    roots = roots_of(spark, LINES)
    assert records.schema == ACK_RECORD_SCHEMA
    assert records.num_rows == len(roots)  # pre-combined: one record per root
    outcome = settle(records)
    assert outcome == {r: ("failed" if i == 1 else "acked") for i, r in enumerate(roots)}
    counts = {r["word"]: r["n"] for r in sink.rows()}
    assert counts == {"a": 1, "b": 2, "c": 3, "d": 1}
    inits = records.filter(pa.compute.bit_wise_and(records["kind"], INIT).cast(pa.bool_()))
    assert sorted(inits["offset"].to_pylist()) == list(range(len(LINES)))
    kinds = dict(zip(records["root"].to_pylist(), records["kind"].to_pylist()))
    assert kinds[roots[1]] == INIT | FAIL
    assert np.count_nonzero([k & FAIL for k in kinds.values()]) == 1
    reasons = {
        r: why for r, why in zip(records["root"].to_pylist(), records["reason"].to_pylist()) if why
    }
    assert list(reasons) == [roots[1]] and reasons[roots[1]].startswith("fail_where#3: ")
    assert "boom" in reasons[roots[1]]


def test_reject_where_rejects_undecodable_and_null_values_with_their_reason(spark):
    lines = ['{"n": 1}', "{broken", None, '{"n": 4}']
    sink = MemorySink()
    topology = (
        Topology("json", spark, None)
        .map(lambda df: df.withColumn("doc", F.from_json(F.col("value"), "n int")))
        .reject_where(F.col("value").isNull(), "value is null")
        .reject_where(F.col("doc.n").isNull(), F.concat(F.lit("not JSON with n: "), F.col("value")))
        .sink(sink)
    )
    records = topology.run_batch(tracked_frame(spark, lines))
    roots = roots_of(spark, lines)
    done = settle_rows(records)
    assert {r: done[r]["status"] for r in roots} == {
        roots[0]: "acked",
        roots[1]: "rejected",
        roots[2]: "rejected",
        roots[3]: "acked",
    }
    assert done[roots[1]]["reason"] == "not JSON with n: {broken"
    assert done[roots[2]]["reason"] == "value is null"
    assert sorted(r["doc"]["n"] for r in sink.rows()) == [1, 4]


def test_explode_children_have_distinct_reproducible_edges(spark):
    df = tracked_frame(spark, ["x y z", "x"])
    stage = ExplodeStage(3, F.split("value", " "), "word")
    first = stage.run(df, PER_STAGE_BATCH).tuples.collect()
    again = stage.run(df, PER_STAGE_BATCH).tuples.collect()
    assert sorted(r["_edge"] for r in first) == sorted(r["_edge"] for r in again)
    assert len({r["_edge"] for r in first}) == 4
    spout = {r["offset"]: r["_edge"] for r in df.collect()}
    words = {0: ["x", "y", "z"], 1: ["x"]}
    expected = {
        int(ids.child_edges(spout[o], 3, i)) for o, ws in words.items() for i in range(len(ws))
    }
    assert {r["_edge"] for r in first} == expected  # xxhash64(parent edge, stage, position)


def union_all(frames):
    return functools.reduce(lambda a, b: a.unionByName(b), frames)


def collected(frames):
    """Ack records as a batch collects them, its time (here 0) set on the driver."""
    return union_all(frames).toPandas().fillna({"ts": 0})


def test_aggregate_anchors_each_output_row_to_all_its_inputs_across_roots(spark):
    """Storm's multi-anchoring: before the output rows are acked, each root's value is
    the XOR of the (parent, child) edges of its parents, as in TupleGraph."""
    df = tracked_frame(spark, ["k1", "k2", "k1", "k3"]).withColumn("k", F.col("value"))
    stage = AggregateStage(1, ["k"], [F.count("*").alias("n")])
    out = stage.run(df, PER_STAGE_BATCH).tuples
    partial = collected(
        [init_records(df), records_of(anchor_pairs(df), 0), records_of(anchor_pairs(out), 0)]
    )
    outcome = settle(partial)
    assert set(outcome.values()) == {"pending"}
    rows = out.collect()
    assert sorted(len(r["_anchors"]) for r in rows) == [1, 1, 2]
    assert {r["_root"] for r in rows} == {None}

    # the same shape in the reference model: 4 spouts, three children, parents acked
    g = TupleGraph()
    spouts = [g.spout(root=i) for i in range(4)]
    children = [g.emit([spouts[0], spouts[2]]), g.emit([spouts[1]]), g.emit([spouts[3]])]
    model = g.init_records() + [rec for s in spouts for rec in g.ack(s)]
    assert set(settle(model).values()) == {"pending"}
    model += [rec for c in children for rec in g.ack(c)]
    assert set(settle(model).values()) == {"acked"}

    stage_and_sink = [
        init_records(df),
        records_of(anchor_pairs(df), 0),
        records_of(anchor_pairs(out), 0),
        records_of(anchor_pairs(out), 0),
    ]
    assert set(settle(collected(stage_and_sink)).values()) == {"acked"}
    # an output row acked twice cancels its own ack: its roots stay pending, never acked
    twice = stage_and_sink + [records_of(anchor_pairs(out.where("k = 'k1'")), 0)]
    outcome = settle(collected(twice))
    assert sorted(outcome.values()) == ["acked", "acked", "pending", "pending"]


class LosingSink(MemorySink):
    """Writes everything except the rows where ``lose`` holds, which it hands back."""

    def __init__(self, lose):
        super().__init__(lineage=True)
        self.lose = lose

    def write(self, outputs, batch_id):
        super().write(outputs, batch_id)
        return outputs.where(self.lose)


@MODES
def test_unwritten_aggregate_row_fails_every_root_anchored_to_it(spark, ack_mode):
    sink = LosingSink(F.col("word") == "c")
    records = word_count(spark, sink, ack_mode=ack_mode).run_batch(tracked_frame(spark, LINES))
    roots = roots_of(spark, LINES)
    # "c" comes from lines 0 and 3; line 1 failed anyway; 2 (empty) and 4 are acked
    assert settle(records) == {
        roots[0]: "failed",
        roots[1]: "failed",
        roots[2]: "acked",
        roots[3]: "failed",
        roots[4]: "acked",
    }


@MODES
def test_failing_an_aggregate_row_fails_every_root_anchored_to_it(spark, ack_mode):
    topology = (
        Topology("agg", spark, None, ack_mode=ack_mode)
        .explode(F.split("value", " "), "word")
        .aggregate("word", F.count("*").alias("n"))
        .fail_where(F.col("n") >= 3)  # "c": lines 0 and 3
        .sink(MemorySink())
    )
    assert failed_lines(spark, topology, LINES) == {0, 3}


@MODES
def test_an_aggregate_keyed_by_an_expression_fails_the_roots_of_that_group_alone(spark, ack_mode):
    """A group's id is the hash of its key values, on the output row and on its input
    rows alike: an expression key (here an aliased one) finds its own group's roots."""
    lines = ["ab c", "de", "f g", "hij"]  # lengths 2: ab de (lines 0, 1); 1: c f g; 3: hij
    topology = (
        Topology("agg-expr", spark, None, ack_mode=ack_mode)
        .explode(F.split("value", " "), "word")
        .aggregate(F.length("word").alias("len"), F.count("*").alias("n"))
        .fail_where(F.col("len") == 2)
        .sink(MemorySink())
    )
    assert failed_lines(spark, topology, lines) == {0, 1}


@MODES
def test_an_aggregate_of_an_aggregate_keeps_every_root(spark, ack_mode):
    topology = (
        Topology("agg2", spark, None, ack_mode=ack_mode)
        .explode(F.split("value", " "), "word")
        .aggregate("word", F.count("*").alias("n"))
        .aggregate("n", F.count("*").alias("words"))  # n=1: a, b, boom, d, ""; n=3: c
        .fail_where(F.col("n") == 3)  # "c": lines 0 and 3
        .sink(MemorySink())
    )
    assert failed_lines(spark, topology, LINES) == {0, 3}


@MODES
def test_a_sink_that_raises_fails_the_roots_with_outputs(spark, ack_mode):
    class Broken(Sink):
        def write(self, outputs, batch_id):
            raise OSError("disk full")

    records = word_count(spark, Broken(), ack_mode=ack_mode).run_batch(tracked_frame(spark, LINES))
    roots = roots_of(spark, LINES)
    outcome = settle(records)
    assert outcome[roots[2]] == "acked"  # the empty line had no tuple left to write
    assert {outcome[r] for i, r in enumerate(roots) if i != 2} == {"failed"}
    assert settle_rows(records)[roots[0]]["reason"] == "sink Broken: OSError: disk full"


def test_ack_mode_is_checked(spark):
    with pytest.raises(OptionError) as caught:
        Topology("t", spark, None, ack_mode="lazy")
    assert caught.value.option == "ack_mode"


@MODES
def test_pandas_bolt_error_fails_only_that_rows_root(spark, ack_mode):
    def bolt(frame):
        """Words of each line; a line with 'boom' raises; plus one unanchored row (index -1)."""
        if frame["value"].str.contains("boom").any():
            raise ValueError("boom")
        words = frame.assign(word=frame["value"].str.split(" ")).explode("word")[["word"]]
        return pd.concat([words, pd.DataFrame({"word": ["seen"]}, index=[-1])])

    sink = MemorySink()
    topology = (
        Topology("pb", spark, None, ack_mode=ack_mode).pandas_bolt(bolt, "word string").sink(sink)
    )
    records = topology.run_batch(tracked_frame(spark, LINES))
    roots = roots_of(spark, LINES)
    assert settle(records) == {r: ("failed" if i == 1 else "acked") for i, r in enumerate(roots)}
    assert settle_rows(records)[roots[1]]["reason"] == "pandas_bolt#1: ValueError: boom"
    words = sorted(w for w in sink.to_pandas()["word"] if w != "seen")
    assert words == sorted(["a", "b", "c", "", "c", "c", "d"])
    assert "seen" in set(sink.to_pandas()["word"])  # unanchored rows are written too


def test_a_pandas_bolt_whose_columns_differ_from_its_schema_names_them_untracked(spark):
    """Untracked, no root can fail: output that does not fit stops the query, naming it."""

    def bolt(frame):
        return frame.assign(extra=1)[["value", "extra"]]

    topology = Topology("cols", spark, None, tracking=False).pandas_bolt(bolt, "value string")
    with pytest.raises(Exception) as caught:
        topology.sink(MemorySink()).run_batch(tracked_frame(spark, ["a"]))
    message = str(caught.value)
    assert "StageError" in message and "not in the schema ['extra']" in message
    assert "_root" not in message.split("StageError")[-1].splitlines()[0]


def pandas_outcome(spark, bolt, schema, values, ack_mode="telescoped", collector=False):
    """Run a one-stage pandas bolt topology on ``values``: (per value, its root's outcome
    and reason; the rows written)."""
    sink = MemorySink()
    topology = Topology("pb", spark, None, ack_mode=ack_mode)
    topology = topology.pandas_bolt(bolt, schema, collector=collector)
    records = topology.sink(sink).run_batch(tracked_frame(spark, values))
    outcome = settle_rows(records)
    roots = roots_of(spark, values)
    return [(outcome[r]["status"], outcome[r]["reason"]) for r in roots], sink.to_pandas()


@MODES
def test_a_batch_whose_every_row_fails_in_a_pandas_bolt_fails_their_roots(spark, ack_mode):
    """One poison record alone in its batch: the chunk has no output row at all."""

    def bolt(frame):
        raise ValueError("poison")

    outcomes, written = pandas_outcome(spark, bolt, "word string, n long", ["x"], ack_mode)
    assert outcomes == [("failed", "pandas_bolt#1: ValueError: poison")]
    assert written.empty
    outcomes, _ = pandas_outcome(spark, bolt, "word string, n long", ["x", "y", "z"], ack_mode)
    assert [status for status, _ in outcomes] == ["failed"] * 3


@MODES
def test_a_value_of_another_type_fails_only_the_row_it_came_from(spark, ack_mode):
    def bolt(frame):
        n = [len(v) if v != "five" else "not a number" for v in frame["value"]]
        return pd.DataFrame({"word": frame["value"], "n": n})

    values = ["one", "five", "three"]
    outcomes, written = pandas_outcome(spark, bolt, "word string, n long", values, ack_mode)
    assert [status for status, _ in outcomes] == ["acked", "failed", "acked"]
    reason = outcomes[1][1]
    assert reason.startswith("pandas_bolt#1: column 'n' is declared int64")
    assert "not a number" in reason
    assert sorted(zip(written["word"], written["n"])) == [("one", 3), ("three", 5)]


def test_a_chunk_whose_columns_or_index_do_not_fit_fails_its_rows_naming_them(spark):
    def bolt(frame):
        if (frame["value"] == "extra").any():
            return frame.assign(extra=1)[["value", "extra"]]
        if (frame["value"] == "lost").any():
            return frame.iloc[0:0][[]]
        if (frame["value"] == "moved").any():
            return frame[["value"]].set_index(pd.Index([7] * len(frame)))
        return frame[["value"]]

    values = ["a", "extra", "b", "lost", "moved", "c"]
    outcomes, written = pandas_outcome(spark, bolt, "value string", values)
    assert [status for status, _ in outcomes] == [
        "acked",
        "failed",
        "acked",
        "failed",
        "failed",
        "acked",
    ]
    assert "not in the schema ['extra']" in outcomes[1][1]
    assert "missing ['value']" in outcomes[3][1]
    assert "indexed by the position of their parent row" in outcomes[4][1]
    assert all(reason.startswith("pandas_bolt#1: ") for _, reason in outcomes if reason)
    assert sorted(written["value"]) == ["a", "b", "c"]


def fail_and_reject():
    """A bolt (defined here: Spark's workers cannot import a test module) that fails
    "retry", rejects "junk" (a mask, then positions) and writes the rest."""

    def bolt(frame, collector):
        collector.fail(frame["value"] == "retry", "try again")
        collector.reject(np.flatnonzero(frame["value"] == "junk"), "not a word")
        return frame[["value"]]

    return bolt


@MODES
def test_rows_the_collector_fails_or_rejects_settle_so_and_the_rest_are_written(spark, ack_mode):
    """The collector's rows fail (a replay) or are rejected (a dead letter) with the
    stage and the reason, through the same records as fail_where and reject_where;
    the other rows are acked and written once."""
    values = ["a", "retry", "junk", "b", "retry"]
    outcomes, written = pandas_outcome(
        spark, fail_and_reject(), "value string", values, ack_mode, collector=True
    )
    assert outcomes == [
        ("acked", None),
        ("failed", "pandas_bolt#1: try again"),
        ("rejected", "pandas_bolt#1: not a word"),
        ("acked", None),
        ("failed", "pandas_bolt#1: try again"),
    ]
    assert sorted(written["value"]) == ["a", "b"]


def test_untracked_the_collectors_rows_are_dropped(spark):
    """Untracked there is no root to replay or dead-letter: the rows' outputs go."""
    sink = MemorySink()
    topology = Topology("plain", spark, None, tracking=False).pandas_bolt(
        fail_and_reject(), "value string", collector=True
    )
    df = spark.createDataFrame([(v,) for v in ["a", "retry", "junk", "b"]], "value string")
    topology.sink(sink).run_batch(df)
    assert sorted(sink.to_pandas()["value"]) == ["a", "b"]


@MODES
def test_sql_stage_and_lineage_check(spark, ack_mode):
    sink = MemorySink()
    topology = (
        Topology("sql", spark, None, ack_mode=ack_mode)
        .sql("SELECT *, upper(value) AS shout FROM tuples WHERE value != ''")
        .sink(sink)
    )
    records = topology.run_batch(tracked_frame(spark, LINES))
    assert set(settle(records).values()) == {"acked"}
    assert sorted(sink.to_pandas()["shout"]) == sorted(v.upper() for v in LINES if v)

    lossy = Topology("lossy", spark, None).sql("SELECT value FROM tuples").sink(MemorySink())
    with pytest.raises(StageError) as caught:
        lossy.run_batch(tracked_frame(spark, LINES))
    assert caught.value.stage == "sql#1"


def test_tracking_off_runs_the_stages_and_writes_no_records(spark):
    sink = MemorySink()
    df = spark.createDataFrame([(v,) for v in LINES if "boom" not in v], "value string")
    records = word_count(spark, sink, tracking=False).run_batch(df)
    assert records.num_rows == 0
    assert {r["word"]: r["n"] for r in sink.rows()} == {"a": 1, "b": 1, "c": 3, "d": 1}
