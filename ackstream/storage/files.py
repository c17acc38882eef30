"""Files that readers see whole or not at all.

Spark's file stream, the source and ``ackstream status`` list folders that other
processes write to. A writer writes under a hidden name (a leading dot, which
they all skip) in the same folder, then renames or links it into place, which is
atomic on one file system. :class:`BatchFiles` does the same on any file system
pyarrow writes to, for state that ``foreachBatch`` queries keep per batch.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs

from ackstream.errors import OptionError

__all__ = ["BatchFiles", "hidden_path", "write_atomically"]


def hidden_path(path: str) -> str:
    """The hidden name beside ``path`` that a writer fills before publishing it."""
    head, tail = os.path.split(path)
    return os.path.join(head, "." + tail)


def write_atomically(path: str, write: Callable[[str], object]) -> None:
    """Call ``write(hidden)`` to fill a hidden file, then rename it to ``path``
    (replacing a file of that name): a reader sees the old file or the new one."""
    hidden = hidden_path(path)
    write(hidden)
    os.replace(hidden, path)


_BATCH_ID = re.compile(r"^(\d+)$")


class BatchFiles:
    """One Arrow table per micro-batch id, as ``<folder>/<batch id>``, in a plain path or
    a URL of a file system pyarrow knows (``hdfs://``, ``s3://``...). A table is written
    under a hidden name, then moved into place; the ``keep`` newest are kept.

    A ``foreachBatch`` query keeps its state here, and a batch starts from the table
    of the newest *earlier* batch (:meth:`newest_before`): a batch Spark runs again
    after a crash starts from the same state as the first time.
    """

    def __init__(self, folder: str, keep: int = 2):
        self.folder, self.keep = folder, keep
        self._fs: pafs.FileSystem | None = None
        self._root = ""

    def __getstate__(self) -> dict[str, object]:
        """Pickled to Spark Connect's server: no file system handle."""
        return {**self.__dict__, "_fs": None}

    def batch_ids(self) -> list[int]:
        """The ids of the saved tables, in no order."""
        selector = pafs.FileSelector(self._path(""), allow_not_found=True)
        names = (os.path.basename(info.path) for info in self._filesystem().get_file_info(selector))
        return [int(m.group(1)) for m in map(_BATCH_ID.match, names) if m]

    def newest_before(self, batch_id: int) -> int | None:
        """The id of the newest table saved by a batch before ``batch_id``, if any."""
        return max((b for b in self.batch_ids() if b < batch_id), default=None)

    def read(self, batch_id: int) -> pa.Table:
        with self._filesystem().open_input_file(self._path(batch_id)) as f:
            return pa.ipc.open_file(f).read_all()

    def write(self, batch_id: int, table: pa.Table) -> int:
        """Save ``table`` as batch ``batch_id``'s; drop all but the newest. Returns its bytes."""
        fs, path, hidden = self._filesystem(), self._path(batch_id), self._path(f".{batch_id}")
        with fs.open_output_stream(hidden) as sink, pa.ipc.new_file(sink, table.schema) as out:
            out.write_table(table)
        fs.move(hidden, path)
        for old in sorted(self.batch_ids())[: -self.keep]:
            fs.delete_file(self._path(old))
        size: int = fs.get_file_info(path).size
        return size

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """The file system the folder is on and the folder's path there."""
        return self._filesystem(), self._root

    def _path(self, name: object) -> str:
        self._filesystem()
        return f"{self._root}/{name}" if name != "" else self._root

    def _filesystem(self) -> pafs.FileSystem:
        if self._fs is None:
            fs: pafs.FileSystem
            if urlparse(self.folder).scheme:
                try:
                    fs, base = pafs.FileSystem.from_uri(self.folder)
                except (pa.ArrowException, ValueError) as problem:
                    raise OptionError(
                        "checkpoint",
                        self.folder,
                        f"a local path or a file system URL pyarrow can write to ({problem})",
                    ) from None
            else:
                fs, base = pafs.LocalFileSystem(), os.path.abspath(self.folder)
            self._root = base.rstrip("/")
            fs.create_dir(self._root, recursive=True)
            self._fs = fs
        return self._fs
