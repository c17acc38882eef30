"""One batch of an acker: ack records in, completions out, the pending table kept.

The same step runs on the driver (the acker query of a channel whose batches the
driver reads, :mod:`ackstream.acker.query`) and in the read task of one shard
(:mod:`ackstream.acker.shards`). The ledger's time is passed in, so a batch run again
after a crash yields the same completions.

Any process may write to the ack channel, so the acker trusts nothing: a record
it cannot use (a null root or value, unknown kind bits, an init without
coordinates, a message that is not ack records) becomes an ``invalid``
completion saying why, and a root whose init never comes an ``unknown`` one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ackstream.acker.ledger import Pending, notices, step
from ackstream.acker.pending_store import PendingStore
from ackstream.vocabulary.records import (
    ACK_RECORD_SCHEMA,
    ALIVE,
    CAUGHT_UP,
    COMPLETION_SCHEMA,
    INIT,
    INVALID,
    KINDS,
    RESET,
    TICK,
    as_table,
    completion_table,
    timed,
)

__all__ = ["Acker", "caught_up", "checked", "latest_tick_ms"]


class Acker:
    """One acker's batches: records in, completions out, the pending table kept.
    ``only_writer``: whether this object is the only one that runs the checkpoint's
    batches (see :class:`~ackstream.acker.pending_store.PendingStore`)."""

    def __init__(self, checkpoint: str, message_timeout_ms: int, *, only_writer: bool = True):
        self.store = PendingStore(checkpoint, only_writer=only_writer)
        self.message_timeout_ms = message_timeout_ms
        self.pending_roots = 0  # after the last batch

    def run(self, records: pa.Table, batch_id: int, now_ms: int) -> pa.Table:
        """The completions of batch ``batch_id`` of ack ``records`` at ``now_ms``, the
        ``caught_up`` echo of the batch's latest tick left out (see :func:`caught_up`)."""
        usable, invalid = checked(records, now_ms)
        before = self.store.before(batch_id, now_ms)
        pending, done = step(before, usable, now_ms, self.message_timeout_ms)
        if usable.num_rows or len(done) or pending.epoch_ms != before.epoch_ms:
            self.store.save(batch_id, pending)
        self.pending_roots = len(pending)
        alive = _alive(usable, pending, now_ms)
        done = as_table(done, COMPLETION_SCHEMA)
        return pa.concat_tables([t for t in (invalid, alive, done) if t is not None])


def latest_tick_ms(records: pa.Table) -> int | None:
    """The time of the batch's latest tick (its ``value`` is the source's time when it
    wrote it), None without one."""
    records = as_table(records, ACK_RECORD_SCHEMA)
    kind = pc.fill_null(records.column("kind"), 0)
    ticks = records.filter(pc.not_equal(pc.bit_wise_and(kind, TICK), 0))
    return pc.max(ticks.column("value")).as_py() if ticks.num_rows else None


def caught_up(tick_ms: int | None) -> pa.Table | None:
    """The echo of the batch's latest tick, written once every completion of the batch
    is: every ack record written before that tick was in this batch or an earlier one,
    so the source may time out roots whose deadline is before it."""
    return None if tick_ms is None else completion_table([0], CAUGHT_UP, completed_ms=tick_ms)


def _alive(records: pa.Table, pending: Pending, now_ms: int) -> pa.Table | None:
    """``alive`` notices for the roots a reset record of this batch kept pending, so that
    the source restarts its own timeout for them too (Storm's resetTimeout); each names
    its record's coordinates, which the source finds it by without minting ids."""
    if not records.num_rows or not len(pending):
        return None
    kind = records.column("kind").to_numpy()
    reset = records.column("root").to_numpy()[(kind & RESET) != 0]
    if not len(reset):
        return None
    alive = notices(pending, reset, ALIVE, now_ms)
    return as_table(alive, COMPLETION_SCHEMA) if len(alive) else None


def checked(records: pa.Table, now_ms: int) -> tuple[pa.Table, pa.Table | None]:
    """Split ack ``records`` into those the ledger can use (ticks dropped, a missing ts
    set to ``now_ms``) and ``invalid`` completions for the rest, saying why each one
    is unusable (None if all are usable)."""
    records = as_table(records, ACK_RECORD_SCHEMA)
    kind = pc.fill_null(records.column("kind"), 0).to_numpy()
    is_init = (kind & INIT) != 0
    bad = (
        _nulls(records, "root")
        | _nulls(records, "value")
        | _nulls(records, "kind")
        | (kind < 0)
        | ((kind & ~KINDS & 0x7F) != 0)
        | (is_init & (_nulls(records, "topic") | _nulls(records, "partition")))
        | (is_init & _nulls(records, "offset"))
    )
    keep = ~bad & ((kind & TICK) == 0)
    usable = records if keep.all() else records.filter(pa.array(keep))
    usable = timed(usable, now_ms)
    if not bad.any():
        return usable, None
    rows = records.filter(pa.array(bad)).to_pylist()  # few: Python is fine here
    return usable, completion_table(
        pa.array([r["root"] for r in rows], pa.int64()),
        INVALID,
        completed_ms=now_ms,
        reason=[_why(r) for r in rows],
    )


def _nulls(records: pa.Table, name: str) -> np.ndarray:
    column = records.column(name)
    if not column.null_count:
        return np.zeros(records.num_rows, bool)
    nulls: np.ndarray = pc.is_null(column).to_numpy(zero_copy_only=False)
    return nulls


def _why(record: dict[str, Any]) -> str:
    """Why the acker cannot use ``record``, with the record's own reason if it has one."""
    kind = record["kind"]
    if record["root"] is None:
        why = "root is null"
    elif record["value"] is None:
        why = "value is null"
    elif kind is None:
        why = "kind is null"
    elif kind < 0 or kind & ~KINDS & 0x7F:
        why = f"kind {kind} has unknown bits"
    else:
        why = "init record without topic, partition or offset"
    return f"{why}: {record['reason']}" if record["reason"] is not None else why
