"""The held store: a window stage's held rows by batch id, written by Spark beside the
checkpoint or kept in the executors' memory."""

import os

import pytest

from ackstream.topology.held_store import HeldState, HeldStore, held_counts


def frame(spark, roots, value="x"):
    return spark.createDataFrame([(r, value) for r in roots], "_root bigint, v string")


@pytest.mark.parametrize("in_files", [True, False])
def test_a_batch_starts_from_the_state_an_earlier_batch_saved(spark, tmp_path, in_files):
    """Batch 2 run again (after a crash) starts from batch 1's state whatever batch 2
    saved the first time; only the two newest states are kept."""
    store = HeldStore(str(tmp_path / "w") if in_files else None)
    assert store.before(spark, 0) is None and store.latest(spark) is None
    for batch in range(3):
        store.save(batch, HeldState(frame(spark, range(batch + 1)), {"channel": batch}, batch))
    again = store.before(spark, 2)
    assert sorted(r["_root"] for r in again.rows.collect()) == [0, 1]
    assert (again.position, again.clock) == ({"channel": 1}, 1)
    assert store.latest(spark).rows.count() == 3
    assert store.before(spark, 1) is None  # batch 0's state is gone: Spark re-runs one batch only
    if in_files:
        assert sorted(os.listdir(tmp_path / "w")) == ["1", "2", "rows-1", "rows-2"]
        restarted = HeldStore(str(tmp_path / "w")).before(spark, 2)
        assert restarted.rows.count() == 2 and restarted.rows.schema == frame(spark, []).schema


def test_the_held_rows_are_written_by_the_executors_not_the_driver(spark, tmp_path):
    """The rows go from the executors to Parquet files; what the driver publishes per
    batch is a small file with the position, clock and schema, whatever the rows."""
    store = HeldStore(str(tmp_path / "w"))
    rows = spark.range(50_000).selectExpr("id AS _root", "repeat('x', 100) AS v")
    store.save(0, HeldState(rows, {"channel": 0}))
    parts = [n for n in os.listdir(tmp_path / "w" / "rows-0") if n.endswith(".parquet")]
    assert parts and os.path.getsize(tmp_path / "w" / "0") < 4096
    assert store.before(spark, 1).rows.count() == 50_000


def test_a_stage_that_holds_nothing_saves_an_empty_state(spark, tmp_path):
    store = HeldStore(str(tmp_path / "w"))
    store.save(3, HeldState(frame(spark, []).where("false"), 7))
    assert store.before(spark, 4).rows.count() == 0 and store.before(spark, 4).position == 7
    store.save(4, HeldState(None, 8))
    assert store.before(spark, 5).rows is None


def test_held_counts_reads_each_stages_newest_state(spark, tmp_path):
    HeldStore(str(tmp_path / "w1")).save(4, HeldState(frame(spark, [5, 5, 6]), None))
    HeldStore(str(tmp_path / "w2")).save(4, HeldState(None, 7))
    assert held_counts(str(tmp_path)) == {
        "w1": {"tuples": 3, "roots": 2},
        "w2": {"tuples": 0, "roots": 0},
    }
    assert held_counts(str(tmp_path / "none")) == {}
