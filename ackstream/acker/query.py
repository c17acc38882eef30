"""The acker as a Spark streaming query: ``foreachBatch`` over the ack channel.

Where the ledger runs depends on the channel, which says so
(:attr:`~ackstream.channels.base.Channel.ack_shards`):

- a channel that keeps each root's ack records in one partition of its acks (the
  Kafka channel) has them read by one Spark task per partition, which runs that
  shard's ledger where it read them (:mod:`ackstream.acker.shards`); the driver gets
  one summary row per shard;
- otherwise (the local channel) each micro-batch brings the batch's ack records to
  the driver as one Arrow table, and one ledger runs over them there.

Either way a batch (:class:`~ackstream.acker.batch.Acker`) checks its records and runs
the vectorised ledger (:func:`~ackstream.acker.ledger.step`) over them and the
pending table the previous batch left; the table lives in memory and in the
checkpoint (:mod:`ackstream.acker.pending_store`). There is no shuffle, no per-key
Python call and no Spark state store: each costs more than the vectorised ledger it
would feed (docs/benchmarks.md has the measure). The ledger's time is fixed when
Spark plans the batch, so a batch run again after a crash yields the same
completions.

A batch runs only when records arrive and expires overdue roots by their deadlines.
So an idle acker needs a record to wake it: the source writes a
:func:`~ackstream.vocabulary.records.tick` while one of its roots is past the message timeout
(Storm's tick tuple). The acker answers the batch's latest tick with a ``caught_up``
completion carrying the tick's time, written after every other completion of the
batch: it has read every ack record written before the tick, so the source may time
out what is still open then (and only then: an acker that is down or behind never
makes the source give up on trees it will settle).

Records the acker cannot use become ``invalid`` completions and roots whose init
never comes ``unknown`` ones (see :mod:`ackstream.acker.batch`); both are logged by
the acker, counted by ``ackstream status``, and ignored by the source; neither
stops the query.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from ackstream.acker.batch import Acker, caught_up, latest_tick_ms
from ackstream.acker.file_batch import batch_records
from ackstream.acker.shards import ShardLedger
from ackstream.channels import check_reach
from ackstream.channels.base import Channel
from ackstream.errors import OptionError
from ackstream.spark.session import check_picklable, is_connect, master_of
from ackstream.storage.checkpoint_files import read_text, write_text
from ackstream.storage.offset_log import batch_timestamp_ms, clear_unfinished_first_entry
from ackstream.vocabulary.records import INVALID, UNKNOWN

__all__ = ["check_shard_count", "start_acker"]

#: In the acker's checkpoint: the shard count it was started with.
SHARDS_FILE = "ackstream-shards.json"

log = logging.getLogger(__name__)


def start_acker(
    spark: SparkSession,
    channel: Channel,
    *,
    checkpoint: str,
    ackers: int = 2,
    message_timeout_ms: int = 30_000,
    trigger_ms: int = 500,
    max_files_per_trigger: int | None = None,
    query_name: str | None = None,
) -> StreamingQuery:
    """Start the acker query: ack records from ``channel`` in, completions to ``channel`` out.

    Restarting with the same ``checkpoint`` resumes every pending root. ``ackers`` is
    the shard count: a channel that keeps its acks by shard must have as many
    partitions, one ledger each, on the executors; otherwise the shards are kept
    together by one ledger on the driver, where one core handles over a million
    records a second.
    """
    check_reach(channel, master_of(spark))  # its file stream reads on the executors
    check_shard_count(spark, checkpoint, ackers)
    channel.prepare()
    shards = channel.ack_shards
    if shards is not None:
        ledger = ShardLedger(channel, checkpoint, message_timeout_ms)
        write = _writing_shard_summaries(channel)
        stream = shards.shard_stream(spark, ledger, ackers)
    else:
        write = _running_the_ledger(channel, checkpoint, message_timeout_ms)
        stream = channel.ack_stream(spark, max_files_per_trigger=max_files_per_trigger)
    if is_connect(spark):  # the function is pickled to the server with the channel
        check_picklable(write, f"the acker of channel {channel!r}")
    writer = (
        stream.writeStream.foreachBatch(write)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{trigger_ms} milliseconds")
    )
    if query_name:
        writer = writer.queryName(query_name)
    clear_unfinished_first_entry(spark, checkpoint)
    if is_connect(spark):  # the server's scheduler: no pool can be set from here
        return writer.start()
    with scheduler_pool(spark, ACKER_POOL):
        return writer.start()


#: The Spark scheduler pool of the acker query's jobs. With ``spark.scheduler.mode=FAIR``
#: (:func:`~ackstream.local_session` sets it) the acker's tasks take the next free core
#: while a topology's batch runs a long job in the default pool; first in, first out
#: (Spark's default), they wait for that whole job, and trees that should time out in
#: the acker time out at the source instead.
ACKER_POOL = "ackstream-acker"


@contextlib.contextmanager
def scheduler_pool(spark: SparkSession, pool: str) -> Iterator[None]:
    """Jobs of queries started within run in ``pool``: a query's thread keeps the local
    properties of the thread that started it, which gets its own back afterwards."""
    context = spark.sparkContext
    before = context.getLocalProperty("spark.scheduler.pool")
    context.setLocalProperty("spark.scheduler.pool", pool)
    try:
        yield
    finally:
        context.setLocalProperty("spark.scheduler.pool", before)  # type: ignore[arg-type]


#: What ``foreachBatch`` runs on each batch of a streaming query.
BatchWriter = Callable[[DataFrame, int], None]


def _running_the_ledger(channel: Channel, checkpoint: str, message_timeout_ms: int) -> BatchWriter:
    """The ``foreachBatch`` function that brings each batch's records to the driver and
    runs one ledger over them."""
    acker = Acker(checkpoint, message_timeout_ms)
    reads_files = channel.ack_files  # its batches' files are named by Spark

    def write(batch: DataFrame, batch_id: int) -> None:
        now_ms = batch_timestamp_ms(batch.sparkSession, checkpoint, batch_id)
        records = batch_records(checkpoint, batch_id) if reads_files else None
        records = batch.toArrow() if records is None else records
        table = acker.run(records, batch_id, now_ms)
        echo = caught_up(latest_tick_ms(records))
        table = table if echo is None else pa.concat_tables([table, echo])
        report(table, batch_id)
        channel.write_completions(table, batch_id)

    return write


def _writing_shard_summaries(channel: Channel) -> BatchWriter:
    """The ``foreachBatch`` function of a sharded acker: its shards ran where they read
    their records and wrote their completions; it logs what they could not use and
    then writes the ``caught_up`` echo of the batch's latest tick."""

    def write(batch: DataFrame, batch_id: int) -> None:
        summaries = batch.collect()  # one row per shard: running them runs the ledgers
        for kind in (INVALID, UNKNOWN):
            found = [s for s in summaries if s[kind]]
            if found:
                example = found[0]
                _warn(
                    batch_id,
                    kind,
                    sum(s[kind] for s in found),
                    example[f"{kind}_root"],
                    example[f"{kind}_reason"],
                )
        ticks = [s["tick_ms"] for s in summaries if s["tick_ms"] is not None]
        echo = caught_up(max(ticks) if ticks else None)
        if echo is not None:
            channel.write_completions(echo, batch_id)

    return write


def check_shard_count(spark: SparkSession, checkpoint: str, ackers: int) -> None:
    """Refuse a shard count other than the one ``checkpoint`` was started with: a pending
    root lives in the state of shard ``pmod(root, ackers)``, so another count would lose
    track of it (its acks would reach a shard that never saw its init). The count is
    kept in the checkpoint, read and written as Spark's checkpoint files are (see
    :mod:`ackstream.storage.checkpoint_files`)."""
    if not isinstance(ackers, int) or ackers < 1:
        raise OptionError("ackers", ackers, "a whole number >= 1 (tracking=False runs no acker)")
    path = f"{checkpoint.rstrip('/')}/{SHARDS_FILE}"
    text = read_text(spark, path)
    if text is None:
        write_text(spark, path, json.dumps({"ackers": ackers}))
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
            reason = table.column("reason")[first].as_py()
            _warn(batch_id, kind, count, table.column("root")[first].as_py(), reason)


def _warn(batch_id: int, kind: str, count: int, root: int | None, reason: str | None) -> None:
    log.warning(
        "ackstream acker batch %d: %d %s record(s) ignored, e.g. root %s: %s",
        batch_id,
        count,
        kind,
        root,
        reason or "its init never came",
    )
