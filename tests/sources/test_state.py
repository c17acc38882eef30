"""The source's state files: offsets stay small whatever is in flight, and a restart from
any logged offset resumes the unfinished records exactly as they were then."""

import json
import os
import re

import numpy as np

from ackstream.sources.spans import EMPTY_SPANS, Spans
from ackstream.sources.spout import open_spout
from ackstream.sources.state import DEAD, SourceState, Uncharged, Unfinished, Waiting
from ackstream.sources.tracking import Tracker
from ackstream.sources.upstream import open_upstream
from ackstream.vocabulary import ids
from ackstream.vocabulary.batch_offset import BatchOffset
from ackstream.vocabulary.records import ACKED, FAILED, completion_table

from helpers import done_offsets, scheduled

TOPIC = "generator"


def report(channel, offset, status=ACKED, keep=lambda offs: offs % 7 == 0, attempt=0):
    """Report ``status`` for every offset the offset's batch read, except those ``keep``
    says stay in flight (by default every 7th)."""
    roots, parts, offsets = [], [], []
    for (_, p), (lo, hi) in offset.read.items():
        offs = np.arange(lo, hi)
        offs = offs[~keep(offs)]
        roots.append(ids.root_ids("spout", TOPIC, int(p), offs, attempt))
        parts.append(np.full(len(offs), int(p)))
        offsets.append(offs)
    if not roots:
        return
    channel.write_completions(
        completion_table(
            np.concatenate(roots),
            status,
            topic=TOPIC,
            partition=np.concatenate(parts),
            offset=np.concatenate(offsets),
            attempt=attempt,
        )
    )


def state_of(t) -> tuple:
    """Everything of a tracker a restart must give back: positions, roots in flight with
    their attempts, scheduled replays, done offsets above the watermarks."""
    rows = t.flights.rows
    parts = (t.partitions[p] for p in rows.part.tolist())
    flying = sorted(zip(parts, rows.offset.tolist(), rows.attempt.tolist()))
    done = {tp: done_offsets(part.done) for tp, part in t.parts.items()}
    return t.snapshot(), flying, dict(scheduled(t)), done


def restored(spout, offset) -> Tracker:
    """The tracker a new driver rebuilds from ``offset`` as Spark logged it (through JSON)
    and its state file (the spout then merges the group's newer commits into it)."""
    offset = BatchOffset.from_json(json.dumps(offset.to_json()))
    tracker = Tracker("spout", spout.config.retry, spout.config.source_timeout_ms)
    tracker.restore(offset.parts, 0, spout.state.read(offset.tracked.seq))
    return tracker


def restart(spout, offset, clock):
    """A new driver, rebuilt from ``offset`` as Spark logged it (through JSON)."""
    offset = BatchOffset.from_json(json.dumps(offset.to_json()))
    return open_spout(spout.config, open_upstream(spout.config), spout.channel, offset, clock)


def test_the_offset_grows_with_the_partitions_not_with_the_work_in_flight(make_spout, tmp_path):
    """100 partitions x 10,000 offsets, every 7th still in flight: under 100 kB (the issue's
    target; 1.37 MB when the offset carried the tracking state), and the same JSON, but
    for the values of its numbers, as with 10 offsets a partition."""
    sizes, shapes = {}, {}
    for records in (10, 10_000):
        spout, channel, _ = make_spout(
            channel=tmp_path / str(records),
            **{"generator.partitions": 100, "generator.count": 100 * (records + 100)},
        )
        first = spout.next_offset(max_rows=100 * records)
        report(channel, first)
        offset = spout.next_offset(max_rows=100)
        assert spout.tracker.in_flight == 100 * (len(range(0, records, 7)) + 1)
        logged = offset.to_json()
        sizes[records] = len(json.dumps(logged).encode())
        del logged["owner"]  # a random id
        shapes[records] = re.sub(r"\d+", "N", json.dumps(logged))
    assert sizes[10_000] < 100_000
    assert shapes[10_000] == shapes[10]


def test_a_restart_from_any_logged_offset_resumes_exactly_its_state(make_spout):
    """Records in flight at their attempts, scheduled replays and done offsets (more runs
    of them than the offset held before the state files) come back as they were when
    the offset was returned, though later offsets were planned since."""
    spout, channel, clock = make_spout(
        retryInitialDelay="1s", **{"generator.partitions": 3, "generator.count": 30_000}
    )
    logged = []
    offset = spout.next_offset(max_rows=3 * 7_000)
    logged.append((offset, state_of(spout.tracker)))
    report(channel, offset)  # 1,000 in flight a partition, 999 runs of done between
    report(channel, offset, FAILED, keep=lambda offs: (offs % 7 != 0) | (offs % 2 == 0))
    offset = spout.next_offset(max_rows=30)
    assert scheduled(spout.tracker)  # odd multiples of 7 wait for their replay
    logged.append((offset, state_of(spout.tracker)))
    clock.advance(1_000)
    offset = spout.next_offset(max_rows=30)
    assert offset.replays  # in flight at attempt 1 now
    logged.append((offset, state_of(spout.tracker)))
    report(channel, offset)
    spout.next_offset(max_rows=30)  # planned, never logged: the driver dies here
    for offset, state in logged:
        assert state_of(restored(spout, offset)) == state


def test_a_restart_plans_on_from_the_logged_offset_and_its_files_are_kept_until_committed(
    make_spout,
):
    spout, channel, clock = make_spout(**{"generator.count": 1_000})
    first = spout.next_offset(max_rows=10)
    lost = spout.next_offset(max_rows=10)  # returned, then the driver died before Spark logged it
    again = restart(spout, first, clock)
    try:
        second = again.next_offset(max_rows=20)
        assert second.tracked.seq == lost.tracked.seq and second.read != lost.read
        assert state_of(restored(again, second)) == state_of(again.tracker)  # the new file
        state = again.state
        assert os.path.exists(state.path(first.tracked.seq))
        again.on_spark_commit(second)  # Spark ran the batch that ends at second
        assert not os.path.exists(state.path(first.tracked.seq))
        assert os.path.exists(state.path(second.tracked.seq))
    finally:
        again.close()


def test_a_lost_state_file_costs_replays_never_a_record(make_spout, caplog):
    spout, channel, clock = make_spout(**{"generator.count": 1_000})
    offset = spout.next_offset(max_rows=20)
    report(channel, offset)
    offset = spout.next_offset(max_rows=20)
    before = state_of(spout.tracker)
    os.remove(spout.state.path(offset.tracked.seq))
    again = restart(spout, offset, clock)
    try:
        t = again.tracker
        assert "ackstream.stateDir" in caplog.text
        assert t.snapshot() == before[0]
        flying = state_of(t)[1]
        assert {(tp, o) for tp, o, _ in before[1]} <= {(tp, o) for tp, o, _ in flying}
        assert {a for *_, a in flying} == {0}
        for tp, part in t.parts.items():  # the rest is done: the group's commit says so
            mine = [o for p, o, _ in flying if p == tp] + done_offsets(part.done)
            assert sorted(mine) == list(range(part.watermark, part.end))
    finally:
        again.close()


class Recorded:
    """A tracker's side of the state files, as plain columns."""

    def __init__(self, unfinished):
        from ackstream.sources.in_flight import InFlight

        self.whole = unfinished
        self.flights = InFlight(lambda part, offset, attempt: offset)
        self.flights.add_unminted(*unfinished.flying.rows(), 0, 0)

    @property
    def in_flight(self):
        return len(self.flights)

    def unfinished(self, flying=True):
        return self.whole._replace(flying=self.flights.flying() if flying else EMPTY_SPANS)

    def changes(self):
        return self.flights.changes()

    def mark(self):
        self.flights.mark()


def flying_of(unfinished):
    return sorted(zip(*(c.tolist() for c in unfinished.flying.rows())))


def test_a_whole_state_file_costs_per_run_of_offsets_and_reads_back_every_record(tmp_path):
    n = 200_000
    part = np.concatenate([np.zeros(n, np.int64), np.ones(3, np.int64)])
    offset = np.concatenate([np.arange(5, 5 + n), [9, 10, 12]])
    attempt = np.concatenate([np.zeros(n, np.int64), [1, 1, 1]])
    waiting = Waiting(
        *(np.array(c, np.int64) for c in ([1, 0], [20, 4], [2, 0], [700, DEAD], [3, -1]))
    )
    uncharged = Uncharged(*(np.array(c, np.int64) for c in ([1], [20], [1])))
    unfinished = Unfinished(
        [("a", 0), ("a", 1)], Spans.of_rows(part, offset, attempt), waiting, uncharged
    )
    state = SourceState(str(tmp_path))
    state.write(1, Recorded(unfinished))
    assert os.path.getsize(state.path(1)) < 6_000  # 200,003 records, three runs: headers
    back = state.read(1)
    assert back.tps == unfinished.tps
    assert flying_of(back) == flying_of(unfinished)
    for name in ("waiting", "uncharged"):
        for a, b in zip(getattr(back, name), getattr(unfinished, name)):
            assert np.array_equal(a, b), name


def test_a_steady_batch_writes_its_changes_and_reads_back_whole_through_its_base(tmp_path):
    """A million records in flight, every 7th of 7 M: the first file is whole (a byte or
    so a record); the next ones hold only the changes since it, and each reads back as
    the whole state; the whole file is kept while a later one holds changes against it."""
    offsets = np.arange(7_000_000)[::7]
    part = offsets % 100
    empty = np.empty(0, np.int64)
    unfinished = Unfinished(
        [("a", p) for p in range(100)],
        Spans.of_rows(part, offsets, np.zeros(len(offsets), np.int64)),
        Waiting(empty, empty, empty, empty, empty),
        Uncharged(empty, empty, empty),
    )
    source, state = Recorded(unfinished), SourceState(str(tmp_path))
    state.write(1, source)
    assert os.path.getsize(state.path(1)) < 5_000_000
    expected = set(flying_of(unfinished))
    for seq in (2, 3):
        source.flights.add_unminted(np.arange(100), 7_000_000 + seq, 0, 0, 0)
        expected |= {(p, 7_000_000 + seq, 0) for p in range(100)}
        taken = source.flights.take_at(part[:50], offsets[:50], 0)  # acked at last
        expected -= set(zip(*(c.tolist() for c in taken[1:4])))
        state.write(seq, source)
        assert os.path.getsize(state.path(seq)) < 10_000
        assert set(flying_of(state.read(seq))) == expected
    state.forget_before(3)
    assert os.path.exists(state.path(1)) and not os.path.exists(state.path(2))
    assert set(flying_of(state.read(3))) == expected
