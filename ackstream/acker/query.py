"""The acker as a Spark stateful streaming query.

Ack records are routed to one of ``ackers`` shards by ``pmod(root, ackers)`` (as
Storm routes a root to its acker task) and each shard's pending table lives in
that shard's ``GroupState``. Keying by shard rather than by root is what makes
this fast: Spark calls Python once per key per batch (1-2 ms), so per-root keys
cap the acker at about a thousand roots a second, while a few shard keys hand
the vectorised ledger whole columns.

A batch runs only when records arrive (Spark's no-data batches are off for this
query: for a processing-time timeout Spark would run one every trigger, each
costing about a whole batch of CPU, which the topology then lacks). In a batch,
a shard whose processing-time timeout has passed is called even without records,
and expires its overdue roots by their deadlines. So an idle acker needs a record
to wake it: the source writes a :func:`~ackstream.records.tick` while one of its
roots is past the message timeout (Storm's tick tuple), and the acker drops it.

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
import os
from collections.abc import Iterator
from urllib.parse import urlparse

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from ackstream.acker.ledger import Pending, step
from ackstream.channels import check_reach
from ackstream.config import default_tick_ms
from ackstream.errors import OptionError
from ackstream.files import write_atomically
from ackstream.records import (
    ALIVE,
    COMPLETION_DDL,
    INIT,
    INVALID,
    KINDS,
    RESET,
    TICK,
    UNKNOWN,
    completion_table,
)
from ackstream.session import check_picklable, is_connect, master_of

__all__ = ["STATE_DDL", "completions", "shard_function", "start_acker"]

#: A shard's state: the ledger's epoch, topic names and packed pending table.
STATE_DDL = "epoch_ms long, topics string, pending binary"

SHARD_COLUMN = "_shard"
NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"
#: In the acker's checkpoint: the shard count it was started with.
SHARDS_FILE = "ackstream-shards.json"
_INVALID, _NO_ROOT = "_invalid", "_no_root"
_NULLABLE_INTS = {pa.int32(): pd.Int32Dtype(), pa.int64(): pd.Int64Dtype()}

log = logging.getLogger(__name__)


def shard_function(message_timeout_ms: int, tick_ms: int | None = None):
    """The per-shard function for ``applyInPandasWithState``."""
    tick_ms = tick_ms or default_tick_ms(message_timeout_ms)

    def run_shard(key, frames: Iterator[pd.DataFrame], state: GroupState):
        now_ms = state.getCurrentProcessingTimeMs()
        pending = Pending.from_state(state.get) if state.exists else Pending.empty(now_ms)
        records = None
        if not state.hasTimedOut:
            chunks = [f for f in frames if len(f)]
            if chunks:
                records = chunks[0] if len(chunks) == 1 else pd.concat(chunks, ignore_index=True)
        invalid = None
        if records is not None and records[_INVALID].notna().any():
            bad = records[_INVALID].notna()
            invalid, records = _invalid_completions(records[bad], now_ms), records[~bad]
        pending, done = step(pending, records, now_ms, message_timeout_ms)
        alive = _alive(records, pending, now_ms)
        if len(pending):
            state.update(pending.to_state())
            state.setTimeoutDuration(tick_ms)
        else:
            state.remove()
        if invalid is not None:
            yield invalid
        if alive is not None:
            yield alive
        if len(done):
            yield done

    return run_shard


def _alive(records: pd.DataFrame | None, pending: Pending, now_ms: int) -> pd.DataFrame | None:
    """``alive`` notices for the roots a reset record of this batch kept pending, so that
    the source restarts its own timeout for them too (Storm's resetTimeout)."""
    if records is None or not len(pending):
        return None
    reset = records["root"].to_numpy()[(records["kind"].to_numpy() & RESET) != 0]
    roots = np.intersect1d(reset, pending.table["root"])
    if not len(roots):
        return None
    return completion_table(roots, ALIVE, completed_ms=now_ms).to_pandas(
        types_mapper=_NULLABLE_INTS.get
    )


def _invalid_completions(rows: pd.DataFrame, now_ms: int) -> pd.DataFrame:
    root = pa.array(rows["root"].to_numpy(), pa.int64(), mask=rows[_NO_ROOT].to_numpy(bool))
    table = completion_table(
        root, INVALID, completed_ms=now_ms, reason=rows[_INVALID].to_numpy(object)
    )
    return table.to_pandas(types_mapper=_NULLABLE_INTS.get)  # ids never pass via float


def checked(records: DataFrame) -> DataFrame:
    """``records`` with ``_invalid`` (why the acker cannot use a record; null if it can)
    and nulls replaced, so that every id column reaches pandas as int64: one null
    would turn a whole batch's ids into float64 and break them."""
    root, value, kind, reason = F.col("root"), F.col("value"), F.col("kind"), F.col("reason")
    no_coords = F.col("topic").isNull() | F.col("partition").isNull() | F.col("offset").isNull()
    why = (
        F.when(root.isNull(), F.lit("root is null"))
        .when(value.isNull(), F.lit("value is null"))
        .when(kind.isNull(), F.lit("kind is null"))
        .when(
            (kind < 0) | (kind.bitwiseAND(F.lit(~KINDS & 0x7F)) != 0),
            F.concat(F.lit("kind "), kind.cast("string"), F.lit(" has unknown bits")),
        )
        .when(
            (kind.bitwiseAND(F.lit(INIT)) != 0) & no_coords,
            F.lit("init record without topic, partition or offset"),
        )
    )
    now = F.unix_millis(F.current_timestamp())
    return records.select(
        F.coalesce(root, F.lit(0).cast("long")).alias("root"),
        F.coalesce(value, F.lit(0).cast("long")).alias("value"),
        F.coalesce(kind, F.lit(0).cast("byte")).alias("kind"),
        "topic",
        F.coalesce("partition", F.lit(0)).alias("partition"),
        F.coalesce("offset", F.lit(0).cast("long")).alias("offset"),
        F.coalesce("attempt", F.lit(0)).alias("attempt"),
        F.coalesce("ts", now).alias("ts"),
        reason,
        F.when(why.isNotNull() & reason.isNotNull(), F.concat(why, F.lit(": "), reason))
        .otherwise(why)
        .alias(_INVALID),
        root.isNull().alias(_NO_ROOT),
    )


def completions(
    records: DataFrame, *, ackers: int, message_timeout_ms: int, tick_ms: int | None = None
) -> DataFrame:
    """The completion stream of a streaming DataFrame of ack records (``ACK_RECORD_DDL``).

    ``ackers`` fixes the shard count for the life of the checkpoint: the pending
    roots of a shard live under its key.
    """
    return (
        checked(records)
        .where(F.col(_INVALID).isNotNull() | (F.col("kind").bitwiseAND(F.lit(TICK)) == 0))
        .withColumn(SHARD_COLUMN, F.pmod(F.col("root"), F.lit(ackers).cast("long")))
        .groupBy(SHARD_COLUMN)
        .applyInPandasWithState(
            shard_function(message_timeout_ms, tick_ms),
            outputStructType=COMPLETION_DDL,
            stateStructType=STATE_DDL,
            outputMode="append",
            timeoutConf=GroupStateTimeout.ProcessingTimeTimeout,
        )
    )


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

    Restarting with the same ``checkpoint`` resumes every shard's pending roots; it
    must keep the shard count (``ackers``), which is checked.
    """
    check_reach(channel, master_of(spark))  # its file stream reads on the executors
    check_shard_count(checkpoint, ackers)
    channel.prepare()
    records = channel.ack_stream(spark, max_files_per_trigger=max_files_per_trigger)
    done = completions(
        records, ackers=ackers, message_timeout_ms=message_timeout_ms, tick_ms=tick_ms
    )

    def write(batch: DataFrame, batch_id: int) -> None:
        table = batch.toArrow()
        report(table, batch_id)
        channel.write_completions(table, batch_id)

    if is_connect(spark):  # the function is pickled to the server with the channel
        check_picklable(write, f"the acker of channel {channel!r}")
    writer = (
        done.writeStream.foreachBatch(write)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{trigger_ms} milliseconds")
    )
    if query_name:
        writer = writer.queryName(query_name)
    # read when the query starts (see the module doc); the session's value is put back
    previous = spark.conf.get(NO_DATA_BATCHES, None)
    spark.conf.set(NO_DATA_BATCHES, "false")
    try:
        return writer.start()
    finally:
        if previous is None:
            spark.conf.unset(NO_DATA_BATCHES)
        else:
            spark.conf.set(NO_DATA_BATCHES, previous)


def check_shard_count(checkpoint: str, ackers: int) -> None:
    """Refuse a shard count other than the one ``checkpoint`` was started with: a pending
    root lives in the state of shard ``pmod(root, ackers)``, so another count would lose
    track of it (its acks would reach a shard that never saw its init). A checkpoint on
    a file system URL (``hdfs:``, ``s3a:``...) is not checked."""
    if not isinstance(ackers, int) or ackers < 1:
        raise OptionError("ackers", ackers, "a whole number >= 1 (tracking=False runs no acker)")
    if urlparse(checkpoint).scheme:
        return
    path = os.path.join(checkpoint, SHARDS_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            started_with = json.load(f)["ackers"]
    except FileNotFoundError:
        os.makedirs(checkpoint, exist_ok=True)
        write_atomically(path, lambda hidden: _write_json(hidden, {"ackers": ackers}))
        return
    if started_with != ackers:
        raise OptionError(
            "ackers",
            ackers,
            f"{started_with}, the count the acker checkpoint "
            f"{checkpoint} was started with (its pending roots are kept by "
            "shard); use a new checkpoint to change it",
        )


def _write_json(path: str, value) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f)


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
