"""Runs of acked offsets in one completion row: what a batch writes and what readers get back."""

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from ackstream.sources.offsets import PlannedRoots
from ackstream.vocabulary import ids
from ackstream.vocabulary.ranges import checked, expand, is_run
from ackstream.vocabulary.records import completion_table

from helpers import logged_offset


def planned(read, replays=()):
    """The roots an offset of namespace ``topo`` plans: ``read`` {partition: [from, to]}."""
    end = logged_offset(
        source="topo",
        read={"events": {str(p): span for p, span in read.items()}},
        replays=[["events", p, off, att] for p, off, att in replays],
    )
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
    # the partitions hold what was read: no run a batch wrote is judged invalid
    ends = {("events", p): lo + n for p, (lo, n) in read.items()}
    assert per_root(expand(checked(done, ends))) == acked_one_by_one(left, inits)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),
            st.integers(-5, 50),
            st.one_of(st.integers(-5, 60), st.integers(10**9, 10**15)),
            st.booleans(),
        ),
        min_size=1,
        max_size=6,
    ),
    st.dictionaries(st.integers(0, 3), st.integers(0, 40), max_size=4),
)
def test_what_a_reader_expands_stays_within_the_partitions_whatever_the_runs_claim(claims, held):
    """Runs of any claim (huge, empty, negative, a partition not read, a root not its
    namespace's): after :func:`checked`, every acked row is an offset its partition holds,
    so expanding costs the partitions' offsets at most; every other run is one invalid row."""
    part, first, end, minted = (list(c) for c in zip(*claims))
    roots = ids.root_ids("topo", "events", part, first, 0)
    roots = [int(r) if ok else int(r) ^ 1 for r, ok in zip(roots, minted)]
    runs = completion_table(
        roots,
        "acked",
        topic="events",
        partition=part,
        offset=first,
        attempt=0,
        end_offset=end,
        ids="topo",
    )
    ends = {("events", p): n for p, n in held.items()}
    rows = expand(checked(runs, ends)).to_pylist()
    fits = [0 <= a < b <= held.get(p, -1) and ok for p, a, b, ok in claims]
    assert sum(r["status"] == "invalid" for r in rows) == fits.count(False)
    acked = [r for r in rows if r["status"] == "acked"]
    assert all(0 <= r["offset"] < held[r["partition"]] for r in acked)
    assert len(acked) == sum(b - a for (_, a, b, _), ok in zip(claims, fits) if ok)
