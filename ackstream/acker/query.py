"""The acker as a Spark stateful streaming query.

Ack records are routed to one of ``ackers`` shards by ``pmod(root, ackers)`` (as
Storm routes a root to its acker task) and each shard's pending table lives in
that shard's ``GroupState``. Keying by shard rather than by root is what makes
this fast: Spark calls Python once per key per batch (1-2 ms), so per-root keys
cap the acker at about a thousand roots a second, while a few shard keys hand
the vectorised ledger whole columns.

The shard's processing-time timeout is the tick: a shard that gets no records
in a batch is still called, and expires its overdue roots by their deadlines.
"""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from ackstream.acker.ledger import Pending, step
from ackstream.records import COMPLETION_DDL

__all__ = ["STATE_DDL", "completions", "shard_function", "start_acker"]

#: A shard's state: the ledger's epoch, topic names and packed pending table.
STATE_DDL = "epoch_ms long, topics string, pending binary"

SHARD_COLUMN = "_shard"


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
        records.withColumn(SHARD_COLUMN, F.pmod(F.col("root"), F.lit(ackers).cast("long")))
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
    return writer.start()
