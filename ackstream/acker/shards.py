"""The acker's ledger run where the ack records are read: one ledger per shard.

A channel that keeps every ack record of a root in one partition of its acks
(:attr:`~ackstream.channels.base.Channel.ack_shards`; the Kafka channel sends root
``r`` to partition ``pmod(r, partitions)``) lets the acker run one ledger per
partition, in the Spark task that reads that partition's records. The records never
leave the executor's Python worker: the task checks them, runs the ledger over its
shard's pending table, writes the completions to the channel itself and returns one
summary row. The driver sees one row per shard a batch, logs what the shards could
not use, and writes the ``caught_up`` echo once every shard's completions are out.
So ``ackers`` (the partitions) really splits the work, across executor cores.

Each shard keeps its pending table in ``<checkpoint>/shard-<n>`` by batch id, as the
driver's acker does (:class:`~ackstream.acker.pending_store.PendingStore`): the
channel's source puts the batch id and the planning time in its offsets, so a batch
Spark runs again after a crash starts every shard from the same table at the same
time and yields the same completions. Every shard runs in every batch, with or
without new records, so overdue roots time out in each one.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ackstream.acker.batch import Acker, latest_tick_ms
from ackstream.channels.base import Channel
from ackstream.vocabulary.records import INVALID, UNKNOWN

__all__ = ["SUMMARY_DDL", "ShardLedger"]

#: What a shard's task returns to the driver: one row a batch. The counts of unusable
#: records and unknown roots, and their first root and reason, are named after their
#: statuses (``records.INVALID``, ``records.UNKNOWN``): the driver reads them so.
#: A shard's summary of one batch, a row of ``SUMMARY_DDL``.
Summary = tuple[
    int, int, int, int, int, int | None, str | None, int, int | None, str | None, int | None
]
SUMMARY_DDL = (
    "shard int, records long, completions long, pending long, invalid long, "
    "invalid_root long, invalid_reason string, unknown long, unknown_root long, "
    "unknown_reason string, tick_ms long"
)

#: Per Python worker, by (checkpoint, shard): the shard's acker, which keeps its table in
#: memory while no other worker saved a newer one, and the channel its completions go
#: through, which keeps its producer between batches.
_SHARDS: dict[tuple[str, int], tuple[Acker, Any]] = {}


class ShardLedger:
    """A batch of one shard: its ack records in, its completions to ``channel``, a
    summary row out. Picklable: Spark ships it to the tasks that read the shards."""

    ddl = SUMMARY_DDL

    def __init__(self, channel: Channel, checkpoint: str, message_timeout_ms: int) -> None:
        self.channel, self.checkpoint = channel, checkpoint.rstrip("/")
        self.message_timeout_ms = message_timeout_ms

    def __call__(self, records: pa.Table, shard: int, batch_id: int, now_ms: int) -> Summary:
        """Run shard ``shard``'s ledger over its ``records`` of batch ``batch_id`` at
        ``now_ms``, write its completions, and return its summary (``SUMMARY_DDL``)."""
        key = (self.checkpoint, shard)
        known = _SHARDS.get(key)
        if known is None or known[0].message_timeout_ms != self.message_timeout_ms:
            store = f"{self.checkpoint}/shard-{shard}"
            known = _SHARDS[key] = (
                Acker(store, self.message_timeout_ms, only_writer=False),
                self.channel,
            )
        acker, channel = known
        table = acker.run(records, batch_id, now_ms)
        if table.num_rows:
            channel.write_completions(table, batch_id)
        return (
            shard,
            records.num_rows,
            table.num_rows,
            acker.pending_roots,
            *_first(table, INVALID),
            *_first(table, UNKNOWN),
            latest_tick_ms(records),
        )


def _first(completions: pa.Table, status: str) -> tuple[int, int | None, str | None]:
    """How many ``completions`` have ``status``, and the root and reason of the first."""
    found = completions.filter(pc.equal(completions.column("status"), status))
    if not found.num_rows:
        return 0, None, None
    first = found.slice(0, 1).to_pylist()[0]
    return found.num_rows, first["root"], first["reason"]
