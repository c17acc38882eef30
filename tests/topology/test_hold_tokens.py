"""The token ledger: a batch's acked roots wait for the windows its rows went into,
come out when the last of them closes, and take the outcome of a window whose output
failed or was rejected; a batch run again starts from the same state."""

import pyarrow as pa

from ackstream.sources.offsets import PlannedRoots
from ackstream.topology.hold_tokens import HoldTokens, token_root
from ackstream.vocabulary.ranges import expand
from ackstream.vocabulary.records import (
    ACK_RECORD_SCHEMA,
    ACKED,
    COMPLETION_SCHEMA,
    FAIL,
    FAILED,
    REJECT,
    REJECTED,
)

STAGE = 2


def acked_runs(partition: int, lo: int, hi: int, now: int = 0) -> pa.Table:
    planned = PlannedRoots([("ns", "t", partition, lo, hi)], ACK_RECORD_SCHEMA.empty_table(), now)
    return planned.acked(now)


def failure(root: int, kind: int, reason: str) -> pa.Table:
    row = dict.fromkeys(ACK_RECORD_SCHEMA.names)
    row.update(root=root, value=0, kind=kind, reason=reason)
    return pa.Table.from_pylist([row], ACK_RECORD_SCHEMA)


def offsets(completions: pa.Table, status: str = ACKED) -> list[int]:
    rows = expand(completions).to_pylist()
    return sorted(r["offset"] for r in rows if r["status"] == status)


def batch(ledger, folder, batch_id, done, now, held=(), clock=None, rest=None, before=None):
    tokens = ledger.batch(folder, batch_id)
    tokens.hold(STAGE, held)
    tokens.release(STAGE, before, clock)
    tokens.take_outcomes(ACK_RECORD_SCHEMA.empty_table() if rest is None else rest)
    return tokens.completions(done, now)


def test_acked_roots_wait_for_their_windows_and_come_out_when_the_last_closes(tmp_path):
    """Batch 0 goes into windows ending at 1000 and 1500, batch 1 into 1500: nothing is
    reported until the clock passes 1500, then both batches' runs, acked, with the
    time they waited added to their latency."""
    ledger, folder = HoldTokens(), str(tmp_path)
    first, second = acked_runs(0, 0, 5, now=100), acked_runs(0, 5, 8, now=600)
    assert batch(ledger, folder, 0, first, 100, [1000, 1500]).num_rows == 0
    assert batch(ledger, folder, 1, second, 600, [1500], clock=600).num_rows == 0
    out = batch(ledger, folder, 2, COMPLETION_SCHEMA.empty_table(), 1200, clock=1200)
    assert out.num_rows == 0  # batch 0 still waits for 1500
    out = batch(ledger, folder, 3, COMPLETION_SCHEMA.empty_table(), 1600, clock=1600)
    assert offsets(out) == list(range(8))
    assert sorted(out.column("latency_ms").to_pylist()) == [1000, 1500]
    later = batch(ledger, folder, 4, COMPLETION_SCHEMA.empty_table(), 2000, clock=2000)
    assert later.num_rows == 0  # reported once


def test_a_failed_window_fails_every_batch_it_held_and_a_rejection_rejects(tmp_path):
    """A FAIL record of a window's token root fails each root of the batches in it, one
    row per root, with the reason; a REJECT rejects them; the record leaves the rest."""
    ledger, folder = HoldTokens(), str(tmp_path)
    batch(ledger, folder, 0, acked_runs(0, 0, 3), 0, [1000])
    batch(ledger, folder, 1, acked_runs(1, 0, 2), 0, [2000])
    rest = pa.concat_tables(
        [failure(token_root(STAGE, 1000), FAIL, "bad sum"), failure(7, FAIL, "other")]
    )
    tokens = ledger.batch(folder, 2)
    tokens.release(STAGE, None, 2000)
    left = tokens.take_outcomes(rest)
    assert left.column("root").to_pylist() == [7]
    out = tokens.completions(COMPLETION_SCHEMA.empty_table(), 2100)
    assert offsets(out, FAILED) == [0, 1, 2] and offsets(out, ACKED) == [0, 1]
    reasons = {r["reason"] for r in expand(out).to_pylist() if r["status"] == FAILED}
    assert reasons == {"a window that held it failed: bad sum"}
    batch(ledger, folder, 3, acked_runs(0, 3, 4), 0, [3000])
    tokens = ledger.batch(folder, 4)
    tokens.release(STAGE, None, 3000)
    tokens.take_outcomes(failure(token_root(STAGE, 3000), REJECT, "negative"))
    out = tokens.completions(COMPLETION_SCHEMA.empty_table(), 3100)
    assert offsets(out, REJECTED) == [3]


def test_failed_roots_of_a_holding_batch_are_reported_at_once():
    """Only the acked completions wait: a root the batch failed is reported by it."""
    ledger = HoldTokens()
    row = dict.fromkeys(COMPLETION_SCHEMA.names)
    row.update(root=5, status=FAILED, reason="x")
    failed = pa.Table.from_pylist([row], COMPLETION_SCHEMA)
    out = batch(ledger, None, 0, pa.concat_tables([acked_runs(0, 0, 4), failed]), 0, [1000])
    assert out.column("status").to_pylist() == [FAILED]


def test_a_batch_run_again_waits_for_and_releases_the_same_tokens(tmp_path):
    """Spark runs batch 1 again after a crash: it starts from batch 0's state, so the
    release comes out again, whole; a fresh ledger over the same folder agrees."""
    folder = str(tmp_path)
    batch(HoldTokens(), folder, 0, acked_runs(0, 0, 4), 0, [1000])
    first = batch(HoldTokens(), folder, 1, COMPLETION_SCHEMA.empty_table(), 1000, clock=1000)
    again = batch(HoldTokens(), folder, 1, COMPLETION_SCHEMA.empty_table(), 1000, clock=1000)
    assert offsets(first) == offsets(again) == [0, 1, 2, 3]
    after = batch(HoldTokens(), folder, 2, COMPLETION_SCHEMA.empty_table(), 1500, clock=1500)
    assert after.num_rows == 0


def test_a_batch_whose_windows_close_in_it_reports_at_once():
    """Event time: rows behind the watermark's new position go into windows the batch
    itself closes: nothing waits."""
    out = batch(HoldTokens(), None, 0, acked_runs(0, 0, 2), 0, [1000], clock=1000)
    assert offsets(out) == [0, 1]


def test_a_window_closed_by_a_batch_that_failed_as_a_whole_fails_the_batches_it_held():
    """Batch 1 closed the window ending at 1000 (its store let it go) but failed as a
    whole, so it reported nothing; batch 2 finds the clock already past 1000: the
    window's rows were never written, and batch 0's roots fail."""
    ledger = HoldTokens()
    batch(ledger, None, 0, acked_runs(0, 0, 2), 0, [1000])
    out = batch(ledger, None, 2, COMPLETION_SCHEMA.empty_table(), 1500, before=1100, clock=1500)
    assert offsets(out, FAILED) == [0, 1]
    assert "not written" in expand(out).column("reason")[0].as_py()
