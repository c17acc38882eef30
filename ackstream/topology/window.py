"""Windows: a keyed stage that holds its input tuples across micro-batches.

``Topology.window(keys, *aggs, ...)`` holds the tuples of each key until a window
closes, in any number of batches; then it emits one output row per key and window,
``groupBy(keys).agg(*aggs)`` over the window's tuples, anchored to all of them (across
roots and batches). When a window closes is its :class:`~ackstream.topology.
window_closing.Closing`'s business: every k tuples (Storm's tumbling count window,
``count=k``) or by time (``duration=``, ``slide=``: Storm's tumbling and sliding
duration windows, Spark's ``window()``, by processing or event time). A tuple stays
held until the last window that holds it has closed. Its tree stays open meanwhile:

- telescoped acks (the default): a tuple still held at the end of its batch adds a
  fresh id ``h`` to its root's XOR (an ``ACK (root, h)`` record), so the batch
  cannot close the tree and it goes to the acker; the batch that releases the
  tuple sends ``ACK (root, h)`` again. The output row carries ``_group`` as an
  aggregate's does; if it fails, every root of its window's tuples fails.
- per-stage acks: a held tuple is simply not acked until it is released; every
  output row is multi-anchored (``_anchors``) to its window's tuples, with a child
  edge per window, so a tuple in several sliding windows anchors each apart.

The message timeout still applies: a root whose tuple is held too long times out in
the acker and its record is replayed (and held again). The held tuple of a root that
has an outcome (timed out, or failed elsewhere) is dropped, read from the completion
channel at the start of each batch, and so is a tuple held longer than the message
timeout (its root cannot be acked any more): the replay would otherwise be counted
twice. The held rows, the completion position and the closing's clock are saved
per batch beside the checkpoint (:mod:`ackstream.topology.held_store`), so a driver
restart keeps them.

Spark's own stateful operators (``groupBy().count()`` with a state store,
``transformWithState``) run inside a streaming query's plan; a topology's stages run
inside ``foreachBatch`` on a static DataFrame per batch, where Spark keeps no state,
so the window keeps its own.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ackstream import ids
from ackstream.errors import StageError
from ackstream.lineage import ANCHORS, EDGE, GROUP, REASON, ROOT
from ackstream.records import ACK, FAIL, NOTICES, ack_table
from ackstream.topology.bolts import (
    BatchContext,
    GroupInput,
    Stage,
    StageOutput,
    anchor_list,
    anchored_to_roots,
)
from ackstream.topology.held_store import HeldState, HeldStore
from ackstream.topology.window_closing import SEQ, SINCE, Closing

__all__ = ["WindowStage", "finished_roots", "hold_ids"]

# columns of a held row besides the stage input's and its closing's: its hold id
# (telescoped acks) and when it was held
HOLD, HELD_MS = "_hold", "_held_ms"
_GROUP_ID = "_group_id"


def hold_ids(roots: np.ndarray, batch_id: int, stage: int) -> np.ndarray:
    """A fresh id per held tuple: ``xxhash64(root, batch, stage, i)``, distinct within a
    batch by ``i`` and across batches by the batch id, so that no two held tuples of one
    root cancel each other in its XOR."""
    roots = np.asarray(roots, dtype=np.int64)
    return ids.hash_longs(roots, batch_id, stage, np.arange(len(roots), dtype=np.int64))


def root_pairs(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """``(row, root)`` for every root each row of ``table`` is anchored to (``_root``,
    or each entry of ``_anchors``), as two int64 arrays; rows with no root have none."""
    rows = [np.empty(0, np.int64)]
    roots = [np.empty(0, np.int64)]
    if ROOT in table.column_names:
        own = table.column(ROOT).combine_chunks()
        at = np.flatnonzero(own.is_valid().to_numpy(zero_copy_only=False))
        rows.append(at)
        roots.append(own.take(pa.array(at)).to_numpy(zero_copy_only=False).astype(np.int64))
    if ANCHORS in table.column_names:
        anchors = table.column(ANCHORS).combine_chunks()
        parents = pc.list_parent_indices(anchors).to_numpy(zero_copy_only=False)
        entries = pc.list_flatten(anchors).field("root")
        valid = entries.is_valid().to_numpy(zero_copy_only=False)
        rows.append(parents[valid].astype(np.int64))
        roots.append(entries.drop_null().to_numpy(zero_copy_only=False).astype(np.int64))
    return np.concatenate(rows), np.concatenate(roots)


def _hold_pairs(released: DataFrame) -> DataFrame:
    """``(root, value)``: each released row's hold id, once for every root it holds."""
    held = released.where(F.col(HOLD).isNotNull())
    pairs = held.select(F.col(ROOT).alias("root"), F.col(HOLD).alias("value"))
    if ANCHORS in released.columns:
        anchored = held.select(F.inline(ANCHORS), F.col(HOLD).alias("value"))
        pairs = pairs.unionByName(anchored.select("root", "value"))
    return pairs.where("root IS NOT NULL")


def finished_roots(completions: pa.Table) -> pa.Array:
    """The roots that have an outcome in ``completions`` (a notice is none)."""
    notice = pc.is_in(completions.column("status"), value_set=pa.array(NOTICES))
    notice = pc.fill_null(notice, False)
    return completions.filter(pc.invert(notice)).column("root").combine_chunks()


class WindowStage(Stage):
    """Per key, one output row for each window its ``closing`` closes, holding tuples
    across batches until their last window has closed (see the module doc)."""

    kind = "window"

    def __init__(self, number: int, keys, aggs, closing: Closing, name=None):
        super().__init__(number, name)
        self.keys, self.aggs, self.closing = list(keys), list(aggs), closing
        self.idle_batch_ms = closing.idle_batch_ms
        if not self.aggs:
            raise StageError(self.name, "needs at least one aggregate expression")
        if "/" in self.name or self.name.startswith("."):  # its held store's folder name
            raise StageError(self.name, "a window's name may not hold '/' or start with '.'")
        self._stores: dict[str | None, HeldStore] = {}

    def store(self, folder: str | None) -> HeldStore:
        """This stage's held store in ``folder`` (None: in memory, kept by the stage)."""
        if folder not in self._stores:
            self._stores[folder] = HeldStore(
                None if folder is None else os.path.join(folder, self.name)
            )
        return self._stores[folder]

    def run(
        self,
        df: DataFrame,
        tracking: bool,
        edges: bool = True,
        context: BatchContext | None = None,
    ) -> StageOutput:
        """The windows this batch closes, from the tuples held before it and ``df``;
        saves what stays held (``context`` says where, and which roots finished).
        ``StageOutput.acked`` is the tuples released (per-stage acks ack those, not the
        input), ``records`` the new holds' ``ACK (root, h)``, ``holds`` the released
        holds' ``(root, value)`` pairs (telescoped) and ``rejected`` the late tuples."""
        if context is None:
            raise StageError(self.name, "a window runs inside a topology batch")
        ctx = context
        if tracking and GROUP in df.columns:  # after an aggregate: hold its roots as anchors
            df = anchored_to_roots(df, ctx.groups)
        store = self.store(ctx.folder)
        state = store.before(ctx.batch_id)
        held, position, dropped = self._still_held(state, tracking, ctx)
        new = self.closing.stamp(
            df.withColumn(HOLD, F.lit(None).cast("long"))
            .withColumn(SINCE, F.lit(ctx.batch_id).cast("long"))
            .withColumn(SEQ, F.monotonically_increasing_id())
            .withColumn(HELD_MS, F.lit(ctx.now_ms).cast("long")),
            ctx.now_ms,
            self.name,
        )
        rows = new
        if held is not None and held.num_rows:
            old = df.sparkSession.createDataFrame(held)
            rows = old.select(*(F.col(f.name).cast(f.dataType) for f in new.schema)).unionByName(
                new
            )
        clock = None if state is None else state.clock
        closed = self.closing.close(rows, self.keys, clock, ctx.now_ms, self.name)
        kept, records = self._hold(closed.kept.toArrow(), tracking and not edges, ctx)
        if dropped is not None:
            records = dropped if records is None else pa.concat_tables([records, dropped])
        store.save(ctx.batch_id, HeldState(kept, position, closed.clock))
        windows = closed.windows
        grouped = windows.groupBy(*self.keys, *closed.group_columns)
        cached = closed.cached
        if not tracking:
            return StageOutput(grouped.agg(*self.aggs).drop(*closed.hidden), cached=cached)
        rejected = None if closed.late is None else closed.late.select(*df.columns, REASON)
        null = F.lit(None).cast("long")
        if not edges:  # telescoped: roots only if the row fails, as an aggregate's
            group_id = F.xxhash64(
                *(F.col(k) if isinstance(k, str) else k for k in self.keys), closed.window_id
            )
            group = F.struct(F.lit(self.number).alias("stage"), F.first(_GROUP_ID).alias("id"))
            out = (
                windows.withColumn(_GROUP_ID, group_id)
                .groupBy(*self.keys, *closed.group_columns)
                .agg(*self.aggs, group.alias(GROUP), null.alias(EDGE), null.alias(ROOT))
            )
            holds = _hold_pairs(closed.released)
            return StageOutput(
                out.drop(*closed.hidden),
                rejected=rejected,
                cached=cached,
                groups=GroupInput(windows, group_id),
                records=records,
                holds=holds,
            )
        # a tuple in several windows gets a child edge per window, so no two cancel
        pair = F.xxhash64(
            F.col(EDGE).cast("long"), F.lit(self.number).cast("long"), closed.window_id
        )
        anchors = F.flatten(F.collect_list(anchor_list(windows, pair)))
        edge = F.xxhash64(
            F.bit_xor(EDGE), F.lit(self.number).cast("long"), F.first(closed.window_id)
        )
        out = grouped.agg(*self.aggs, anchors.alias(ANCHORS), edge.alias(EDGE), null.alias(ROOT))
        return StageOutput(
            out.drop(*closed.hidden),
            rejected=rejected,
            cached=cached,
            acked=closed.released,
            records=records,
        )

    def _still_held(self, state: HeldState | None, tracking: bool, ctx: BatchContext):
        """The rows held before this batch (``state``) that may still be released, the
        completion position read up to, and FAIL records (or None) for the other roots
        of rows dropped. A row with a root that has an outcome, or held longer than the
        message timeout, can no longer be acked: its record is (or will be) replayed. A
        row of several roots (after an aggregate) goes with any of them, and its other
        roots fail at once, so that their replays bring its content back."""
        held, position = (None, None) if state is None else (state.rows, state.position)
        if not tracking:
            return held, position, None
        dropped = None
        if ctx.channel is not None:
            if state is None:  # our roots' completions all come after this
                position = ctx.channel.end_position()
            else:
                done, position = ctx.channel.completions_since(position)
                if held is not None and held.num_rows and done.num_rows:
                    held, dropped = self._without_finished(held, finished_roots(done), ctx)
        if held is not None and held.num_rows:
            held = held.filter(pc.greater(held.column(HELD_MS), ctx.now_ms - ctx.timeout_ms))
        return held, position, dropped

    def _without_finished(self, held: pa.Table, finished: pa.Array, ctx: BatchContext):
        """``held`` without the rows that have a finished root, and the FAIL records of
        those rows' other roots (None if there are none)."""
        rows, roots = root_pairs(held)
        over = pc.is_in(pa.array(roots), finished).to_numpy(zero_copy_only=False)
        gone = np.zeros(held.num_rows, dtype=bool)
        gone[rows[over]] = True
        held = held.filter(pa.array(~gone))
        others = gone[rows] & ~over
        if not others.any():
            return held, None
        why = f"held in window stage {self.name} with a root that failed or timed out"
        failing = np.unique(roots[others])
        return held, ack_table(failing, np.zeros(len(failing), np.int64), FAIL, ctx.now_ms, why)

    def _hold(self, kept: pa.Table, telescoped: bool, ctx: BatchContext):
        """``kept`` with a hold id for each tuple newly held (telescoped acks) and the
        ``ACK (root, h)`` records of those; (kept, None) otherwise."""
        if not telescoped or not kept.num_rows:
            return kept, None
        rows, roots = root_pairs(kept)
        unheld = pc.is_null(kept.column(HOLD)).to_numpy(zero_copy_only=False)
        fresh_pairs = unheld[rows]
        rows, roots = rows[fresh_pairs], roots[fresh_pairs]
        fresh, first = np.unique(rows, return_index=True)  # rows with a root, and one root each
        given = hold_ids(roots[first], ctx.batch_id, self.number)
        hold = pc.fill_null(kept.column(HOLD), 0).to_numpy().copy()
        hold[fresh] = given
        mask = unheld.copy()
        mask[fresh] = False
        column = pa.array(hold, pa.int64(), mask=mask)
        kept = kept.set_column(kept.schema.get_field_index(HOLD), HOLD, column)
        return kept, ack_table(roots, hold[rows], ACK, ctx.now_ms)
