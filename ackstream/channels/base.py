"""The channel: the hub between whoever processes tuples, the acker and the source.

Ack records (``records.ACK_RECORD_SCHEMA``) flow in from the topology's batches,
the source (ticks), stages that keep upstream trees alive (timeout resets, from the
executors) and any other process; the acker query reads them as a stream.
Completions (``records.COMPLETION_SCHEMA``) flow in from the acker (its ledger on the
driver, or on the executors, one per acks partition, with a channel that shards its
acks) and from the topology's batches on the driver (trees they settled themselves,
the roots of a batch that failed as a whole); the source reads them on the driver,
and so does ``ackstream status``. The source's read tasks write nothing here: the
records they hold back (rejected, or offsets with no record) travel in the batch's
rows, and the topology settles them with ack records (``ackstream.sources.rows``).
Every transport keeps the same records and passes one contract suite
(``tests/channels/test_channel_contract.py``).

A *position* is whatever the transport needs to resume reading completions (a
file number, a ``{partition: offset}`` map): opaque to callers, JSON-able,
because the source keeps it in its Spark offset.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pyarrow as pa

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Channel", "Position", "ShardRunner", "ShardedAcks"]

Position = Any  #: JSON-able; None means "from the first completion"


class ShardRunner(Protocol):
    """What runs one shard's records of a batch where they are read (the acker's
    ledger, :class:`~ackstream.acker.shards.ShardLedger`)."""

    #: the Spark DDL of the row it returns
    ddl: str

    def __call__(
        self, records: pa.Table, shard: int, batch_id: int, now_ms: int
    ) -> tuple[object, ...]:
        """Run shard ``shard`` over its ``records`` of batch ``batch_id`` at ``now_ms``."""


@runtime_checkable
class ShardedAcks(Protocol):
    """Acks kept by shard: every ack record of a root is in partition
    ``pmod(root, partitions)``, so one task can run the ledger of a partition alone."""

    def shard_stream(self, spark: SparkSession, run_shard: ShardRunner, shards: int) -> DataFrame:
        """A streaming DataFrame whose every batch calls ``run_shard(records, partition,
        batch, now_ms)`` once for each partition that ever held records, in the task
        that reads that partition's new records (an Arrow table, ``ACK_RECORD_SCHEMA``);
        its rows are what it returns (``run_shard.ddl``). ``batch`` and ``now_ms`` are
        the same when Spark runs a batch again. An
        :class:`~ackstream.errors.OptionError` naming ``ackers`` unless the acks have
        ``shards`` partitions."""


@runtime_checkable
class Channel(Protocol):
    """Ack and completion channels of one topology."""

    def prepare(self) -> None:
        """Create what the channel needs (folders, topics); idempotent."""

    #: Whether :meth:`ack_stream` is Spark's file source over files this channel wrote
    #: (the acker then reads a batch's files itself, as Spark logged them).
    ack_files: bool

    @property
    def one_host(self) -> bool:
        """Whether only the driver's host reaches the channel (a folder not declared
        shared): executors on other hosts would read and write another folder."""

    @property
    def ack_shards(self) -> ShardedAcks | None:
        """The acks as shards, when the channel keeps them so: the acker then runs one
        ledger per shard where its records are read. None: the acker reads each
        batch's records on the driver (:meth:`ack_stream`)."""

    def source_options(self) -> dict[str, str]:
        """The options a source that reads this channel is given: ``ackstream.channel``
        (a folder, or ``kafka``) and what else must agree with the topology's channel."""

    def agreeing_with(self, source_options: Mapping[str, str]) -> Channel:
        """This channel as a source given ``source_options`` must see it (the same
        channel, or one that takes the source's client settings it lacks); an
        :class:`~ackstream.errors.OptionError` when they disagree."""

    def write_acks(self, records: pa.Table | pd.DataFrame) -> None:
        """Append ack records (a pandas frame or Arrow table of ``ACK_RECORD_SCHEMA``
        columns, ``reason`` optional); durable when it returns. Any process may call it."""

    def ack_stream(
        self, spark: SparkSession, max_files_per_trigger: int | None = None
    ) -> DataFrame:
        """The ack records as a streaming DataFrame (``ACK_RECORD_DDL``), for the acker."""

    def ack_records(self) -> pa.Table:
        """Every ack record written so far; unreadable pieces are logged and skipped."""

    def write_completions(self, table: pa.Table, batch_id: int | None = None) -> None:
        """Append completions; durable when it returns. A query's batch passes its id."""

    def completions_since(
        self, position: Position = None, *, runs: bool = False
    ) -> tuple[pa.Table, Position]:
        """Completions written after ``position`` (None: from the first) and the position
        after them, to pass next time. Nothing written after a position is ever missed.
        A run of acked offsets written as one row (:mod:`ackstream.vocabulary.ranges`) comes back
        as one row per root, or as it was written with ``runs=True`` (for the source)."""

    def answering(self) -> bool:
        """Whether the last :meth:`completions_since` reached the completions (False while
        the transport's servers do not answer: an empty read then means nothing). The
        source stops timing roots out while it cannot hear their completions."""

    def end_position(self) -> Position:
        """The position after every completion written so far (where a new reader
        starts: old completions in a reused channel carry the same root ids)."""

    def close(self) -> None:
        """Release clients; the channel may be used again afterwards."""
