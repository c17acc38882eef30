"""Runs of acked offsets in one completion row: what a batch writes and what readers get back."""

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from ackstream.ranges import expand, is_run
from ackstream.sources.offsets import PlannedRoots


def planned(read, replays=()):
    """The roots an offset of namespace ``topo`` plans: ``read`` {partition: [from, to]}."""
    end = {
        "v": 1,
        "source": "topo",
        "ids": "topo",
        "read": {"events": {str(p): span for p, span in read.items()}},
        "replays": [["events", p, off, att] for p, off, att in replays],
    }
    return PlannedRoots.of_offsets([end], now_ms=1_000)


def per_root(table):
    rows = table.select(["root", "status", "topic", "partition", "offset", "attempt"])
    return sorted(rows.to_pylist(), key=lambda row: row["root"])


def acked_one_by_one(roots, inits):
    """What a reader must see: one acked completion per root of ``inits``."""
    return sorted(
        (
            {
                "root": r["root"],
                "status": "acked",
                "topic": r["topic"],
                "partition": r["partition"],
                "offset": r["offset"],
                "attempt": r["attempt"],
            }
            for r in inits.to_pylist()
            if r["root"] in roots
        ),
        key=lambda row: row["root"],
    )


def test_a_batch_of_two_partitions_and_a_replay_reports_three_rows():
    roots = planned({0: [100, 140], 3: [7, 9]}, replays=[(1, 4, 2)])
    done = roots.acked(2_000)
    assert done.num_rows == 3 and is_run(done).tolist() == [True, True, False]
    assert done.column("latency_ms").to_pylist() == [1_000] * 3
    everyone = set(roots.inits.column("root").to_pylist())
    assert per_root(expand(done)) == acked_one_by_one(everyone, roots.inits)


def test_roots_settled_apart_cut_their_runs_and_are_left_out():
    roots = planned({0: [100, 110]}, replays=[(0, 50, 1)])
    inits = roots.inits
    settled = inits.filter(pa.array(np.isin(inits.column("offset").to_numpy(), [100, 104, 50])))
    done = roots.acked(2_000, settled)
    spans = sorted(zip(done.column("offset").to_pylist(), done.column("end_offset").to_pylist()))
    assert spans == [(101, 104), (105, 110)]
    left = set(inits.column("root").to_pylist()) - set(settled.column("root").to_pylist())
    assert per_root(expand(done)) == acked_one_by_one(left, inits)


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.integers(0, 3), st.tuples(st.integers(0, 30), st.integers(0, 12)), max_size=4
    ),
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 60), st.integers(1, 3)),
        max_size=5,
        unique_by=lambda r: r[:2],
    ),
    st.data(),
)
def test_every_root_but_those_settled_comes_back_acked_once(read, replays, data):
    """Whatever the runs, replays and roots settled apart, a reader gets one acked
    completion per other planned root, and none for a settled one."""
    roots = planned({p: [lo, lo + n] for p, (lo, n) in read.items()}, replays)
    inits = roots.inits
    mask = data.draw(st.lists(st.booleans(), min_size=inits.num_rows, max_size=inits.num_rows))
    settled = inits.filter(pa.array(mask, pa.bool_()))
    done = roots.acked(2_000, settled)
    left = set(inits.column("root").to_pylist()) - set(settled.column("root").to_pylist())
    assert per_root(expand(done)) == acked_one_by_one(left, inits)
