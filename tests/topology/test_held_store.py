"""The held store: a window stage's held rows by batch id, in files or in memory."""

import os

import pyarrow as pa
import pytest

from ackstream.topology.held_store import HeldState, HeldStore, held_counts


@pytest.mark.parametrize("in_files", [True, False])
def test_a_batch_starts_from_the_state_an_earlier_batch_saved(tmp_path, in_files):
    """Batch 2 run again (after a crash) starts from batch 1's state whatever batch 2
    saved the first time; only the two newest states are kept."""
    store = HeldStore(str(tmp_path / "w") if in_files else None)
    assert store.before(0) is None and store.latest() is None
    for batch in range(3):
        rows = pa.table({"_root": list(range(batch + 1)), "v": ["x"] * (batch + 1)})
        store.save(batch, HeldState(rows, {"channel": batch}))
    again = store.before(2)
    assert again.rows.column("_root").to_pylist() == [0, 1]
    assert again.position == {"channel": 1}
    assert store.latest().rows.num_rows == 3
    assert store.before(1) is None  # batch 0's state is gone: Spark re-runs one batch only
    if in_files:
        assert sorted(os.listdir(tmp_path / "w")) == ["1", "2"]
        assert HeldStore(str(tmp_path / "w")).before(2).rows.num_rows == 2  # a restart


def test_held_counts_reads_each_stages_newest_state(tmp_path):
    HeldStore(str(tmp_path / "w1")).save(4, HeldState(pa.table({"_root": [5, 5, 6]}), None))
    HeldStore(str(tmp_path / "w2")).save(4, HeldState(None, 7))
    assert held_counts(str(tmp_path)) == {
        "w1": {"tuples": 3, "roots": 2},
        "w2": {"tuples": 0, "roots": 0},
    }
    assert held_counts(str(tmp_path / "none")) == {}
