"""The source's pure bookkeeping: watermarks, backoff, max retries, max pending, restore."""

import json
import os
import re

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from ackstream.config.source import RetryPolicy
from ackstream.sources.done_runs import METADATA_LIMIT, DoneRuns, ranges
from ackstream.sources.in_flight import InFlight
from ackstream.sources.spans import NOT_STARTED
from ackstream.sources.state import SourceState
from ackstream.sources.tracking import Tracker
from ackstream.vocabulary import ids
from ackstream.vocabulary.records import (
    ACKED,
    ALIVE,
    BATCH_FAILED,
    COMPLETION_SCHEMA,
    FAILED,
    INVALID,
    REJECTED,
    TIMED_OUT,
)

from helpers import done_offsets, logged_parts, scheduled, suspects, uncharged

TP = ("events", 0)


def tracker(max_retries=2, max_pending=None, timeout=60_000):
    t = Tracker("topo", RetryPolicy(100, 1000, max_retries), timeout, max_pending)
    t.add_partition(TP, 10)
    return t


def root(offset, attempt=0, tp=TP):
    return int(ids.root_ids("topo", tp[0], tp[1], [offset], [attempt])[0])


def done(*pairs):
    return completions(*({"root": r, "status": s} for r, s in pairs))


def completions(*rows):
    """Completions as the channel gives them: a table, reason null unless a row has one."""
    return pa.Table.from_pylist([{"reason": None, **row} for row in rows], schema=COMPLETION_SCHEMA)


def in_flight_offsets(t):
    return sorted(t.flights.rows.offset.tolist())


def test_watermark_advances_only_over_contiguous_acks():
    t = tracker()
    t.emit_range(TP, 10, 15, now_ms=0)
    assert t.in_flight == 5
    t.complete(done((root(11), ACKED), (root(12), ACKED)), 1)
    assert t.watermarks() == {TP: 10}  # 10 is still in flight: never commit ahead
    assert json.loads(t.commit_metadata(TP)) == {"done": [[11, 13]]}
    t.complete(done((root(10), ACKED)), 2)
    assert t.watermarks() == {TP: 13}
    assert json.loads(t.commit_metadata(TP)) == {"done": []}


def test_unknown_and_duplicate_completions_are_ignored():
    t = tracker()
    t.emit_range(TP, 10, 12, 0)
    t.complete(done((root(10, attempt=3), ACKED), (12345, ACKED)), 1)
    t.complete(done((root(10), ACKED)), 1)
    t.complete(done((root(10), FAILED), (root(10), ACKED)), 2)
    assert t.watermarks() == {TP: 11} and not scheduled(t)


def test_of_two_outcomes_read_together_a_rejection_wins_over_an_ack():
    """A read task rejects an oversize record; the topology acks its batch's roots from
    the offset. Read in one poll, in either order, the record must be dead-lettered."""
    t = tracker(max_retries=5)
    t.emit_range(TP, 10, 12, 0)
    dead = t.complete(
        completions(
            {"root": root(10), "status": ACKED},
            {"root": root(11), "status": ACKED},
            {"root": root(10), "status": REJECTED, "reason": "too big"},
        ),
        1,
    )
    assert [(d.offset, d.reason) for d in dead] == [(10, "rejected: too big")]
    assert t.watermarks() == {TP: 10} and not t.in_flight


def test_backoff_doubles_up_to_the_maximum():
    policy = RetryPolicy(100, 1000, 10)
    assert [policy.delay_ms(a) for a in range(1, 7)] == [100, 200, 400, 800, 1000, 1000]


def test_failed_offset_comes_back_with_attempt_plus_one_after_the_backoff():
    t = tracker()
    t.emit_range(TP, 10, 11, 0)
    t.complete(done((root(10), FAILED)), now_ms=1000)
    assert t.due(1099).tolist() == []
    assert t.due(1100).tolist() == [("events", 0, 10, 1)]
    assert root(10, 1) in t.flights.rows.root and t.in_flight == 1
    t.complete(done((root(10, 1), TIMED_OUT)), now_ms=2000)
    assert t.due(2199).tolist() == [] and t.due(2200).tolist() == [("events", 0, 10, 2)]


def test_max_retries_lead_to_exactly_one_dead_letter_which_then_counts_as_done():
    t = tracker(max_retries=1)
    t.emit_range(TP, 10, 12, 0)
    t.complete(done((root(11), ACKED), (root(10), FAILED)), 0)
    t.due(10_000)
    dead = t.complete(done((root(10, 1), TIMED_OUT)), 10_000)
    assert [(d.offset, d.attempts, d.reason) for d in dead] == [(10, 2, TIMED_OUT)]
    assert t.watermarks() == {TP: 10}  # not done until the letter is written
    assert t.complete(done((root(10, 1), TIMED_OUT)), 10_001) == []
    t.dead_lettered(dead)
    assert t.watermarks() == {TP: 12} and not t.dead and not t.due(99_999)


def test_rejected_is_dead_lettered_at_once_with_its_reason_and_invalid_is_ignored():
    t = tracker(max_retries=5)
    t.emit_range(TP, 10, 12, 0)
    t.complete(
        completions({"root": root(11), "status": INVALID, "reason": "kind 64 has unknown bits"}), 1
    )
    assert t.in_flight == 2  # an unusable ack record says nothing about its root
    dead = t.complete(
        completions(
            {"root": root(10), "status": REJECTED, "reason": "value is not JSON"},
            {"root": root(11), "status": FAILED, "reason": "bolt: ValueError"},
        ),
        2,
    )
    assert [(d.offset, d.attempts, d.reason) for d in dead] == [
        (10, 1, "rejected: value is not JSON")
    ]
    assert scheduled(t) == {(TP, 11): (1, 102)}  # a fail replays


def test_max_pending_bounds_new_roots():
    t = tracker(max_pending=3)
    assert t.budget() == 3 and t.budget(limit=2) == 2
    t.emit_range(TP, 10, 13, 0)
    assert t.budget() == 0
    t.complete(done((root(10), ACKED)), 1)
    assert t.budget() == 1
    t.complete(done((root(11), FAILED)), 1)
    assert t.budget() == 1  # a record waiting for its replay holds its room
    assert t.due(10_000, budget=0).tolist() == []
    assert t.due(10_000).tolist() == [("events", 0, 11, 1)] and t.budget() == 1
    t.complete(done((root(11, 1), ACKED), (root(12), ACKED)), 10_001)
    assert t.budget() == 3


def test_a_downstream_outage_holds_at_most_max_pending_records():
    """Every record fails, batch after batch: new ones are read only while the records
    not done (in flight or waiting for their replay) are fewer than maxPending, so an
    outage of any length holds that many, and their replays go on within it."""
    t = tracker(max_pending=100, max_retries=50)
    now, end = 0, 10
    for _ in range(20):
        replays = t.due(now)
        room = t.budget()
        t.emit_range(TP, end, end + room, now)
        end += room
        failing = [root(o, a) for _, _, o, a in replays.tolist()] + [
            root(o) for o in range(end - room, end)
        ]
        t.complete(done(*((r, FAILED) for r in failing)), now)
        assert t.in_flight + len(t.waiting) <= 100
        now += 20_000
    assert end - 10 == 100  # the first batch filled it; the rest were replays


def test_roots_without_completion_time_out_at_the_source():
    t = tracker(timeout=5000)
    t.emit_range(TP, 10, 12, 0)
    t.complete(done((root(10), ACKED)), 1)
    assert t.expire(4999) == [] and t.in_flight == 1
    t.expire(5000)
    assert t.in_flight == 0 and t.due(5100).tolist() == [("events", 0, 11, 1)]


def test_snapshot_restore_resumes_in_flight_and_scheduled_through_json():
    t = tracker()
    t.emit_range(TP, 10, 16, 0)
    t.complete(
        done((root(10), ACKED), (root(12), ACKED), (root(13), FAILED), (root(14), FAILED)), 0
    )
    t.due(100)  # 13 and 14 in flight at attempt 1
    t.complete(done((root(14, 1), FAILED)), 200)  # 14 scheduled for attempt 2 at 400
    snap = logged_parts(t)
    r = tracker()
    r.restore(snap, now_ms=1000, unfinished=t.unfinished())
    assert r.watermarks() == {TP: 11}
    assert sorted(zip(r.flights.rows.offset.tolist(), r.flights.rows.attempt.tolist())) == [
        (11, 0),
        (13, 1),
        (15, 0),
    ]
    assert scheduled(r) == {(TP, 14): (2, 400)}
    r.complete(done((root(11), ACKED), (root(13, 1), ACKED), (root(15), ACKED)), 1000)
    assert r.due(1000).tolist() == [("events", 0, 14, 2)]


def test_suspects_replay_by_group_and_alone_with_no_retry_charged():
    """A batch of 16 roots fails as a whole: 8 groups of 2, each a batch of its own, due
    at once; ordinary replays never take them. A root failing alone is charged."""
    t = tracker(max_retries=1)
    t.new_batch()
    t.emit_range(TP, 10, 26, 0)
    t.complete(done((root(10), FAILED)), 0)  # an ordinary fail: due at 100
    t.complete(done(*((root(o), BATCH_FAILED) for o in range(11, 26))), 0)
    assert t.due(1000).tolist() == [("events", 0, 10, 1)]
    groups = []
    while group := t.due_group(0):
        groups.append(group.tolist())
    assert groups == [
        [("events", 0, o, 1) for o in range(lo, min(lo + 2, 26))] for lo in range(11, 26, 2)
    ]
    t.new_batch()  # 11, 12 in flight again: 11 is the poison, alone this time
    t.flights.take([root(o, 1) for o in range(12, 26)])
    t.complete(done((root(11, 1), BATCH_FAILED)), 0)  # alone: charged, replayed alone
    assert scheduled(t) == {(TP, 11): (2, 100)} and set(suspects(t)) == {(TP, 11)}
    assert t.due(1000).tolist() == [] and t.due_group(1000).tolist() == [("events", 0, 11, 2)]
    t.new_batch()
    t.complete(done((root(11, 2), BATCH_FAILED)), 0)  # its retry used: dead, 3 emits
    (letter,) = t.dead.values()
    assert (letter.offset, letter.attempts) == (11, 3)


def test_an_error_every_group_hits_is_charged_to_all_and_never_split_again():
    """A stage that fails every record as a whole-batch error: the failed batch of 64 is
    split into 8 groups once; when all 8 fail too, the error is not one record's, so
    every record is charged a retry, and they are replayed together (not split into
    64, then 512 batches) until their retries are used: then all are dead-lettered with
    the error. A batch of theirs that goes through acks them all (the outage ended)."""
    t = tracker(max_retries=2)

    def fail_batch(replays, now, why="SparkRuntimeException: boom"):
        roots = [root(o, a) for _, _, o, a in replays.tolist()]
        return t.complete(
            completions(*({"root": r, "status": BATCH_FAILED, "reason": why} for r in roots)), now
        )

    t.new_batch()
    t.emit_range(TP, 10, 74, 0)
    fail_batch(
        t.due(0).__class__(
            t.partitions, np.zeros(64, np.int64), np.arange(10, 74), np.zeros(64, np.int64)
        ),
        0,
    )
    batches = 0
    while group := (t.new_batch(), t.due_group(0))[1]:
        batches += 1
        assert len(group) == 8  # a group of the first round: never a smaller one
        fail_batch(group, 0)
    assert batches == 8 and len(t.waiting) == 64 and len(suspects(t)) == 64
    assert t.due_group(99).tolist() == []  # charged: their backoff first
    t.new_batch()
    together = t.due_group(100)
    assert len(together) == 64 and {a for *_, a in together.tolist()} == {2}
    fail_batch(together, 100)  # their second charged failure: the last retry left
    t.new_batch()
    again = t.due_group(300)
    assert len(again) == 64
    letters = fail_batch(again, 300)
    assert len(letters) == 64 and not t.waiting.columns()[0].size
    assert {d.reason for d in letters} == {
        "batch_failed: charged with 64 records of a failing group; "
        "the group's first error: SparkRuntimeException: boom"
    }
    assert {d.attempts for d in letters} == {4}  # the first read, a suspect, two retries


def test_a_letter_charged_with_its_group_says_so_beside_the_first_records_error():
    """A systematic error that quotes a value (a cast): every record of the group is
    charged with the first record's error, and its letter says that it was."""
    t = tracker(max_retries=0)

    def fail_batch(replays, now):
        rows = replays.tolist()
        return t.complete(
            completions(
                *(
                    {
                        "root": root(o, a),
                        "status": BATCH_FAILED,
                        "reason": f"'rec {o}' cannot be cast",
                    }
                    for _, _, o, a in rows
                )
            ),
            now,
        )

    t.new_batch()
    t.emit_range(TP, 10, 26, 0)
    first = t.due(0).__class__(
        t.partitions, np.zeros(16, np.int64), np.arange(10, 26), np.zeros(16, np.int64)
    )
    fail_batch(first, 0)
    letters = []
    while group := (t.new_batch(), t.due_group(0))[1]:
        letters += fail_batch(group, 0)
    assert len(letters) == 16
    (reason,) = {d.reason for d in letters}  # one record's error, quoting its value
    prefix = "batch_failed: charged with 16 records of a failing group; the group's first error: "
    assert reason.startswith(prefix)
    assert re.fullmatch(r"'rec (\d+)' cannot be cast", reason[len(prefix) :])


def test_rounds_of_isolation_go_on_after_a_restart():
    """Restarted in the middle of a round (its groups waiting, one in flight): the round
    goes on, so when its groups have all failed they are charged together, not each
    split into a round of its own."""
    t = tracker(max_retries=2)
    t.new_batch()
    t.emit_range(TP, 10, 74, 0)
    t.complete(done(*((root(o), BATCH_FAILED) for o in range(10, 74))), 0)
    for _ in range(3):  # three groups fail; the fourth is in flight at the restart
        t.new_batch()
        group = t.due_group(0)
        t.complete(done(*((root(o, a), BATCH_FAILED) for _, _, o, a in group.tolist())), 0)
    t.new_batch()
    flying = t.due_group(0)
    r = tracker(max_retries=2)
    r.restore(logged_parts(t), 0, t.unfinished())
    r.restore_rounds(json.loads(json.dumps(t.rounds())))
    r.complete(done(*((root(o, a), BATCH_FAILED) for _, _, o, a in flying.tolist())), 0)
    sizes = []
    while group := (r.new_batch(), r.due_group(0))[1]:
        sizes.append(len(group))
        r.complete(done(*((root(o, a), BATCH_FAILED) for _, _, o, a in group.tolist())), 0)
    assert sizes == [8] * 4  # the round's other four groups; then all 64, charged
    assert len(r.waiting) == 64 and len(set(suspects(r).values())) == 1


def test_a_round_with_one_group_through_keeps_isolating_the_others():
    t = tracker(max_retries=2)
    t.new_batch()
    t.emit_range(TP, 10, 26, 0)
    t.complete(done(*((root(o), BATCH_FAILED) for o in range(10, 26))), 0)
    seen = []
    while group := (t.new_batch(), t.due_group(0))[1]:
        seen.append(len(group))
        offsets = [o for _, _, o, _ in group.tolist()]
        if 10 in offsets:  # the group holding the poison fails; the others go through
            t.complete(done(*((root(o, a), BATCH_FAILED) for _, _, o, a in group.tolist())), 0)
        else:
            t.complete(done(*((root(o, a), ACKED) for _, _, o, a in group.tolist())), 0)
    assert seen == [2] * 8 + [1, 1]  # then 10 and 11 alone
    assert scheduled(t) == {(TP, 10): (3, 100)}  # its first charged failure, alone


def isolate(t, first, end, poisons):
    """Fail the batch ``[first, end)`` as a whole, then replay its groups until none is due,
    failing a group whole when it holds one of ``poisons`` and acking it otherwise: the
    number of batches the isolation took."""
    t.new_batch()
    t.emit_range(TP, first, end, 0)
    t.complete(done(*((root(o), BATCH_FAILED) for o in range(first, end))), 0)
    batches = 0
    while group := (t.new_batch(), t.due_group(0))[1]:
        batches += 1
        rows = group.tolist()
        status = BATCH_FAILED if {o for _, _, o, _ in rows} & poisons else ACKED
        t.complete(done(*((root(o, a), status) for _, _, o, a in rows)), 0)
    return batches


def test_a_record_at_fault_is_found_by_halving_its_group_after_the_first_round():
    """One record at fault among 512: the first round's 8 groups of 64, then its group
    halved, a round of 2 batches each, to the record alone: 8 + 2 * 6 batches, where
    rounds of 8 all through took 8 + 8 + 8."""
    t = tracker()
    assert isolate(t, 10, 522, {180}) == 8 + 2 * 6
    # alone, charged its first retry after its first read and 1 + 6 rounds uncharged
    assert scheduled(t) == {(TP, 180): (1 + 1 + 6, 100)}
    assert t.watermarks() == {TP: 180} and t.in_flight == 0


def test_two_records_at_fault_in_one_halved_group_are_each_found_not_charged_together():
    """Both halves of a group fail: a round split out of a group and narrower than a
    first round says each half holds a record at fault, not that the error is every
    record's; the halves split on and the two end alone, the rest acked."""
    t = tracker()
    isolate(t, 10, 74, {10, 17})  # 10 and 17: one group of the first round, two halves
    waiting = scheduled(t)
    assert set(waiting) == {(TP, 10), (TP, 17)}
    assert {due for _, due in waiting.values()} == {100}  # each charged alone, once
    assert t.watermarks() == {TP: 10} and len(t.parts[TP].done) == 64 - 2


def test_suspects_and_their_uncharged_attempts_survive_a_restore(tmp_path):
    t = tracker()
    t.new_batch()
    t.emit_range(TP, 10, 14, 0)
    t.complete(done(*((root(o), BATCH_FAILED) for o in range(10, 14))), 5)
    t.due_group(5)  # 10 in flight at attempt 1, uncharged; 11, 12 and 13 wait
    state = SourceState(str(tmp_path))
    state.write(1, t)
    r = tracker()
    r.restore(logged_parts(t), 6, state.read(1))
    assert (scheduled(r), suspects(r), uncharged(r)) == (scheduled(t), suspects(t), uncharged(t))
    assert uncharged(r) == {(TP, o): 1 for o in range(10, 14)}
    assert r.due(6).tolist() == [] and r.due_group(6).tolist() == [("events", 0, 11, 1)]


def test_commit_metadata_fits_the_broker_limit():
    t = tracker()
    t.emit_range(TP, 10, 5000, 0)
    t.complete(done(*[(root(o), ACKED) for o in range(12, 5000, 2)]), 1)
    assert len(t.commit_metadata(TP).encode()) <= METADATA_LIMIT


def test_ranges():
    assert ranges({1, 2, 3, 7}) == [[1, 4], [7, 8]] and ranges([]) == []


def test_source_timeout_starts_when_the_batch_has_run():
    t = tracker(timeout=5000)
    t.clock_on_commit = True
    t.emit_range(TP, 10, 12, 0)
    assert t.expire(99_999) == [] and t.in_flight == 2
    t.started(100_000)
    t.expire(104_999)
    assert t.in_flight == 2
    t.expire(105_000)
    assert t.in_flight == 0


def test_timeouts_follow_emission_order_across_batches_and_replays():
    """Roots are kept oldest first; a batch not started yet neither times out nor hides
    an older one, and a replay's clock starts when its batch has run."""
    t = tracker(timeout=5000)
    t.clock_on_commit = True
    t.emit_range(TP, 10, 12, 0)
    t.started(1000)  # 10, 11 from 1000
    t.complete(done((root(10), FAILED)), 1500)
    t.emit_range(TP, 12, 13, 1600)
    t.due(1600)  # 10 again at attempt 1; 12 and it start at 3000
    assert not t.overdue(999) and t.overdue(1000)
    t.started(3000)
    t.emit_range(TP, 13, 14, 3100)  # planned, not started
    t.expire(5999)
    assert in_flight_offsets(t) == [10, 11, 12, 13]
    t.expire(6000)  # 11 only
    assert in_flight_offsets(t) == [10, 12, 13]
    t.expire(8000)  # 10 (attempt 1) and 12; 13 never started
    assert in_flight_offsets(t) == [13] and t.flights.rows.emitted_ms.tolist() == [NOT_STARTED]


def test_in_flight_table_finds_and_takes_roots_by_id_coordinates_and_runs():
    minted = []

    def mint(part, offset, attempt):
        minted.append(len(offset))
        return 1000 * part + 10 * offset + attempt

    table = InFlight(mint)
    table.add_unminted(0, [3, 1, 2], 0, 100, 0)
    table.add_unminted([1, 1, 0], [9, 8, 5], [1, 1, 2], 200, 1)
    assert len(table) == 6 and not minted  # no id until a lookup by id
    assert table.take_runs([(0, 2, 4), (1, 8, 10)]).rows()[1].tolist() == [2, 3]  # attempt 0
    assert not minted
    assert table.take_at([1, 0], [9, 5], [1, 1]).offset.tolist() == [9]  # 5 is at attempt 2
    taken = table.take([1081, 99, 10])  # ids of (1, 8, 1) and (0, 1, 0)
    assert sorted(zip(taken.root.tolist(), taken.offset.tolist())) == [(10, 1), (1081, 8)]
    assert minted  # a lookup by id minted the ids of its chunks
    assert table.rows.root.tolist() == [52] and len(table) == 1
    assert table.take_offsets(0, [5, 9]).attempt.tolist() == [2]
    assert not len(table) and not table.take([]).root.size


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    *("add", "add", "emit", "emit", "runs", "at", "id", "offsets", "expire"),
                    *("mark", "restart"),
                ]
            ),
            st.lists(
                st.tuples(st.integers(0, 2), st.integers(0, 60), st.integers(0, 2)), max_size=12
            ),
        ),
        min_size=20,
        max_size=80,
    )
)
def test_in_flight_table_and_its_changes_follow_a_plain_set(steps):
    """Runs, chunks, compaction, merges and the change log against a set of coordinates:
    what each take returns, what stays, its timeout's start (restarts move it), and the
    changes since the last mark, net."""
    table = InFlight(lambda part, offset, attempt: 100_000 * part + 10 * offset + attempt)
    model: dict = {}  # (part, offset, attempt) -> emitted_ms
    at_mark: set = set()

    def coordinates(columns):
        """``(part, offset, attempt)`` columns as sorted triples."""
        return sorted(zip(*(c.tolist() for c in columns)))

    for now, (kind, rows) in enumerate(steps):
        rows = sorted(set(rows))
        flying = {(p, o) for p, o, _ in model}
        if kind == "add":
            rows = [r for r in rows if (r[0], r[1]) not in flying]
            rows = list({(p, o): (p, o, a) for p, o, a in rows}.values())  # once per record
            if rows:
                table.add_unminted(*(np.array(c) for c in zip(*rows)), now, 0)
            model.update(dict.fromkeys(rows, now))
            continue
        if kind == "emit":  # runs read anew, attempt 0, none overlapping what is in flight
            runs = {}
            for p, o, a in rows:
                span = {(p, x) for x in range(o, o + 40 * a + 3)}
                if p not in runs and not span & flying:
                    runs[p] = (o, o + 40 * a + 3)
            if runs:
                part = list(runs)
                table.add_runs(part, [runs[p][0] for p in part], [runs[p][1] for p in part], now, 0)
            for p, (lo, hi) in runs.items():
                model.update(dict.fromkeys(((p, o, 0) for o in range(lo, hi)), now))
            continue
        if kind == "restart":  # the acker's alive notices, by coordinates
            table.restart_at(*(np.array([r[i] for r in rows], np.int64) for i in range(3)), now)
            model.update({r: now for r in rows if r in model})
            continue
        if kind == "mark":
            table.changes()  # asking must not change what comes next
            if rows:
                table.mark()
                at_mark = set(model)
            continue
        if kind == "runs":
            spans = [(p, min(o, a * 20), max(o, a * 20) + 1) for p, o, a in rows]
            taken = table.take_runs(spans).rows()
            gone = {
                (p, o, a)
                for p, o, a in model
                if a == 0 and any(p == q and lo <= o < hi for q, lo, hi in spans)
            }
        elif kind == "at":
            taken = table.take_at(*(np.array([r[i] for r in rows], np.int64) for i in range(3)))[
                1:4
            ]
            gone = set(model) & set(rows)
        elif kind == "id":
            taken = table.take([100_000 * p + 10 * o + a for p, o, a in rows])[1:4]
            gone = set(model) & set(rows)
        elif kind == "expire":
            before = now - 1 - (rows[0][1] % 8 if rows else 0)
            taken = table.take_started_at_or_before(before)[1:4]
            gone = {r for r, emitted in model.items() if emitted <= before}
        else:
            offsets = [o for _, o, _ in rows]
            taken = table.take_offsets(1, offsets)[1:4]
            gone = {r for r in model if r[0] == 1 and r[1] in offsets}
        assert coordinates(taken) == sorted(gone)
        for r in gone:
            del model[r]
        assert len(table) == len(model)
    assert coordinates(table.rows[1:4]) == sorted(model)
    assert sorted(zip(*(c.tolist() for c in table.flying().rows()))) == sorted(model)
    added, removed = (list(zip(*(c.tolist() for c in spans.rows()))) for spans in table.changes())
    assert len(set(added)) == len(added) and len(set(removed)) == len(removed)  # each once
    added, removed = set(added), set(removed)
    assert added <= set(model) and removed <= at_mark
    assert (at_mark - removed) | added == set(model)  # what a restore rebuilds


def test_a_reset_reported_by_the_acker_restarts_the_source_timeout():
    """Storm's resetTimeout: message timeout 10 s, a reset every 9 s; the source timeout
    (20 s) must not replay a root the acker still holds, and its ack still counts."""
    from ackstream.vocabulary.records import ALIVE

    t = tracker(timeout=20_000)
    t.emit_range(TP, 10, 12, now_ms=0)
    for now in (9_000, 18_000, 27_000, 36_000):
        t.complete(done((root(10), ALIVE)), now)
        t.expire(now)
    assert in_flight_offsets(t) == [10]  # reset all along
    assert set(scheduled(t)) == {(TP, 11)}  # not reset: timed out at 20 s
    t.complete(done((root(10), ACKED)), 40_000)
    assert t.watermarks() == {TP: 11}


def test_an_alive_notice_is_no_outcome():
    from ackstream.vocabulary.records import ALIVE, one_outcome_per_root

    table = completions({"root": 1, "status": ALIVE}, {"root": 1, "status": ACKED})
    assert one_outcome_per_root(table).column("status").to_pylist() == [ACKED]


def acks_with_coordinates(*pairs, tp=TP, minted_by="topo"):
    """Acks of ``(offset, attempt)`` pairs carrying their coordinates, as the acker writes them."""
    return completions(
        *(
            {
                "root": int(ids.root_ids(minted_by, tp[0], tp[1], [o], [a])[0]),
                "status": ACKED,
                "topic": tp[0],
                "partition": tp[1],
                "offset": o,
                "attempt": a,
            }
            for o, a in pairs
        )
    )


def test_a_late_ack_of_an_earlier_attempt_settles_the_record():
    """Offset 10 timed out (replay scheduled), 11 timed out and is replayed (in flight at
    attempt 1); the acks of their first attempts come after: both are done, no replay
    runs and the later attempt's outcome is ignored."""
    t = tracker(timeout=5_000)
    t.emit_range(TP, 10, 13, now_ms=0)
    t.expire(5_000)
    assert [r[2] for r in t.due(5_100, budget=1).tolist()] == [10]  # replayed at attempt 1
    t.complete(acks_with_coordinates((10, 0), (11, 0)), 5_200)
    assert t.watermarks() == {TP: 12} and not t.in_flight
    assert set(scheduled(t)) == {(TP, 12)}  # its ack has not come
    assert t.counts["acked"] == 2
    t.complete(done((root(10, 1), FAILED)), 5_300)  # the replay's tree fails after all
    assert t.watermarks() == {TP: 12} and set(scheduled(t)) == {(TP, 12)}


def test_a_late_ack_is_only_taken_from_roots_this_source_minted():
    t = tracker(timeout=5_000)
    t.emit_range(TP, 10, 12, now_ms=0)
    t.expire(5_000)
    t.complete(acks_with_coordinates((10, 0), minted_by="another-topology"), 5_100)
    forged = acks_with_coordinates((11, 0))
    forged = forged.set_column(4, "offset", pa.array([10], pa.int64()))
    t.complete(forged, 5_100)  # a root of offset 11 claiming to be offset 10
    assert t.watermarks() == {TP: 10} and set(scheduled(t)) == {(TP, 10), (TP, 11)}


def test_a_pause_is_not_charged_to_the_roots_in_flight():
    """The brokers did not answer for 60 s: a root emitted 4 s before has 1 s left after."""
    t = tracker(timeout=5_000)
    t.emit_range(TP, 10, 11, now_ms=0)
    t.clock_on_commit = True
    t.emit_range(TP, 11, 12, now_ms=0)  # planned, its batch not run: not started
    t.paused(60_000)
    assert t.expire(64_999) == [] and in_flight_offsets(t) == [10, 11]
    t.expire(65_000)
    assert in_flight_offsets(t) == [11]


def run_of(first, end, minted_by="topo", tp=TP):
    """One completion acking offsets ``first`` up to ``end`` at attempt 0
    (ackstream.vocabulary.ranges)."""
    return completions(
        {
            "root": int(ids.root_ids(minted_by, tp[0], tp[1], [first], [0])[0]),
            "status": ACKED,
            "topic": tp[0],
            "partition": tp[1],
            "offset": first,
            "attempt": 0,
            "end_offset": end,
            "ids": minted_by,
        }
    )


def test_a_run_acks_every_root_of_its_offsets_in_flight():
    t = tracker()
    t.emit_range(TP, 10, 20, now_ms=0)
    t.complete(run_of(12, 20), 1)
    assert in_flight_offsets(t) == [10, 11] and t.counts["acked"] == 8
    assert t.watermarks() == {TP: 10}
    t.complete(run_of(10, 12), 2)
    assert t.watermarks() == {TP: 20} and not t.in_flight and t.counts["acked"] == 10


#: more records than a table with a row each could hold
HUGE = 10**11


def test_records_read_anew_cost_a_row_per_run_until_an_exception():
    """A run of offsets read anew stays one row, however long: one record taken out of
    its middle leaves two runs, and runs acked take them out whole, no id minted."""
    minted = []
    table = InFlight(lambda part, offset, attempt: minted.append(len(offset)) or offset)
    table.add_runs([0, 1], [0, 5], [HUGE, 9], 100, 0)
    table.mark()
    assert len(table) == HUGE + 4
    taken = table.take_at([0, 1], [HUGE // 2, 7], [0, 0])
    assert taken.offset.tolist() == [HUGE // 2, 7] and len(table) == HUGE + 2
    done = table.take_runs([(0, 0, HUGE // 2), (0, HUGE // 2 + 1, HUGE), (1, 5, 7)])
    assert done.records == HUGE - 1 + 2 and len(table) == 1
    assert table.flying().rows()[1].tolist() == [8]  # a short piece left: a row of its own
    removed = table.changes().removed
    assert removed.records == HUGE + 3 and removed.runs <= 6
    assert not minted


def test_a_batch_read_anew_is_settled_and_written_down_at_a_cost_per_run(tmp_path):
    """A hundred billion records in flight, the last one failed and the rest acked as a
    run: the state file and the watermark pay per run, not per record."""
    t = tracker()
    t.emit_range(TP, 10, 10 + HUGE, now_ms=0)
    last = 10 + HUGE - 1
    failed = completions(
        {
            "root": root(last),
            "status": FAILED,
            "topic": TP[0],
            "partition": TP[1],
            "offset": last,
            "attempt": 0,
        }
    )
    t.complete(failed, 1)
    state = SourceState(str(tmp_path))
    state.write(1, t)
    assert os.path.getsize(state.path(1)) < 5_000
    assert state.read(1).flying.records == HUGE - 1
    t.complete(run_of(10, last), 2)
    assert not t.in_flight and t.counts["acked"] == HUGE - 1
    assert t.watermarks() == {TP: last} and scheduled(t) == {(TP, last): (1, 1 + 100)}


def alive_at(offset, attempt=0, minted_for=None):
    """The acker's alive notice for the record at ``offset``, naming its coordinates."""
    return completions(
        {
            "root": root(offset if minted_for is None else minted_for, attempt),
            "status": ALIVE,
            "topic": TP[0],
            "partition": TP[1],
            "offset": offset,
            "attempt": attempt,
        }
    )


def test_a_reset_named_by_coordinates_restarts_one_record_of_a_run_without_ids():
    """Storm's resetTimeout on one record of a hundred billion read anew: found by its
    coordinates, it is cut out of its run, which stays runs (minting every id in flight
    could not even be held in memory)."""
    t = tracker(timeout=20_000)
    t.emit_range(TP, 10, 10 + HUGE, now_ms=0)
    middle = 10 + HUGE // 2
    t.complete(alive_at(middle), 9_000)
    assert t.in_flight == HUGE and t.flights.flying().runs == 3


def test_a_reset_named_by_coordinates_restarts_that_record_timeout_alone():
    t = tracker(timeout=20_000)
    t.emit_range(TP, 10, 110, now_ms=0)
    t.complete(alive_at(50), 9_000)
    t.complete(alive_at(60, minted_for=61), 9_000)  # not this source's id: ignored
    t.expire(25_000)
    assert in_flight_offsets(t) == [50]
    assert len(scheduled(t)) == 99 and (TP, 60) in scheduled(t)
    t.complete(alive_at(50), 28_000)
    t.expire(40_000)
    assert in_flight_offsets(t) == [50]


def test_offsets_done_above_a_stuck_record_are_kept_as_runs():
    """A record stuck at the watermark (a replay waiting for its backoff, a tree kept
    alive) while a hundred billion after it are acked: they are one run of done offsets
    (an entry each could not be held), the commit metadata names it, and the watermark
    jumps over it once the stuck record is done."""
    t = tracker()
    t.emit_range(TP, 10, 10 + HUGE, now_ms=0)
    t.complete(run_of(11, 10 + HUGE), 1)
    part = t.parts[TP]
    assert part.watermark == 10 and part.done.runs == 1 and len(part.done) == HUGE - 1
    assert json.loads(t.commit_metadata(TP)) == {"done": [[11, 10 + HUGE]]}
    t.complete(done((root(10), ACKED)), 2)
    assert t.watermarks() == {TP: 10 + HUGE} and not part.done.runs


def test_a_run_of_another_namespace_is_ignored():
    t = tracker()
    t.emit_range(TP, 10, 20, now_ms=0)
    t.complete(run_of(10, 20, minted_by="another-topology"), 1)
    assert t.in_flight == 10 and t.watermarks() == {TP: 10}


def test_a_run_does_not_ack_a_replay_in_flight_but_settles_its_record_late():
    """Offset 10 timed out and is replayed (attempt 1 in flight); the run of its first
    attempt comes after: the first attempt's tree was processed, so 10 is done."""
    t = tracker(timeout=5_000)
    t.emit_range(TP, 10, 13, now_ms=0)
    t.expire(5_000)
    assert [r[2] for r in t.due(5_100, budget=1).tolist()] == [10]
    t.complete(run_of(10, 13), 5_200)
    assert t.watermarks() == {TP: 13} and not t.in_flight and not scheduled(t)
    assert t.counts["acked"] == 3


def test_a_root_failed_in_the_same_read_as_its_run_is_replayed():
    t = tracker()
    t.emit_range(TP, 10, 14, now_ms=0)
    t.complete(pa.concat_tables([done((root(12), FAILED)), run_of(10, 14)]), 1)
    assert t.watermarks() == {TP: 12} and set(scheduled(t)) == {(TP, 12)}
    assert t.counts["acked"] == 3 and t.counts["failed"] == 1


def test_a_completion_naming_its_record_is_applied_without_minting_the_ids_in_flight(
    monkeypatch,
):
    """The driver hashes a root only when it is an exception: a fail that names its
    record's coordinates costs a few ids, not one per root in flight."""
    t = tracker()
    t.emit_range(TP, 10, 10_010, now_ms=0)
    minted = []
    real = ids.root_ids
    monkeypatch.setattr(
        ids,
        "root_ids",
        lambda *a: minted.append(len(a[3])) or real(*a),  # a[3]: the offsets
    )
    failed = acks_with_coordinates((500, 0)).set_column(1, "status", pa.array([FAILED]))
    t.complete(failed, 1)
    assert set(scheduled(t)) == {(TP, 500)} and t.in_flight == 9_999
    assert sum(minted) <= 4
    forged = failed.set_column(4, "offset", pa.array([501], pa.int64()))  # another's root
    t.complete(forged, 2)
    assert t.in_flight == 9_999 and set(scheduled(t)) == {(TP, 500)}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 200), st.integers(0, 12)), max_size=6),
        min_size=1,
        max_size=12,
    ),
    st.booleans(),
)
def test_done_runs_merge_as_a_set_of_offsets(batches, ascending):
    """Runs merged batch by batch (overlapping, touching, out of order, or each batch
    past the last as a source's batches come) hold the union of their offsets, as
    disjoint runs that do not touch."""
    done, model, base = DoneRuns(), set(), 0
    for batch in batches:
        if ascending:  # the usual case: each batch's runs from the last one's end on
            batch = [(base + start, length) for start, length in batch]
        starts = [start for start, _ in batch]
        ends = [start + length for start, length in batch]
        if ascending:
            base = max([base, *ends])
        done = done.merged(starts, ends)
        model |= {o for start, end in zip(starts, ends) for o in range(start, end)}
        assert done_offsets(done) == sorted(model) and len(done) == len(model)
        assert (done.ends > done.starts).all() and (done.starts[1:] > done.ends[:-1]).all()
        probe = np.arange(-1, base + 220)
        assert done.contains(probe).tolist() == [o in model for o in probe.tolist()]
