"""The tuples a window stage holds between micro-batches, saved beside the checkpoint.

A topology runs in ``foreachBatch``, where Spark keeps no state for it, so a stage
that holds tuples across batches keeps them itself: after each batch that changed
them, the held rows (payload and lineage, as Arrow), the completion channel's
position the stage had read up to and its closing's clock are written whole to
``<checkpoint>/topology/ackstream-held/<stage>/<batch id>`` (under a hidden name,
then moved into place). A batch starts from the newest file saved by an *earlier*
batch, so a batch that Spark runs again after a crash starts from the state before
it and never holds a tuple twice. The two newest files are kept. Without a folder
(``Topology.run_batch`` in tests) the state lives in memory, by batch id alike.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pyarrow as pa

from ackstream.files import BatchFiles

__all__ = ["FOLDER", "HeldState", "HeldStore", "held_counts"]

#: The folder of the held stores in a topology query's checkpoint.
FOLDER = "ackstream-held"
_KEEP = 2
_POSITION, _CLOCK = b"ackstream.position", b"ackstream.clock"


@dataclass(frozen=True)
class HeldState:
    """A window stage's held rows after a batch, the completion position it had read
    up to (None: it has read none yet) and the clock its closing reached (None: none)."""

    rows: pa.Table | None
    position: object = None
    clock: int | None = None


class HeldStore:
    """Saves and restores one stage's :class:`HeldState` by batch id in ``directory``
    (a plain path or a URL pyarrow can write to), or in memory when it is None."""

    def __init__(self, directory: str | None):
        self.directory = directory
        self.files = BatchFiles(directory, keep=_KEEP) if directory is not None else None
        self._memory: dict[int, HeldState] = {}

    def before(self, batch_id: int) -> HeldState | None:
        """The state the newest batch before ``batch_id`` saved (None if none did)."""
        if self.files is None:
            earlier = max((b for b in self._memory if b < batch_id), default=None)
            return None if earlier is None else self._memory[earlier]
        earlier = self.files.newest_before(batch_id)
        if earlier is None:
            return None
        table = self.files.read(earlier)
        meta = table.schema.metadata or {}
        position = json.loads(meta.get(_POSITION, b"null"))
        clock = json.loads(meta.get(_CLOCK, b"null"))
        return HeldState(table.replace_schema_metadata(None), position, clock)

    def latest(self) -> HeldState | None:
        """The newest saved state (None if there is none)."""
        saved = list(self._memory) if self.files is None else self.files.batch_ids()
        return self.before(max(saved) + 1) if saved else None

    def save(self, batch_id: int, state: HeldState) -> None:
        """Save ``state`` as batch ``batch_id`` left it; drop all but the two newest."""
        if self.files is None:
            self._memory[batch_id] = state
            for old in sorted(self._memory)[:-_KEEP]:
                del self._memory[old]
            return
        rows = state.rows if state.rows is not None else pa.table({})
        meta = {_POSITION: json.dumps(state.position), _CLOCK: json.dumps(state.clock)}
        rows = rows.replace_schema_metadata({k: v.encode() for k, v in meta.items()})
        self.files.write(batch_id, rows)


def held_counts(folder: str, root_column: str = "_root") -> dict[str, dict[str, int]]:
    """Per stage, the ``tuples`` and distinct ``roots`` its newest saved state holds,
    read from a held-store ``folder`` (``<checkpoint>/topology/ackstream-held``); {}
    when there is none. Plain paths only; no Spark."""
    import pyarrow.compute as pc

    out: dict[str, dict[str, int]] = {}
    if not os.path.isdir(folder):
        return out
    for stage in sorted(os.listdir(folder)):
        state = HeldStore(os.path.join(folder, stage)).latest()
        rows = state.rows if state is not None else None
        if rows is None or root_column not in rows.column_names:
            out[stage] = {"tuples": 0, "roots": 0}
            continue
        roots = pc.count_distinct(rows.column(root_column).drop_null()).as_py()
        out[stage] = {"tuples": rows.num_rows, "roots": roots}
    return out
