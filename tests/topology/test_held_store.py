"""The held store: a holding stage's held rows by batch id, written by Spark beside the
checkpoint as what changed each batch, or kept in the executors' memory."""

import os

import pytest

from ackstream.topology.held_store import Changes, HeldState, HeldStore, held_counts


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


def held(spark, ids, batch=0):
    """Held rows with ids ``_hold`` (and a root each, the same number)."""
    return spark.createDataFrame(
        [(i, i, f"row {i} of batch {batch}") for i in ids], "_hold long, _root long, v string"
    )


def ids_of(state):
    return sorted(r["_hold"] for r in state.rows.collect())


def written(folder, since):
    """Bytes of the files under ``folder`` written after the time ``since`` (ns)."""
    return sum(
        p.stat().st_size
        for p in folder.rglob("*")
        if p.is_file() and p.stat().st_mtime_ns > since and not p.name.startswith(".")
    )


def test_a_batch_writes_the_rows_it_added_and_the_ids_it_released_not_what_is_held(spark, tmp_path):
    """A base of 20,000 rows; batch 1 adds 100 and releases 50: it writes those, in bytes
    a small share of the base, which it leaves as it was. The state read back is the
    base and the rows added, less the released; ``status`` counts it so."""
    folder = tmp_path / "w"
    store = HeldStore(str(folder))
    store.save(0, HeldState(held(spark, range(20_000))))
    base_bytes = written(folder, 0)
    before = store.before(spark, 1)
    since = max(p.stat().st_mtime_ns for p in folder.rglob("*"))
    added = held(spark, range(100_000, 100_100), batch=1)
    released = held(spark, range(50)).select("_hold")
    after = before.rows.join(released, "_hold", "left_anti").unionByName(added)
    log = store.save(1, HeldState(after, 1), Changes(added, released, before.log))
    assert (log.base, log.added, log.released) == (0, (1,), (1,))
    assert (log.base_rows, log.added_rows, log.released_rows, log.rows) == (20_000, 100, 50, 20_050)
    assert written(folder, since) < base_bytes / 10
    assert sorted(os.listdir(folder)) == ["0", "1", "added-1", "released-1", "rows-0"]
    state = store.before(spark, 2)
    assert ids_of(state) == [*range(50, 20_000), *range(100_000, 100_100)]
    assert state.position == 1 and state.log == log
    assert held_counts(str(tmp_path)) == {"w": {"tuples": 20_050, "roots": 20_050}}


def test_a_batch_run_again_writes_its_changes_over_the_first_runs(spark, tmp_path):
    """Batch 2 run twice (Spark re-runs a batch after a crash), adding other rows the
    second time: the state after it has the second run's rows, never both."""
    store = HeldStore(str(tmp_path / "w"))
    store.save(0, HeldState(held(spark, range(1_000))))
    empty = held(spark, []).select("_hold")
    one = store.before(spark, 1)
    store.save(1, HeldState(one.rows), Changes(held(spark, [5_000]), empty, one.log))
    for run in ([6_000, 6_001], [7_000]):
        two = store.before(spark, 2)
        assert ids_of(two) == [*range(1_000), 5_000]
        rows = held(spark, run)
        store.save(2, HeldState(two.rows.unionByName(rows)), Changes(rows, empty, two.log))
    assert ids_of(store.before(spark, 3)) == [*range(1_000), 5_000, 7_000]


def test_changes_reaching_a_quarter_of_what_is_held_are_written_as_a_new_base(spark, tmp_path):
    """Each batch releases 100 of 1,000 rows and adds 100: after the third batch the
    rows added since the base reach a quarter of what is held, so the fourth writes
    every row as a new base; pieces no kept state names are removed."""
    folder = tmp_path / "w"
    store = HeldStore(str(folder))
    store.save(0, HeldState(held(spark, range(1_000))))
    logs = []
    for batch in range(1, 6):
        before = store.before(spark, batch)
        gone = held(spark, range((batch - 1) * 100, batch * 100)).select("_hold")
        new = held(spark, range(10_000 * batch, 10_000 * batch + 100), batch)
        after = before.rows.join(gone, "_hold", "left_anti").unionByName(new)
        logs.append(store.save(batch, HeldState(after), Changes(new, gone, before.log)))
    assert [log.base for log in logs] == [0, 0, 0, 4, 4]
    assert [len(log.added) for log in logs] == [1, 2, 3, 0, 1]
    assert all(log.rows == 1_000 for log in logs)
    assert sorted(os.listdir(folder)) == ["4", "5", "added-5", "released-5", "rows-4"]
    assert ids_of(store.before(spark, 6)) == [
        *range(500, 1_000),
        *(i for b in range(1, 6) for i in range(10_000 * b, 10_000 * b + 100)),
    ]


def test_a_state_that_turns_over_each_batch_is_written_whole_each_batch(spark, tmp_path):
    """Each batch releases every row held and adds as many (a time window's churn): once
    a batch has measured such a change, every later batch writes one base, not changes
    (two pieces) and a base by turns."""
    store = HeldStore(str(tmp_path / "w"))
    store.save(0, HeldState(held(spark, range(100))))
    logs = []
    for batch in range(1, 4):
        before = store.before(spark, batch)
        new = held(spark, range(1_000 * batch, 1_000 * batch + 100), batch)
        logs.append(
            store.save(batch, HeldState(new), Changes(new, before.rows.select("_hold"), before.log))
        )
    assert [(log.base, len(log.added), log.last_changed) for log in logs] == [
        (0, 1, 100),
        (2, 0, 100),
        (3, 0, 100),
    ]
    assert ids_of(store.before(spark, 4)) == list(range(3_000, 3_100))
