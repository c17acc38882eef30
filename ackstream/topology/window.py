"""Windows: a keyed stage that holds its input tuples across micro-batches.

``Topology.window(keys, *aggs, ...)`` holds the tuples of each key until a window
closes, in any number of batches; then it emits one output row per key and window,
``groupBy(keys).agg(*aggs)`` over the window's tuples, anchored to all of them (across
roots and batches). When a window closes is its :class:`~ackstream.topology.
window_closing.Closing`'s business: every k tuples (Storm's tumbling count window,
``count=k``) or by time (``duration=``, ``slide=``: Storm's tumbling and sliding
duration windows, Spark's ``window()``, by processing or event time). A tuple stays
held until the last window that holds it has closed. Its tree stays open meanwhile:

Held tuples are acked as :mod:`ackstream.topology.holding` says (a hold id per
tuple, telescoped), dropped when their root has an outcome elsewhere, and what
changed is saved per batch beside the checkpoint with the closing's clock, so a
driver restart keeps them. The window's output row carries ``_group`` as an
aggregate's does (telescoped): if it fails, every root of its window's tuples fails. Per stage,
every output row is multi-anchored (``_anchors``) to its window's tuples, with a
child edge per window, so a tuple in several sliding windows anchors each apart.

Spark's own stateful operators (``groupBy().count()`` with a state store,
``transformWithState``) run inside a streaming query's plan; a topology's stages run
inside ``foreachBatch`` on a static DataFrame per batch, where Spark keeps no state,
so the window keeps its own.
"""

from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ackstream.errors import StageError
from ackstream.lineage import ANCHORS, EDGE, GROUP, REASON, ROOT
from ackstream.topology.anchoring import GroupInput, anchor_list
from ackstream.topology.bolts import BatchContext, Stage, StageOutput
from ackstream.topology.holding import Holding
from ackstream.topology.window_closing import SINCE, Closing

__all__ = ["WindowStage"]

_GROUP_ID = "_group_id"


class WindowStage(Stage):
    """Per key, one output row for each window its ``closing`` closes, holding tuples
    across batches until their last window has closed (see the module doc)."""

    kind = "window"

    def __init__(
        self,
        number: int,
        keys: Iterable[str | Column],
        aggs: Iterable[Column],
        closing: Closing,
        name: str | None = None,
    ):
        super().__init__(number, name)
        self.keys, self.aggs, self.closing = list(keys), list(aggs), closing
        self.idle_batch_ms = closing.idle_batch_ms
        if not self.aggs:
            raise StageError(self.name, "needs at least one aggregate expression")
        self.holding = Holding(self.name, number, self.kind)

    def run(self, df: DataFrame, ctx: BatchContext) -> StageOutput:
        """The windows this batch closes, from the tuples held before it and ``df``;
        saves what stays held (``context`` says where, and which roots finished).
        ``StageOutput.acked`` is the tuples released (per-stage acks ack those, not the
        input), ``holds`` the ``(root, value)`` pairs of the new and released holds
        (telescoped), ``fails`` the other roots of held tuples dropped and ``rejected``
        the late tuples."""
        tracking, edges = ctx.mode.tracks, ctx.mode.anchoring.edges
        df = self.holding.holdable(df, ctx)
        before = self.holding.before(df.sparkSession, ctx)
        stamped = self.holding.stamp(self.holding.arriving(df, ctx), self.keys, ctx)
        new = self.closing.stamp(
            stamped.withColumn(SINCE, F.lit(ctx.batch_id).cast("long")), ctx.now_ms, self.name
        )
        closed = self.closing.close(
            before.and_new(new), self.keys, before.clock, ctx.now_ms, self.name
        )
        holds = self.holding.keep(closed.kept, closed.released, ctx, before, closed.clock)
        windows = closed.windows
        grouped = windows.groupBy(*self.keys, *closed.group_columns)
        cached = (*closed.cached, *before.cached)
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
            return StageOutput(
                out.drop(*closed.hidden),
                rejected=rejected,
                cached=cached,
                groups=GroupInput(windows, group_id),
                fails=before.fails,
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
            fails=before.fails,
        )
