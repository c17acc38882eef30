"""Count windows: a keyed stage that holds its input tuples across micro-batches.

``Topology.window(keys, *aggs, count=k)`` is Storm's tumbling count window per key
(``BaseWindowedBolt.withTumblingWindow(Count.of(k))`` behind a fields grouping):
the tuples of a key are held until k of them have arrived, in any number of
batches; then one output row per k tuples is emitted, ``groupBy(keys).agg(*aggs)``
over them, anchored to all k (across roots and batches). Tuples of a key that has
fewer than k wait. Their trees stay open meanwhile:

- telescoped acks (the default): a tuple still held at the end of its batch adds a
  fresh id ``h`` to its root's XOR (an ``ACK (root, h)`` record), so the batch
  cannot close the tree and it goes to the acker; the batch that releases the
  tuple sends ``ACK (root, h)`` again. The output row carries ``_group`` as an
  aggregate's does; if it fails, every root of its k inputs fails.
- per-stage acks: a held tuple is simply not acked until it is released; then its
  edge is acked and the output row is multi-anchored (``_anchors``) to all k.

The message timeout still applies: a root whose tuple is held too long times out in
the acker and its record is replayed (and held again). The held tuple of a root that
has an outcome (timed out, or failed elsewhere) is dropped, read from the completion
channel at the start of each batch, and so is a tuple held longer than the message
timeout (its root cannot be acked any more): the replay would otherwise be counted
twice. The held rows and the completion position are saved per batch beside the
checkpoint (:mod:`ackstream.topology.held_store`), so a driver restart keeps them.

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
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from ackstream import ids
from ackstream.errors import StageError
from ackstream.lineage import ANCHORS, EDGE, GROUP, ROOT
from ackstream.records import ACK, NOTICES, ack_table
from ackstream.topology.bolts import (
    BatchContext,
    GroupInput,
    Stage,
    StageOutput,
    anchor_list,
    is_multi_anchored,
)
from ackstream.topology.held_store import HeldState, HeldStore

__all__ = ["WindowStage", "finished_roots", "hold_ids"]

# columns of a held row besides the stage input's: its hold id (telescoped acks),
# the batch it arrived in and its place there (arrival order), and when it was held
HOLD, SINCE, SEQ, HELD_MS = "_hold", "_since", "_seq", "_held_ms"
_COUNT, _RANK, _WINDOW, _GROUP_ID = "_count", "_rank", "_window", "_group_id"


def hold_ids(roots: np.ndarray, batch_id: int, stage: int) -> np.ndarray:
    """A fresh id per held tuple: ``xxhash64(root, batch, stage, i)``, distinct within a
    batch by ``i`` and across batches by the batch id, so that no two held tuples of one
    root cancel each other in its XOR."""
    roots = np.asarray(roots, dtype=np.int64)
    return ids.hash_longs(roots, batch_id, stage, np.arange(len(roots), dtype=np.int64))


def finished_roots(completions: pa.Table) -> pa.Array:
    """The roots that have an outcome in ``completions`` (a notice is none)."""
    notice = pc.is_in(completions.column("status"), value_set=pa.array(NOTICES))
    notice = pc.fill_null(notice, False)
    return completions.filter(pc.invert(notice)).column("root").combine_chunks()


class WindowStage(Stage):
    """Per key, one output row for every ``count`` input tuples, holding tuples across
    batches until their window is full (see the module doc)."""

    kind = "window"

    def __init__(self, number: int, keys, aggs, count: int, name=None):
        super().__init__(number, name)
        self.keys, self.aggs, self.count = list(keys), list(aggs), count
        if not self.aggs:
            raise StageError(self.name, "needs at least one aggregate expression")
        if "/" in self.name or self.name.startswith("."):  # its held store's folder name
            raise StageError(self.name, "a window's name may not hold '/' or start with '.'")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise StageError(self.name, f"count={count!r}: give a whole number of tuples >= 1")
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
        """The windows this batch fills, from the tuples held before it and ``df``;
        saves what stays held (``context`` says where, and which roots finished).
        ``StageOutput.acked`` is the tuples released (per-stage acks ack those, not the
        input), ``records`` the new holds' ``ACK (root, h)`` and ``holds`` the released
        holds' ``(root, value)`` pairs (telescoped)."""
        if context is None:
            raise StageError(self.name, "a window runs inside a topology batch")
        ctx = context
        if tracking and (is_multi_anchored(df) or GROUP in df.columns):
            raise StageError(self.name, "a window after an aggregate or a window is not supported")
        store = self.store(ctx.folder)
        held, position = self._still_held(store, tracking, ctx)
        new = (
            df.withColumn(HOLD, F.lit(None).cast("long"))
            .withColumn(SINCE, F.lit(ctx.batch_id).cast("long"))
            .withColumn(SEQ, F.monotonically_increasing_id())
            .withColumn(HELD_MS, F.lit(ctx.now_ms).cast("long"))
        )
        rows = new
        if held is not None and held.num_rows:
            old = df.sparkSession.createDataFrame(held)
            rows = old.select(*(F.col(f.name).cast(f.dataType) for f in new.schema)).unionByName(
                new
            )
        by_key = Window.partitionBy(*self.keys)
        ranked = (
            rows.withColumn(_COUNT, F.count(F.lit(1)).over(by_key))
            .withColumn(_RANK, F.row_number().over(by_key.orderBy(SINCE, SEQ)))
            .persist()  # arrival order is fixed once: kept and released must agree
        )
        filled = F.col(_RANK) <= F.col(_COUNT) - F.col(_COUNT) % self.count
        released = ranked.where(filled).withColumn(
            _WINDOW, F.expr(f"({_RANK} - 1) div {self.count}")
        )
        kept = ranked.where(~filled).drop(_COUNT, _RANK).toArrow()
        kept, records = self._hold(kept, tracking and not edges, ctx)
        store.save(ctx.batch_id, HeldState(kept, position))
        grouped = released.groupBy(*self.keys, _WINDOW)
        if not tracking:
            return StageOutput(grouped.agg(*self.aggs).drop(_WINDOW), cached=(ranked,))
        null = F.lit(None).cast("long")
        if not edges:  # telescoped: roots only if the row fails, as an aggregate's
            group_id = F.xxhash64(
                *(F.col(k) if isinstance(k, str) else k for k in self.keys), F.col(_WINDOW)
            )
            group = F.struct(F.lit(self.number).alias("stage"), F.first(_GROUP_ID).alias("id"))
            out = (
                released.withColumn(_GROUP_ID, group_id)
                .groupBy(*self.keys, _WINDOW)
                .agg(*self.aggs, group.alias(GROUP), null.alias(EDGE), null.alias(ROOT))
            )
            holds = released.where(f"{HOLD} IS NOT NULL AND {ROOT} IS NOT NULL").selectExpr(
                f"{ROOT} AS root", f"{HOLD} AS value"
            )
            return StageOutput(
                out.drop(_WINDOW),
                cached=(ranked,),
                groups=GroupInput(released, group_id),
                records=records,
                holds=holds,
            )
        pair = F.xxhash64(
            F.col(EDGE).cast("long"), F.lit(self.number).cast("long"), F.lit(0).cast("long")
        )
        anchors = F.flatten(F.collect_list(anchor_list(released, pair)))
        edge = F.xxhash64(F.bit_xor(EDGE), F.lit(self.number).cast("long"))
        out = grouped.agg(*self.aggs, anchors.alias(ANCHORS), edge.alias(EDGE), null.alias(ROOT))
        return StageOutput(out.drop(_WINDOW), cached=(ranked,), acked=released)

    def _still_held(self, store: HeldStore, tracking: bool, ctx: BatchContext):
        """The rows held before this batch that may still be released, and the
        completion position read up to: a root with an outcome, or held longer than the
        message timeout, can no longer be acked, and its record is (or will be) replayed."""
        state = store.before(ctx.batch_id)
        held, position = (None, None) if state is None else (state.rows, state.position)
        if not tracking:
            return held, position
        if ctx.channel is not None:
            if state is None:  # our roots' completions all come after this
                position = ctx.channel.end_position()
            else:
                done, position = ctx.channel.completions_since(position)
                if held is not None and held.num_rows and done.num_rows:
                    gone = pc.is_in(held.column(ROOT), finished_roots(done))
                    held = held.filter(pc.invert(pc.fill_null(gone, False)))
        if held is not None and held.num_rows:
            held = held.filter(pc.greater(held.column(HELD_MS), ctx.now_ms - ctx.timeout_ms))
        return held, position

    def _hold(self, kept: pa.Table, telescoped: bool, ctx: BatchContext):
        """``kept`` with a hold id for each tuple newly held (telescoped acks) and the
        ``ACK (root, h)`` records of those; (kept, None) otherwise."""
        if not telescoped or not kept.num_rows:
            return kept, None
        fresh = np.flatnonzero(
            pc.and_(pc.is_null(kept.column(HOLD)), pc.is_valid(kept.column(ROOT))).to_numpy(
                zero_copy_only=False
            )
        )
        roots = kept.column(ROOT).take(pa.array(fresh)).to_numpy().astype(np.int64)
        given = hold_ids(roots, ctx.batch_id, self.number)
        hold = pc.fill_null(kept.column(HOLD), 0).to_numpy().copy()
        hold[fresh] = given
        mask = pc.is_null(kept.column(HOLD)).to_numpy(zero_copy_only=False).copy()
        mask[fresh] = False
        column = pa.array(hold, pa.int64(), mask=mask)
        kept = kept.set_column(kept.schema.get_field_index(HOLD), HOLD, column)
        return kept, ack_table(roots, given, ACK, ctx.now_ms)
