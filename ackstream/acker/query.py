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
"""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from ackstream.acker.ledger import Pending, step
from ackstream.records import COMPLETION_DDL, TICK

__all__ = ["STATE_DDL", "completions", "shard_function", "start_acker"]

#: A shard's state: the ledger's epoch, topic names and packed pending table.
STATE_DDL = "epoch_ms long, topics string, pending binary"

SHARD_COLUMN = "_shard"
NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"


def default_tick_ms(message_timeout_ms: int) -> int:
    """How often an idle shard wakes up to expire roots: a quarter of the timeout, at most 1 s."""
    return max(10, min(1000, message_timeout_ms // 4))


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
        pending, done = step(pending, records, now_ms, message_timeout_ms)
        if len(pending):
            state.update(pending.to_state())
            state.setTimeoutDuration(tick_ms)
        else:
            state.remove()
        if len(done):
            yield done

    return run_shard


def completions(
    records: DataFrame, *, ackers: int, message_timeout_ms: int, tick_ms: int | None = None
) -> DataFrame:
    """The completion stream of a streaming DataFrame of ack records (``ACK_RECORD_DDL``).

    ``ackers`` fixes the shard count for the life of the checkpoint: the pending
    roots of a shard live under its key.
    """
    return (
        records.where(F.col("kind").bitwiseAND(F.lit(TICK)) == 0)
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

    Restarting with the same ``checkpoint`` resumes every shard's pending roots.
    """
    channel.prepare()
    records = channel.ack_stream(spark, max_files_per_trigger=max_files_per_trigger)
    done = completions(
        records, ackers=ackers, message_timeout_ms=message_timeout_ms, tick_ms=tick_ms
    )
    writer = (
        done.writeStream.foreachBatch(channel.write_completions)
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
