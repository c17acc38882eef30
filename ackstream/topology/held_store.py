"""The tuples a window stage holds between micro-batches, kept by Spark beside the checkpoint.

A topology runs in ``foreachBatch``, where Spark keeps no state for it, so a stage
that holds tuples across batches keeps them itself, where Spark keeps its own
state: after each batch the executors write the held rows (payload and lineage)
as Parquet to ``<checkpoint>/topology/ackstream-held/<stage>/rows-<batch id>``;
then the driver publishes the batch's state, a small file ``<batch id>`` with the
completion channel's position the stage had read up to, its closing's clock and
the rows' schema. The held rows never pass through the driver. A batch starts from
the newest state published by an *earlier* batch, so a batch that Spark runs again
after a crash starts from the state before it and never holds a tuple twice. The
two newest states are kept. Without a folder (``Topology.run_batch`` in tests) the
rows stay in the executors' memory (a local checkpoint), by batch id alike.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs

from ackstream.files import BatchFiles

if TYPE_CHECKING:  # ``ackstream status`` reads the counts without Spark
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["FOLDER", "HeldState", "HeldStore", "held_counts"]

#: The folder of the held stores in a topology query's checkpoint.
FOLDER = "ackstream-held"
_KEEP = 2
_POSITION, _CLOCK, _SCHEMA = b"ackstream.position", b"ackstream.clock", b"ackstream.schema"
_ROWS = "rows-"


@dataclass(frozen=True)
class HeldState:
    """A window stage's held rows after a batch (a Spark frame: None when it holds
    none), the completion position it had read up to (None: it has read none yet)
    and the clock its closing reached (None: none)."""

    rows: DataFrame | None
    position: object = None
    clock: int | None = None


class HeldStore:
    """Saves and restores one stage's :class:`HeldState` by batch id in ``directory``
    (a plain path or a URL both Spark and pyarrow can write to), or in the executors'
    memory when it is None."""

    def __init__(self, directory: str | None):
        self.directory = directory
        self.files = BatchFiles(directory, keep=_KEEP) if directory is not None else None
        self._memory: dict[int, HeldState] = {}

    def before(self, spark: SparkSession, batch_id: int) -> HeldState | None:
        """The state the newest batch before ``batch_id`` saved (None if none did)."""
        if self.files is None:
            earlier = max((b for b in self._memory if b < batch_id), default=None)
            return None if earlier is None else self._memory[earlier]
        earlier = self.files.newest_before(batch_id)
        if earlier is None:
            return None
        meta = self.files.read(earlier).schema.metadata or {}
        schema = json.loads(meta.get(_SCHEMA, b"null"))
        rows = None
        if schema is not None:
            from pyspark.sql.types import StructType

            reader = spark.read.schema(StructType.fromJson(schema))
            rows = reader.parquet(self.rows_path(earlier))
        position = json.loads(meta.get(_POSITION, b"null"))
        return HeldState(rows, position, json.loads(meta.get(_CLOCK, b"null")))

    def latest(self, spark: SparkSession) -> HeldState | None:
        """The newest saved state (None if there is none)."""
        saved = list(self._memory) if self.files is None else self.files.batch_ids()
        return self.before(spark, max(saved) + 1) if saved else None

    def save(self, batch_id: int, state: HeldState) -> DataFrame | None:
        """Save ``state`` as batch ``batch_id`` left it (its rows written by the
        executors); drop all but the two newest. Returns the rows as saved (read back,
        so a later job sees what was written, not a recomputation)."""
        if self.files is None:
            rows = None if state.rows is None else state.rows.localCheckpoint(eager=True)
            self._memory[batch_id] = HeldState(rows, state.position, state.clock)
            for old in sorted(self._memory)[:-_KEEP]:
                del self._memory[old]
            return rows
        schema, rows = None, None
        if state.rows is not None:
            state.rows.write.mode("overwrite").parquet(self.rows_path(batch_id))
            schema = state.rows.schema.jsonValue()
            reader = state.rows.sparkSession.read.schema(state.rows.schema)
            rows = reader.parquet(self.rows_path(batch_id))
        meta = {_POSITION: state.position, _CLOCK: state.clock, _SCHEMA: schema}
        published = pa.table({}).replace_schema_metadata(
            {k: json.dumps(v).encode() for k, v in meta.items()}
        )
        self.files.write(batch_id, published)
        kept = {f"{_ROWS}{b}" for b in self.files.batch_ids()}
        fs, root = self.files.filesystem()
        for info in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True)):
            name = os.path.basename(info.path)
            if name.startswith(_ROWS) and name not in kept:
                fs.delete_dir(info.path)
        return rows

    def rows_path(self, batch_id: int) -> str:
        """Where batch ``batch_id``'s held rows are written (files only)."""
        assert self.directory is not None
        folder = self.directory
        if not urlparse(folder).scheme:
            folder = os.path.abspath(folder)
        return f"{folder.rstrip('/')}/{_ROWS}{batch_id}"


def held_counts(folder: str, root_column: str = "_root") -> dict[str, dict[str, int]]:
    """Per stage, the ``tuples`` and distinct ``roots`` its newest saved state holds,
    read from a held-store ``folder`` (``<checkpoint>/topology/ackstream-held``); {}
    when there is none. Plain paths only; no Spark."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    out: dict[str, dict[str, int]] = {}
    if not os.path.isdir(folder):
        return out
    for stage in sorted(os.listdir(folder)):
        store = HeldStore(os.path.join(folder, stage))
        saved = store.files.batch_ids() if store.files is not None else []
        rows = None
        if saved and os.path.isdir(store.rows_path(max(saved))):
            rows = ds.dataset(store.rows_path(max(saved)), format="parquet")
        if rows is None or root_column not in rows.schema.names:
            out[stage] = {"tuples": 0, "roots": 0}
            continue
        roots = rows.to_table(columns=[root_column]).column(root_column)
        out[stage] = {"tuples": len(roots), "roots": pc.count_distinct(roots.drop_null()).as_py()}
    return out
