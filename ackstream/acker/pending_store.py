"""The acker's pending table between batches, saved in the acker's checkpoint.

The acker query is a ``foreachBatch`` over the ack channel, so Spark keeps no state
for it: after a batch that changed the table, the table is written whole to
``<checkpoint>/ackstream-pending/<batch id>`` (under a hidden name, then moved into
place), and a batch starts from the newest table saved by an *earlier* batch. A batch
that Spark runs again after a crash (its offsets logged, its commit not) therefore
starts from the same table as the first time, whatever that first run saved. The
two newest files are kept; the table also stays in memory between batches, so a
running acker reads its file only after a restart.

A file is one Arrow IPC record batch of one row: the ledger's epoch, topic names
and packed table (:meth:`Pending.to_state`), 40 bytes per pending root plus about a
kilobyte per file.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs

from ackstream.acker.ledger import Pending
from ackstream.errors import OptionError

__all__ = ["PendingStore"]

FOLDER = "ackstream-pending"
_SCHEMA = pa.schema(
    [("epoch_ms", pa.int64()), ("topics", pa.string()), ("pending", pa.large_binary())]
)
_SAVED = re.compile(r"^(\d+)$")
_KEEP = 2


class PendingStore:
    """Saves and restores the acker's pending table by batch id, in ``checkpoint``: a
    plain path, or a URL of a file system pyarrow knows (``hdfs://``, ``s3://``...)."""

    def __init__(self, checkpoint: str):
        self.checkpoint = checkpoint
        self._fs, self._root = None, ""
        self._cached: tuple[int, Pending] | None = None  # (batch id, table after it)

    def __getstate__(self):  # pickled to Spark Connect's server: no file system handle
        return {**self.__dict__, "_fs": None, "_cached": None}

    def before(self, batch_id: int, now_ms: int) -> Pending:
        """The table as the newest batch before ``batch_id`` left it (empty at first)."""
        if self._cached is not None and self._cached[0] < batch_id:
            return self._cached[1]
        saved = self._saved()
        earlier = [b for b in saved if b < batch_id]
        if not earlier:
            return Pending.empty(now_ms)
        with self._filesystem().open_input_file(self._path(max(earlier))) as f:
            row = pa.ipc.open_file(f).read_all().to_pylist()[0]
        pending = Pending.from_state((row["epoch_ms"], row["topics"], row["pending"]))
        if max(earlier) == max(saved):  # what a later batch starts from, too
            self._cached = (max(earlier), pending)
        return pending

    def save(self, batch_id: int, pending: Pending) -> int:
        """Save the table as ``batch_id`` left it; drop all but the two newest files.
        Returns the file's size in bytes."""
        fs, path = self._filesystem(), self._path(batch_id)
        epoch_ms, topics, blob = pending.to_state()
        row = pa.record_batch(
            [pa.array([epoch_ms], pa.int64()), [topics], pa.array([blob], pa.large_binary())],
            schema=_SCHEMA,
        )
        hidden = self._path(f".{batch_id}")
        with fs.open_output_stream(hidden) as sink, pa.ipc.new_file(sink, _SCHEMA) as writer:
            writer.write_batch(row)
        fs.move(hidden, path)
        for old in sorted(self._saved())[:-_KEEP]:
            fs.delete_file(self._path(old))
        self._cached = (batch_id, pending)
        return fs.get_file_info(path).size

    def _saved(self) -> list[int]:
        selector = pafs.FileSelector(self._path(""), allow_not_found=True)
        names = (os.path.basename(info.path) for info in self._filesystem().get_file_info(selector))
        return [int(m.group(1)) for m in map(_SAVED.match, names) if m]

    def _path(self, name) -> str:
        self._filesystem()
        return f"{self._root}/{name}" if name != "" else self._root

    def _filesystem(self):
        if self._fs is None:
            if urlparse(self.checkpoint).scheme:
                try:
                    self._fs, base = pafs.FileSystem.from_uri(self.checkpoint)
                except (pa.ArrowException, ValueError) as problem:
                    raise OptionError(
                        "checkpoint",
                        self.checkpoint,
                        f"a local path or a file system URL pyarrow can write to ({problem})",
                    ) from None
            else:
                self._fs, base = pafs.LocalFileSystem(), os.path.abspath(self.checkpoint)
            self._root = f"{base.rstrip('/')}/{FOLDER}"
            self._fs.create_dir(self._root, recursive=True)
        return self._fs
