"""Properties of the source's bookkeeping over random emits, completions, timeouts,
replays, dead letters and restarts: every record is in exactly one state, and
acking what is in flight (dead letters written) eventually commits everything."""

import json

import pyarrow as pa
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ackstream.config.source import RetryPolicy
from ackstream.sources.done_runs import METADATA_LIMIT
from ackstream.sources.tracking import Tracker
from ackstream.vocabulary import ids
from ackstream.vocabulary.records import (
    ACKED,
    COMPLETION_SCHEMA,
    FAILED,
    INVALID,
    REJECTED,
    TIMED_OUT,
)

from helpers import done_offsets, logged_parts, scheduled

TPS = [("a", 0), ("a", 1), ("b", 0)]
STATUSES = [ACKED, ACKED, ACKED, FAILED, TIMED_OUT, REJECTED, INVALID]


def new_tracker():
    t = Tracker("topo", RetryPolicy(10, 40, max_retries=2), source_timeout_ms=100)
    for i, tp in enumerate(TPS):
        t.add_partition(tp, 100 * i)
    return t


def in_flight(t):
    """(tp, offset, attempt) of each root in flight, checked against its root id."""
    rows = t.flights.rows
    assert (rows.root[1:] > rows.root[:-1]).all()  # sorted, each root once
    out = []
    for root, part, off, att in zip(*(c.tolist() for c in rows[:4])):
        tp = t.partitions[part]
        assert root == int(ids.root_ids("topo", tp[0], tp[1], [off], [att])[0])
        out.append((tp, off, att))
    return out


def check_states(t):
    """Every offset between a partition's watermark and its read position is in exactly
    one state: in flight, scheduled, dead or done; none below the watermark is."""
    seen = {}
    for tp, off, _ in in_flight(t):
        seen.setdefault((tp, off), []).append("in flight")
    for key in scheduled(t):
        seen.setdefault(key, []).append("scheduled")
    for key in t.dead:
        seen.setdefault(key, []).append("dead")
    for tp, part in t.parts.items():
        for off in done_offsets(part.done):
            seen.setdefault((tp, off), []).append("done")
        expected = {(tp, o) for o in range(part.watermark, part.end)}
        mine = {k for k in seen if k[0] == tp}
        assert mine == expected, (tp, sorted(mine ^ expected))
    assert all(len(states) == 1 for states in seen.values()), seen


def completions(rows):
    return pa.Table.from_pylist(
        [{"root": r, "status": s, "reason": "why"} for r, s in rows], schema=COMPLETION_SCHEMA
    )


operations = st.lists(
    st.one_of(
        st.tuples(st.just("emit"), st.integers(0, len(TPS) - 1), st.integers(1, 6)),
        st.tuples(
            st.just("complete"),
            st.lists(st.tuples(st.integers(0, 40), st.sampled_from(STATUSES)), max_size=8),
        ),
        st.tuples(st.just("tick"), st.integers(1, 60)),
        st.tuples(st.just("started")),
        st.tuples(st.just("restart")),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(operations, st.booleans())
def test_every_record_is_in_one_state_and_all_end_committed(ops, clock_on_commit):
    t, now = new_tracker(), 0
    t.clock_on_commit = clock_on_commit
    for op in ops:
        if op[0] == "emit":
            tp = TPS[op[1]]
            t.emit_range(tp, t.parts[tp].end, t.parts[tp].end + op[2], now)
        elif op[0] == "complete":
            flying = t.flights.rows.root.tolist()
            rows = [(flying[i] if i < len(flying) else 12345 + i, s) for i, s in op[1]]
            t.complete(completions(rows), now)
        elif op[0] == "tick":
            now += op[1]
            t.expire(now)
            t.due(now)
        elif op[0] == "started":
            t.started(now)
        else:
            restored = new_tracker()
            restored.restore(logged_parts(t), now, t.unfinished())
            restored.clock_on_commit = clock_on_commit
            # a dead letter not written yet is in flight again: it may still complete,
            # else it times out and replays (the source writes letters before snapshots)
            unwritten = [
                ((d.topic, d.partition), d.offset, d.attempts - 1) for d in t.dead.values()
            ]
            assert sorted(in_flight(restored)) == sorted(in_flight(t) + unwritten)
            assert scheduled(restored) == scheduled(t)
            t = restored
        if t.dead and now % 2:  # dead letters are sometimes written late
            t.dead_lettered(list(t.dead.values()))
        check_states(t)
    for _ in range(10):  # ack whatever is in flight until nothing is left
        t.complete(completions([(r, ACKED) for r in t.flights.rows.root.tolist()]), now)
        t.dead_lettered(list(t.dead.values()))
        now += 1000
        t.due(now)
        check_states(t)
    assert t.watermarks() == {tp: part.end for tp, part in t.parts.items()}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 3000), max_size=300), max_size=8),
    st.integers(0, 5),
)
@example([list(range(1, 3000, 2)), [0], list(range(2, 900, 2))], 0)  # runs past the limit
@example([list(range(7, 3000, 7)), list(range(8, 3000, 7)), list(range(1, 7))], 0)
def test_done_offsets_watermark_and_commit_metadata_follow_a_plain_set(batches, start):
    """A partition's done offsets kept as one sorted array merged into (not sorted
    again), its watermark moved by a scan only when needed, and its commit metadata read
    from a prefix (and cached): the same as a set of every offset marked done."""
    t, tp, marked = new_tracker(), ("c", 0), set()
    t.add_partition(tp, start)
    t.emit_range(tp, start, 4000, 0)
    part = t.parts[tp]
    for offsets in batches:
        t.mark_done(tp, offsets)
        marked |= set(offsets)
        watermark = start
        while watermark in marked:
            watermark += 1
        assert part.watermark == watermark
        assert done_offsets(part.done) == sorted(o for o in marked if o > watermark)
        spans, lo = [], None  # runs of the done offsets above the watermark, in full
        for o in done_offsets(part.done):
            if lo is not None and o == spans[-1][1]:
                spans[-1][1] = o + 1
            else:
                spans.append([o, o + 1])
            lo = o
        meta = t.commit_metadata(tp)
        assert len(meta) < METADATA_LIMIT
        got = json.loads(meta)["done"]
        assert got == spans[: len(got)]
        if len(got) < len(spans):  # it stopped because the next run would not fit
            longer = json.dumps({"done": spans[: len(got) + 1]}, separators=(",", ":"))
            assert len(longer) >= METADATA_LIMIT
