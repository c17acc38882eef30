"""The acker's pending table saved by batch id in its checkpoint."""

import os

import numpy as np
import pyarrow as pa

from ackstream.acker.ledger import Pending, step
from ackstream.acker.pending_store import FOLDER, PendingStore
from ackstream.testing import ack_records, fail, init
from ackstream.vocabulary.records import ACK_RECORD_SCHEMA, FAILED, INIT

TIMEOUT = 60_000


def pending_roots(n, first=0):
    """A table of ``n`` pending roots: an init each, with a value that keeps it open."""
    roots = np.arange(first, first + n, dtype=np.int64)
    inits = pa.table(
        {
            "root": roots,
            "value": roots * 7 + 1,
            "kind": pa.array(np.full(n, INIT), pa.int8()),
            "topic": pa.array(["events"] * n),
            "partition": pa.array(roots % 4, pa.int32()),
            "offset": roots,
            "attempt": pa.array(np.zeros(n), pa.int32()),
            "ts": np.full(n, 1_000, np.int64),
            "reason": pa.nulls(n, pa.string()),
        },
        schema=ACK_RECORD_SCHEMA,
    )
    pending, done = step(Pending.empty(1_000), inits, 1_000, TIMEOUT)
    assert len(done) == 0 and len(pending) == n
    return pending


def test_a_pending_root_costs_at_most_40_bytes_in_the_saved_state(tmp_path):
    sizes = {n: PendingStore(str(tmp_path / str(n))).save(0, pending_roots(n)) for n in (1, 10_001)}
    per_root = (sizes[10_001] - sizes[1]) / 10_000  # what one more pending root adds
    assert per_root <= 40, f"{per_root} bytes per pending root"
    assert sizes[1] < 2_000  # the fixed part: one file's framing and the topic names


def test_a_batch_starts_from_the_newest_table_saved_before_it(tmp_path):
    store = PendingStore(str(tmp_path))
    for batch_id, n in ((0, 3), (1, 5), (4, 7)):
        store.save(batch_id, pending_roots(n))
    assert sorted(os.listdir(tmp_path / FOLDER)) == ["1", "4"]  # the two newest
    restarted = PendingStore(str(tmp_path))
    assert len(restarted.before(5, 0)) == 7
    assert len(restarted.before(4, 0)) == 5  # batch 4 run again: not its own table
    assert len(PendingStore(str(tmp_path / "new")).before(0, 123)) == 0
    saved = restarted.before(5, 0)
    assert saved.values() == pending_roots(7).values() and saved.topics == ("events",)


def test_a_restored_table_keeps_the_reason_of_a_fail_that_came_before_its_init(tmp_path):
    before, _ = step(
        Pending.empty(1_000), ack_records([fail(5, reason="bolt: bad")]), 1_000, TIMEOUT
    )
    PendingStore(str(tmp_path)).save(0, before)
    restored = PendingStore(str(tmp_path)).before(1, 2_000)
    _, done = step(restored, ack_records([init(5, 1, offset=4)]), 2_000, TIMEOUT)
    assert done[["root", "status", "offset", "reason"]].values.tolist() == [
        [5, FAILED, 4, "bolt: bad"]
    ]


def test_a_table_saved_before_reasons_were_kept_restores_with_none(tmp_path):
    epoch_ms, topics, blob = pending_roots(3).to_state()
    old = pa.table({"epoch_ms": [epoch_ms], "topics": [topics], "pending": [blob]})
    PendingStore(str(tmp_path)).files.write(0, old)
    restored = PendingStore(str(tmp_path)).before(1, 0)
    assert restored.values() == pending_roots(3).values() and restored.reasons == {}


def test_a_store_that_is_not_the_only_writer_starts_from_what_another_process_saved(tmp_path):
    """A shard runs in whichever executor process reads it: a process that ran batch 1
    and then batch 3 must start 3 from what another process saved at batch 2, not from
    the table it kept in memory."""
    first = PendingStore(str(tmp_path), only_writer=False)
    first.save(1, pending_roots(3))
    other = PendingStore(str(tmp_path), only_writer=False)
    assert len(other.before(2, 0)) == 3
    other.save(2, pending_roots(5))
    assert len(first.before(3, 0)) == 5
    assert len(other.before(3, 0)) == 5  # its own table, still the newest
    trusting = PendingStore(str(tmp_path / "one"))
    trusting.save(1, pending_roots(3))
    PendingStore(str(tmp_path / "one")).save(2, pending_roots(5))
    assert len(trusting.before(3, 0)) == 3  # why a shard's store must not trust its copy
