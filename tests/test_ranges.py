"""Runs of acked offsets in one completion row: what a batch writes and what readers get back."""

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from ackstream import ids
from ackstream.ranges import compact, expand, is_run
from ackstream.records import ACKED, FAILED, completion_table


def acked(offsets, namespace="topo", topic="events", partition=0, attempt=0, latency=5):
    offsets = np.asarray(offsets, np.int64)
    return completion_table(
        ids.root_ids(namespace, topic, partition, offsets, attempt),
        ACKED,
        topic=topic,
        partition=partition,
        offset=offsets,
        attempt=attempt,
        latency_ms=latency,
        completed_ms=1_000,
    )


def by_root(table):
    return sorted(table.to_pylist(), key=lambda row: (row["root"], row["status"]))


def test_a_batch_of_two_partitions_compacts_to_two_rows_and_expands_back():
    done = pa.concat_tables([acked(range(100, 140)), acked(range(7, 9), partition=3)])
    runs = compact(done, "topo")
    assert runs.num_rows == 2 and is_run(runs).all()
    assert sorted(
        zip(
            runs["partition"].to_pylist(),
            runs["offset"].to_pylist(),
            runs["end_offset"].to_pylist(),
        )
    ) == [(0, 100, 140), (3, 7, 9)]
    assert by_root(expand(runs)) == by_root(done)


def test_gaps_fails_replays_and_other_latencies_break_runs():
    failed = completion_table(
        ids.root_ids("topo", "events", 0, [103], [0]),
        FAILED,
        topic="events",
        partition=0,
        offset=[103],
        attempt=0,
        latency_ms=5,
        completed_ms=1_000,
        reason="bad",
    )
    done = pa.concat_tables(
        [
            acked([100, 101, 102]),  # a run, up to the failed offset
            failed,
            acked([104, 105], attempt=1),  # replays stay single
            acked([106, 107], latency=9),  # another latency: a run of its own
            acked([109]),  # alone after a gap
        ]
    )
    runs = compact(done, "topo")
    spans = sorted((r["offset"], r["end_offset"]) for r in runs.to_pylist() if r["end_offset"])
    assert spans == [(100, 103), (106, 108)]
    assert runs.num_rows == 2 + 1 + 2 + 1
    assert by_root(expand(runs)) == by_root(done)


def test_roots_of_another_namespace_are_not_compacted():
    done = acked(range(10), namespace="another")
    assert not is_run(compact(done, "topo")).any()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 40), st.integers(0, 1), st.integers(0, 2)),
        max_size=60,
        unique_by=lambda row: row[:3],
    )
)
def test_expand_gives_back_every_compacted_completion(rows):
    """Whatever the mix of partitions, offsets, attempts and latencies, the readers get
    every root's completion back, once."""
    tables = [acked([o], partition=p, attempt=a, latency=lat) for p, o, a, lat in rows]
    done = pa.concat_tables(tables) if tables else acked([])
    runs = compact(done, "topo")
    assert runs.num_rows <= done.num_rows
    assert by_root(expand(runs)) == by_root(done)
