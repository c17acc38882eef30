"""The tuples a holding stage keeps between micro-batches, saved as changes beside the checkpoint.

A topology runs in ``foreachBatch``, where Spark keeps no state for it, so a stage
that holds tuples across batches keeps them itself, where Spark keeps its own state,
in ``<checkpoint>/topology/ackstream-held/<stage>/``. A batch writes what changed,
not everything held: the executors write the rows it held anew as Parquet
(``added-<batch id>``) and the ids (``_hold``) of the rows held before that it
released or dropped (``released-<batch id>``); then the driver publishes the batch's
state, a small file ``<batch id>`` naming those pieces (a :class:`ChangeLog`) with
the completion channel's position the stage had read up to, its closing's clock and
the rows' schema. What a state holds is its base (``rows-<batch id>``, every row
held after that batch) and its later added rows, less its released ids. Once the
rows added (or released) since the base, or by the last batch that wrote changes,
reach a quarter of what is held (:data:`COMPACT_SHARE`), or there are
:data:`MAX_PIECES` pieces, the batch writes every held row as a new base instead:
each row is written about five times over its life (once added, and about four
times in bases, since a base follows a quarter's worth of new rows), whatever is
held. A stage whose every batch changes most of what it holds (a time window lets
go of whole batches' rows) so writes one base a batch, one Spark job where changes
take two; such a base holds about four times the last change measured at most. The
held rows never pass through the driver; it reads the Parquet footers to count them.

A window holding partial aggregates writes its batch in one Spark job instead
(:meth:`HeldStore.save_merged`): one folder, ``parts-<batch id>``, with the rows it
holds on and those it hands on in two parts, each row naming the version it replaces;
the sink then reads the rows handed on from there, so nothing is cached or computed
twice, and the released ids are read from those names.

A batch starts from the newest state published by an *earlier* batch, so a batch
that Spark runs again after a crash starts from the same state, writes the same
pieces over its own, and never holds a tuple twice. The two newest states are kept
with every piece they name. Without a folder (``Topology.run_batch`` in tests) the
rows stay in the executors' memory (a local checkpoint), whole, by batch id alike.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from ackstream.storage.files import BatchFiles
from ackstream.topology.hold_tokens import FOLDER as TOKENS

if TYPE_CHECKING:  # ``ackstream status`` reads the counts without Spark
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "COMPACT_SHARE",
    "FOLDER",
    "HOLD",
    "MAX_PIECES",
    "ChangeLog",
    "Changes",
    "HeldState",
    "HeldStore",
    "held_counts",
]

#: The folder of the held stores in a topology query's checkpoint.
FOLDER = "ackstream-held"
#: The column naming each held row (see :mod:`ackstream.topology.holding`): what a
#: batch that releases the row writes in its ``released`` piece.
HOLD = "_hold"
#: A batch writes every held row as a new base once the rows added, or those released,
#: since the last base reach this share of the rows held.
COMPACT_SHARE = 0.25
#: ... or once a state would name more pieces than this (each is a folder a batch
#: lists and reads; Spark lists more than 32 paths with a job of its own).
MAX_PIECES = 24
_KEEP = 2
_POSITION, _CLOCK, _SCHEMA, _LOG, _ENDS = (
    b"ackstream.position",
    b"ackstream.clock",
    b"ackstream.schema",
    b"ackstream.log",
    b"ackstream.ends",
)
_BASE, _ADDED, _RELEASED, _PARTS = "rows-", "added-", "released-", "parts-"
_PIECE_PREFIXES = (_BASE, _ADDED, _RELEASED, _PARTS)
#: In a batch's one folder (:meth:`HeldStore.save_merged`): the column naming each
#: row's part, a row held on (:data:`KEPT`) or handed on (:data:`OUT`), and the column
#: with the id of the version the row replaces (released by the batch).
PIECE, KEPT, OUT, WAS = "_piece", "kept", "out", "_was"


@dataclass(frozen=True)
class ChangeLog:
    """The pieces a saved state is read from: the base written by batch ``base``
    (None: none), then the rows each batch of ``added`` held anew and the ids each
    batch of ``released`` let go, with the rows each kind holds; ``last_changed``:
    the rows added or released (the larger) by the last batch that wrote changes."""

    base: int | None = None
    added: tuple[int, ...] = ()
    released: tuple[int, ...] = ()
    base_rows: int = 0
    added_rows: int = 0
    released_rows: int = 0
    last_changed: int = 0
    parts: tuple[int, ...] = ()

    @property
    def rows(self) -> int:
        """The rows the state holds."""
        return self.base_rows + self.added_rows - self.released_rows

    def compact_due(self) -> bool:
        """Whether the next batch should write a base instead of its changes: the rows
        added, or those released, since the base or by the last batch that wrote
        changes (the next batch's likely change) reach :data:`COMPACT_SHARE` of what
        is held, or the pieces :data:`MAX_PIECES`. (A store that holds nothing
        compacts each batch: its base is then what the batch adds, one write instead
        of two.)"""
        changed = max(self.added_rows, self.released_rows, self.last_changed)
        pieces = len(self.added) + len(self.released)
        return changed >= COMPACT_SHARE * self.rows or pieces + 2 > MAX_PIECES

    def pieces(self) -> list[str]:
        """The names of the pieces, base first."""
        base = [] if self.base is None else [f"{_BASE}{self.base}"]
        return [
            *base,
            *(f"{_ADDED}{b}" for b in self.added),
            *(f"{_RELEASED}{b}" for b in self.released),
        ]

    def held_folders(self) -> list[str]:
        """Where the held rows are (relative folders), base first: a piece of its own,
        or the held part of a batch's one folder (a base that holds no row has none)."""
        base = [] if self.base is None else [self.base]
        if self.base in self.parts and not self.base_rows:
            base = []
        return [self._where(b, _BASE if b == self.base else _ADDED) for b in (*base, *self.added)]

    def released_folders(self) -> list[tuple[str, str]]:
        """Where the released ids are, with the column that holds them: a piece of ids,
        or the replaced versions (``_was``) of what a batch wrote in its one folder."""
        return [
            (f"{_PARTS}{b}", WAS) if b in self.parts else (f"{_RELEASED}{b}", HOLD)
            for b in self.released
        ]

    def folders(self) -> set[str]:
        """The top folders of the pieces, and every batch's one folder while the log
        names its batch (the rows it hands on are read from it after it is published)."""
        return {
            piece.split("/")[0]
            for piece in (*self.held_folders(), *(f for f, _ in self.released_folders()))
        } | {f"{_PARTS}{b}" for b in self.parts}

    def _where(self, batch: int, prefix: str) -> str:
        return f"{_PARTS}{batch}/{PIECE}={KEPT}" if batch in self.parts else f"{prefix}{batch}"


@dataclass(frozen=True)
class HeldState:
    """A holding stage's held rows after a batch (a Spark frame: None when it holds
    none), the completion position it had read up to (None: it has read none yet),
    the clock its closing reached (None: none), the pieces the rows were read
    from (files only) and the ends of the windows the rows may be in (a time window's;
    None: not known), so that a batch knows without a job whether one closes."""

    rows: DataFrame | None
    position: object = None
    clock: int | None = None
    log: ChangeLog = field(default_factory=ChangeLog)
    ends: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Changes:
    """What a batch changed in the rows held before it (``since``): the rows it
    ``added`` (held for the first time) and the ids (one column, ``_hold``) of the
    rows held before that it ``released`` or dropped."""

    added: DataFrame
    released: DataFrame
    since: ChangeLog


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
        meta, log = self._published(earlier)
        schema = json.loads(meta.get(_SCHEMA, b"null"))
        rows = None
        if schema is not None:
            from pyspark.sql.types import StructType

            struct = StructType.fromJson(schema)
            data = [self.path(p) for p in log.held_folders()]
            rows = spark.read.schema(struct).parquet(*data) if data else None
            if rows is None:
                rows = spark.createDataFrame([], struct)
            if log.released:
                rows = rows.join(self._released_ids(spark, log), HOLD, "left_anti")
            if _LOG not in meta:  # saved before rows had ids in every ack mode
                from pyspark.sql import functions as F

                own = F.col(HOLD) if HOLD in rows.columns else F.lit(None).cast("long")
                hashed = F.xxhash64(*(F.col(f"`{c}`") for c in rows.columns))
                rows = rows.withColumn(HOLD, F.coalesce(own, hashed))
        position = json.loads(meta.get(_POSITION, b"null"))
        clock, ends = (json.loads(meta.get(key, b"null")) for key in (_CLOCK, _ENDS))
        return HeldState(rows, position, clock, log, None if ends is None else tuple(ends))

    def _released_ids(self, spark: SparkSession, log: ChangeLog) -> DataFrame:
        """The ids (``_hold``) the state's later batches released."""
        by_column: dict[str, list[str]] = {}
        for folder, column in log.released_folders():
            by_column.setdefault(column, []).append(self.path(folder))
        frames = [
            spark.read.schema(f"{column} bigint")
            .parquet(*paths)
            .where(f"{column} IS NOT NULL")
            .selectExpr(f"{column} AS {HOLD}")
            for column, paths in by_column.items()
        ]
        ids = frames[0]
        for frame in frames[1:]:
            ids = ids.unionByName(frame)
        return ids

    def latest(self, spark: SparkSession) -> HeldState | None:
        """The newest saved state (None if there is none)."""
        saved = list(self._memory) if self.files is None else self.files.batch_ids()
        return self.before(spark, max(saved) + 1) if saved else None

    def save(self, batch_id: int, state: HeldState, changes: Changes | None = None) -> ChangeLog:
        """Save ``state`` as batch ``batch_id`` left it: its ``changes`` when given
        and no compaction is due, else ``state.rows`` whole as a new base (the rows
        are written by the executors); drop all but the two newest states and the
        pieces they name. Returns the log of the state saved."""
        if self.files is None:
            rows = None if state.rows is None else state.rows.localCheckpoint(eager=True)
            self._memory[batch_id] = replace(state, rows=rows, log=ChangeLog())
            for old in sorted(self._memory)[:-_KEEP]:
                del self._memory[old]
            return ChangeLog()
        schema, log = None, ChangeLog()
        if state.rows is not None:
            schema = state.rows.schema.jsonValue()
            if changes is None or changes.since.compact_due():
                written = self._write(state.rows, _BASE, batch_id)
                last = 0 if changes is None else changes.since.last_changed
                log = ChangeLog(batch_id, base_rows=written, last_changed=last)
            else:
                log = self._write_changes(batch_id, changes)
        self._publish(batch_id, state, schema, log)
        return log

    def save_merged(
        self, batch_id: int, rows: DataFrame, changed: DataFrame, state: HeldState
    ) -> DataFrame:
        """Save, in one Spark job, a batch's merged rows in one folder ``parts-<batch
        id>`` by their part (``_piece``): the rows held on (``kept``) and those handed on
        (``out``), each with the id of the version it replaces (``_was``, null for a new
        one). ``rows`` are every row after the batch, ``changed`` those it touched or
        hands on: these alone are written, unless a compaction is due (then ``rows``
        whole, a base). ``state`` gives the position, clock and window ends, and in
        ``log`` the log the batch started from; its rows are ignored. Returns the rows
        handed on, read back from what was written (no second computation)."""
        from pyspark.sql import functions as F

        hidden = (PIECE, WAS)
        if self.files is None:
            computed = rows.localCheckpoint(eager=True)
            held_on = computed.where(F.col(PIECE) == KEPT).drop(*hidden)
            self._memory[batch_id] = replace(state, rows=held_on, log=ChangeLog())
            for old in sorted(self._memory)[:-_KEEP]:
                del self._memory[old]
            return computed.where(F.col(PIECE) == OUT).drop(*hidden)
        since, base = state.log, state.log.compact_due()
        written = rows if base else changed
        folder = f"{_PARTS}{batch_id}"
        written.write.mode("overwrite").option("partitionOverwriteMode", "static").partitionBy(
            PIECE
        ).parquet(self.path(folder))
        kept, out, released = self._counted(folder)
        if base:
            log = ChangeLog(batch_id, base_rows=kept, last_changed=since.last_changed)
        else:
            log = replace(since, last_changed=max(kept, released))
            if kept:
                log = replace(log, added=(*log.added, batch_id), added_rows=log.added_rows + kept)
            if released:
                log = replace(
                    log,
                    released=(*log.released, batch_id),
                    released_rows=log.released_rows + released,
                )
        log = replace(log, parts=(*(() if base else since.parts), batch_id))
        held = rows.drop(*hidden)
        self._publish(batch_id, state, held.schema.jsonValue(), log)
        if not out:
            return held.where(F.lit(False))
        return rows.sparkSession.read.schema(held.schema).parquet(
            self.path(f"{folder}/{PIECE}={OUT}")
        )

    def _counted(self, folder: str) -> tuple[int, int, int]:
        """The rows kept and handed on in a batch's one folder, and the versions they
        replace, from its files (a folder with none is removed)."""
        fs, where = self._fs_path(folder)
        data = _dataset(fs, where)
        if not data.files:
            fs.delete_dir(where)
            return 0, 0, 0
        table = data.to_table(columns=[PIECE, WAS])
        pieces = table.column(PIECE)
        kept = pc.sum(pc.equal(pieces, KEPT)).as_py() or 0
        return kept, table.num_rows - kept, table.num_rows - table.column(WAS).null_count

    def _publish(self, batch_id: int, state: HeldState, schema: object, log: ChangeLog) -> None:
        """Publish the batch's state (a small file naming its pieces) and drop the
        pieces no kept state names."""
        assert self.files is not None
        meta = {
            _POSITION: state.position,
            _CLOCK: state.clock,
            _SCHEMA: schema,
            _LOG: asdict(log),
            _ENDS: state.ends,
        }
        published = pa.table({}).replace_schema_metadata(
            {k: json.dumps(v).encode() for k, v in meta.items()}
        )
        self.files.write(batch_id, published)
        self._drop_unnamed()

    def _write_changes(self, batch_id: int, changes: Changes) -> ChangeLog:
        added = self._write(changes.added, _ADDED, batch_id)
        released = self._write(changes.released.select(HOLD), _RELEASED, batch_id)
        log = replace(changes.since, last_changed=max(added, released))
        if added:
            log = replace(log, added=(*log.added, batch_id), added_rows=log.added_rows + added)
        if released:
            log = replace(
                log, released=(*log.released, batch_id), released_rows=log.released_rows + released
            )
        return log

    def _write(self, rows: DataFrame, prefix: str, batch_id: int) -> int:
        """Write ``rows`` as the piece ``<prefix><batch id>`` and return its row count
        (from the Parquet footers); a piece with no rows is removed again."""
        path = self.path(f"{prefix}{batch_id}")
        rows.write.mode("overwrite").parquet(path)
        fs, where = self._fs_path(f"{prefix}{batch_id}")
        count: int = ds.dataset(where, filesystem=fs, format="parquet").count_rows()
        if not count and prefix != _BASE:
            fs.delete_dir(where)
        return count

    def _published(self, batch_id: int) -> tuple[dict[bytes, bytes], ChangeLog]:
        """A published state's metadata and its log. A state published before states
        named their pieces holds one base, ``rows-<batch id>``."""
        assert self.files is not None
        meta = self.files.read(batch_id).schema.metadata or {}
        named = json.loads(meta.get(_LOG, b"null"))
        if named is not None:
            for kind in ("added", "released", "parts"):
                named[kind] = tuple(named.get(kind, ()))
            return meta, ChangeLog(**named)
        if json.loads(meta.get(_SCHEMA, b"null")) is None:
            return meta, ChangeLog()
        return meta, ChangeLog(batch_id)  # rows unknown: a new base at the next save

    def _drop_unnamed(self) -> None:
        """Remove the pieces no kept state names."""
        assert self.files is not None
        named = {p for b in self.files.batch_ids() for p in self._published(b)[1].folders()}
        fs, root = self.files.filesystem()
        for info in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True)):
            name = os.path.basename(info.path)
            if name.startswith(_PIECE_PREFIXES) and name not in named:
                fs.delete_dir(info.path)

    def path(self, piece: str) -> str:
        """Where the piece ``piece`` (e.g. ``rows-3``) is written (files only), for Spark."""
        assert self.directory is not None
        folder = self.directory
        if not urlparse(folder).scheme:
            folder = os.path.abspath(folder)
        return f"{folder.rstrip('/')}/{piece}"

    def _fs_path(self, piece: str) -> tuple[pafs.FileSystem, str]:
        assert self.files is not None
        fs, root = self.files.filesystem()
        return fs, f"{root}/{piece}"

    def counts(self) -> dict[str, int]:
        """The ``tuples`` and distinct ``roots`` (``_root``) of the newest saved state,
        read by pyarrow (files only; no Spark)."""
        saved = self.files.batch_ids() if self.files is not None else []
        if not saved:
            return {"tuples": 0, "roots": 0}
        _, log = self._published(max(saved))
        fs = self._fs_path("")[0]
        tables, gone = [], []
        for folder, column in log.released_folders():
            ids = _dataset(fs, self._fs_path(folder)[1]).to_table(columns=[column]).column(column)
            gone.append(ids.drop_null())
        for folder in log.held_folders():  # a window's partial rows carry no root: rows
            data = _dataset(fs, self._fs_path(folder)[1])
            columns = [c for c in ("_root", HOLD) if c in data.schema.names]
            tables.append(data.to_table(columns=columns))
        if not tables:
            return {"tuples": 0, "roots": 0}
        rows = pa.concat_tables(tables, promote_options="default")
        if gone and HOLD in rows.column_names:
            released = pa.chunked_array(gone).combine_chunks()
            rows = rows.filter(pc.invert(pc.is_in(rows.column(HOLD), value_set=released)))
        if "_root" not in rows.column_names:
            return {"tuples": rows.num_rows, "roots": 0}
        roots = rows.column("_root").drop_null()
        return {"tuples": rows.num_rows, "roots": pc.count_distinct(roots).as_py()}


def _dataset(fs: pafs.FileSystem, where: str) -> ds.Dataset:
    """The Parquet files under ``where``, a batch's one folder read by its parts."""
    skipped = [".", "_SUCCESS"]  # not "_": a part's folder is "_piece=..."
    return ds.dataset(
        where, filesystem=fs, format="parquet", partitioning="hive", ignore_prefixes=skipped
    )


def held_counts(folder: str) -> dict[str, dict[str, int]]:
    """Per stage, the ``tuples`` and distinct ``roots`` its newest saved state holds,
    read from a held-store ``folder`` (``<checkpoint>/topology/ackstream-held``); {}
    when there is none. Plain paths only; no Spark."""
    if not os.path.isdir(folder):
        return {}
    stages = sorted(name for name in os.listdir(folder) if name != TOKENS)
    return {stage: HeldStore(os.path.join(folder, stage)).counts() for stage in stages}
