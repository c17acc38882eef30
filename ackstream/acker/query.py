"""The acker as a Spark streaming query: ``foreachBatch`` over the ack channel.

Each micro-batch brings the batch's ack records to the driver as one Arrow table,
checks them, and runs the vectorised ledger (:func:`~ackstream.acker.ledger.step`)
over them and the pending table the previous batch left; the table lives in
memory and in the checkpoint (:mod:`ackstream.acker.pending_store`). No shuffle,
no per-key Python call, no Spark state store: those cost about twenty times the
ledger itself when the acker was an ``applyInPandasWithState`` keyed by shard (see
docs/architecture.md). The ledger's time is the batch's timestamp from Spark's
offset log, so a batch run again after a crash yields the same completions.

A batch runs only when records arrive and expires overdue roots by their deadlines.
So an idle acker needs a record to wake it: the source writes a
:func:`~ackstream.records.tick` while one of its roots is past the message timeout
(Storm's tick tuple). The acker answers the batch's latest tick with a ``caught_up``
completion carrying the tick's time: it has read every ack record written before
it, so the source may time out what is still open then (and only then: an acker
that is down or behind never makes the source give up on trees it will settle).

Any process may write to the ack channel, so the acker trusts nothing: a record
it cannot use (a null root or value, unknown kind bits, an init without
coordinates, a message that is not ack records) becomes an ``invalid``
completion saying why, and a root whose init never comes an ``unknown`` one.
Both are logged by the acker, counted by ``ackstream status``, and ignored by
the source; neither stops the query.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from ackstream.acker.file_batch import batch_records
from ackstream.acker.ledger import notices, step
from ackstream.acker.pending_store import PendingStore
from ackstream.channels import check_reach
from ackstream.checkpoint_files import read_text, write_text
from ackstream.errors import OptionError
from ackstream.offset_log import batch_timestamp_ms, clear_unfinished_first_entry
from ackstream.records import (
    ACK_RECORD_SCHEMA,
    ALIVE,
    CAUGHT_UP,
    COMPLETION_SCHEMA,
    INIT,
    INVALID,
    KINDS,
    RESET,
    TICK,
    UNKNOWN,
    as_table,
    completion_table,
)
from ackstream.session import check_picklable, is_connect, master_of

__all__ = ["Acker", "checked", "start_acker"]

#: In the acker's checkpoint: the shard count it was started with.
SHARDS_FILE = "ackstream-shards.json"

log = logging.getLogger(__name__)


class Acker:
    """One acker's batches: records in, completions out, the pending table kept."""

    def __init__(self, checkpoint: str, message_timeout_ms: int):
        self.store = PendingStore(checkpoint)
        self.message_timeout_ms = message_timeout_ms

    def run(self, records: pa.Table, batch_id: int, now_ms: int) -> pa.Table:
        """The completions of batch ``batch_id`` of ack ``records`` at ``now_ms``."""
        usable, invalid = checked(records, now_ms)
        before = self.store.before(batch_id, now_ms)
        pending, done = step(before, usable, now_ms, self.message_timeout_ms)
        if usable.num_rows or len(done) or pending.epoch_ms != before.epoch_ms:
            self.store.save(batch_id, pending)
        alive = _alive(usable, pending, now_ms)
        done = as_table(done, COMPLETION_SCHEMA)
        echo = _caught_up(records)
        return pa.concat_tables([t for t in (invalid, alive, done, echo) if t is not None])


def _caught_up(records: pa.Table) -> pa.Table | None:
    """The echo of the batch's latest tick (its ``value`` is the source's time when it
    wrote it): every ack record written before that tick was in this batch or an
    earlier one, so the source may time out roots whose deadline is before it."""
    records = as_table(records, ACK_RECORD_SCHEMA)
    kind = pc.fill_null(records.column("kind"), 0)
    ticks = records.filter(pc.not_equal(pc.bit_wise_and(kind, TICK), 0))
    latest = pc.max(ticks.column("value")).as_py() if ticks.num_rows else None
    return None if latest is None else completion_table([0], CAUGHT_UP, completed_ms=latest)


def _alive(records: pa.Table, pending, now_ms: int) -> pa.Table | None:
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
    if usable.column("ts").null_count:
        usable = usable.set_column(
            usable.schema.get_field_index("ts"), "ts", pc.fill_null(usable.column("ts"), now_ms)
        )
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
    return pc.is_null(column).to_numpy(zero_copy_only=False)


def _why(record: dict) -> str:
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


def start_acker(
    spark,
    channel,
    *,
    checkpoint: str,
    ackers: int = 2,
    message_timeout_ms: int = 30_000,
    trigger_ms: int = 500,
    tick_ms: int | None = None,
    max_files_per_trigger: int | None = None,
    query_name: str | None = None,
):
    """Start the acker query: ack records from ``channel`` in, completions to ``channel`` out.

    Restarting with the same ``checkpoint`` resumes every pending root. ``ackers``
    (shards) and ``tick_ms`` are checked and kept for the callers that pass them; the
    ledger runs as one table on the driver, where one core handles over a million
    records a second.
    """
    check_reach(channel, master_of(spark))  # its file stream reads on the executors
    check_shard_count(spark, checkpoint, ackers)
    channel.prepare()
    records = channel.ack_stream(spark, max_files_per_trigger=max_files_per_trigger)
    acker = Acker(checkpoint, message_timeout_ms)
    reads_files = channel.ack_files  # its batches' files are named by Spark

    def write(batch: DataFrame, batch_id: int) -> None:

        now_ms = batch_timestamp_ms(batch.sparkSession, checkpoint, batch_id)
        records = batch_records(checkpoint, batch_id) if reads_files else None
        table = acker.run(batch.toArrow() if records is None else records, batch_id, now_ms)
        report(table, batch_id)
        channel.write_completions(table, batch_id)

    if is_connect(spark):  # the function is pickled to the server with the channel
        check_picklable(write, f"the acker of channel {channel!r}")
    writer = (
        records.writeStream.foreachBatch(write)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{trigger_ms} milliseconds")
    )
    if query_name:
        writer = writer.queryName(query_name)
    clear_unfinished_first_entry(spark, checkpoint)
    return writer.start()


def check_shard_count(spark, checkpoint: str, ackers: int) -> None:
    """Refuse a shard count other than the one ``checkpoint`` was started with: a pending
    root lives in the state of shard ``pmod(root, ackers)``, so another count would lose
    track of it (its acks would reach a shard that never saw its init). The count is
    kept in the checkpoint, read and written as Spark's checkpoint files are (see
    :mod:`ackstream.checkpoint_files`). Under Spark Connect a checkpoint at a URL that
    holds no count yet cannot be given one from here: it is started unchecked, with a
    warning."""
    if not isinstance(ackers, int) or ackers < 1:
        raise OptionError("ackers", ackers, "a whole number >= 1 (tracking=False runs no acker)")
    path = f"{checkpoint.rstrip('/')}/{SHARDS_FILE}"
    text = read_text(spark, path)
    if text is None:
        if not write_text(spark, path, json.dumps({"ackers": ackers})):
            log.warning(
                "the acker checkpoint %s keeps no shard count (a Spark Connect session "
                "cannot write one at a URL): restarting it with other than ackers=%d would "
                "lose its pending roots",
                checkpoint,
                ackers,
            )
        return
    started_with = json.loads(text)["ackers"]
    if started_with != ackers:
        raise OptionError(
            "ackers",
            ackers,
            f"{started_with}, the count the acker checkpoint "
            f"{checkpoint} was started with (its pending roots are kept by "
            "shard); use a new checkpoint to change it",
        )


def report(table: pa.Table, batch_id: int) -> None:
    """Log the ack records the acker could not use and the roots it never saw start."""
    status = table.column("status").to_pylist()
    for kind in (INVALID, UNKNOWN):
        count = status.count(kind)
        if count:
            first = status.index(kind)
            log.warning(
                "ackstream acker batch %d: %d %s record(s) ignored, e.g. root %s: %s",
                batch_id,
                count,
                kind,
                table.column("root")[first].as_py(),
                table.column("reason")[first].as_py() or "its init never came",
            )
