"""The acker's pending table between batches, saved in the acker's checkpoint.

The acker query is a ``foreachBatch`` over the ack channel, so Spark keeps no state
for it: after a batch that changed the table, the table is written whole to
``<checkpoint>/ackstream-pending/<batch id>`` (under a hidden name, then moved into
place), and a batch starts from the newest table saved by an *earlier* batch. A batch
that Spark runs again after a crash (its offsets logged, its commit not) therefore
starts from the same table as the first time, whatever that first run saved. The
two newest files are kept; the table also stays in memory between batches, so a
running acker reads its file only after a restart. A store that is not the shard's
only writer (a shard run in whichever executor process reads it, see
:mod:`ackstream.acker.shards`) lists the folder first and keeps its copy only while it
is still the newest table.

A file is one Arrow IPC record batch of one row: the ledger's epoch, topic names
and packed table (:meth:`Pending.to_state`), 40 bytes per pending root plus about a
kilobyte per file, and the reasons held for roots failed before their init came
(a file written before those were kept reads as holding none).
"""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa

from ackstream.acker.ledger import Pending
from ackstream.storage.files import BatchFiles

__all__ = ["PendingStore"]

FOLDER = "ackstream-pending"
_SCHEMA = pa.schema(
    [
        ("epoch_ms", pa.int64()),
        ("topics", pa.string()),
        ("pending", pa.large_binary()),
        ("reason_roots", pa.list_(pa.int64())),
        ("reasons", pa.list_(pa.string())),
    ]
)


class PendingStore:
    """Saves and restores the acker's pending table by batch id, in ``checkpoint``: a
    plain path, or a URL of a file system pyarrow knows (``hdfs://``, ``s3://``...)."""

    def __init__(self, checkpoint: str, *, only_writer: bool = True):
        self.checkpoint, self.only_writer = checkpoint, only_writer
        self.files = BatchFiles(f"{checkpoint.rstrip('/')}/{FOLDER}")
        self._cached: tuple[int, Pending] | None = None  # (batch id, table after it)

    def __getstate__(self) -> dict[str, object]:  # pickled to Spark Connect's server: no table
        return {**self.__dict__, "_cached": None}

    def before(self, batch_id: int, now_ms: int) -> Pending:
        """The table as the newest batch before ``batch_id`` left it (empty at first)."""
        if self.only_writer and self._cached is not None and self._cached[0] < batch_id:
            return self._cached[1]
        earlier = self.files.newest_before(batch_id)
        if self._cached is not None and self._cached[0] == earlier:
            return self._cached[1]
        if earlier is None:
            return Pending.empty(now_ms)
        row = self.files.read(earlier).to_pylist()[0]
        pending = Pending.from_state((row["epoch_ms"], row["topics"], row["pending"]))
        reasons = dict(zip(row.get("reason_roots") or (), row.get("reasons") or ()))
        pending = replace(pending, reasons=reasons)
        if earlier == max(self.files.batch_ids()):  # what a later batch starts from, too
            self._cached = (earlier, pending)
        return pending

    def save(self, batch_id: int, pending: Pending) -> int:
        """Save the table as ``batch_id`` left it; drop all but the two newest files.
        Returns the file's size in bytes."""
        epoch_ms, topics, blob = pending.to_state()
        row = pa.table(
            [
                pa.array([epoch_ms], pa.int64()),
                [topics],
                pa.array([blob], pa.large_binary()),
                [list(pending.reasons)],
                [list(pending.reasons.values())],
            ],
            schema=_SCHEMA,
        )
        size = self.files.write(batch_id, row)
        self._cached = (batch_id, pending)
        return size
