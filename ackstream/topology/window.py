"""Windows: a keyed stage that holds its input tuples across micro-batches.

``Topology.window(keys, *aggs, ...)`` holds the tuples of each key until a window
closes, in any number of batches; then it emits one output row per key and window,
``groupBy(keys).agg(*aggs)`` over the window's tuples, anchored to all of them (across
roots and batches). When a window closes is its :class:`~ackstream.topology.
window_closing.Closing`'s business: every k tuples (Storm's tumbling count window,
``count=k``) or by time (``duration=``, ``slide=``: Storm's tumbling and sliding
duration windows, Spark's ``window()``, by processing or event time). A tuple stays
held until the last window that holds it has closed. Its tree stays open meanwhile:

A time window whose aggregates merge holds one partial aggregate per window and key
instead (:mod:`ackstream.topology.window_aggregates`), and, tracked, its batches'
roots by token (:mod:`ackstream.topology.hold_tokens`). Otherwise, held tuples are
acked as :mod:`ackstream.topology.holding` says (a hold id per
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
from ackstream.topology.anchoring import Grouping
from ackstream.topology.bolts import BatchContext, Stage, StageOutput
from ackstream.topology.holding import Holding
from ackstream.topology.window_aggregates import held_aggregates
from ackstream.topology.window_closing import SINCE, Closing
from ackstream.topology.window_partials import Partial, partials_of
from ackstream.vocabulary.lineage import REASON

__all__ = ["WindowStage"]


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
        self._partials: list[Partial] | None | bool = False  # False: not analysed yet

    def partials(self, df: DataFrame) -> list[Partial] | None:
        """The aggregates as partials the window can hold (None: it holds rows), read
        once from the first batch's rows (see :mod:`ackstream.topology.window_partials`)."""
        if self._partials is False:
            self._partials = partials_of(df.sparkSession, df, self.aggs)
        return self._partials  # type: ignore[return-value]

    def run(self, df: DataFrame, ctx: BatchContext) -> StageOutput:
        """The windows this batch closes, from the tuples held before it and ``df``;
        saves what stays held (``ctx`` says where, and which roots finished).
        ``StageOutput.acked`` is the tuples released (per-stage acks ack those, not the
        input), ``holds`` the ``(root, value)`` pairs of the new and released holds
        (telescoped), ``fails`` the other roots of held tuples dropped and ``rejected``
        the late tuples. A time window whose aggregates merge holds one partial
        aggregate per window and key instead, untracked or with the batch's hold
        tokens (:mod:`ackstream.topology.window_aggregates`)."""
        by_partials = not ctx.mode.holding_keeps_trees_open or ctx.tokens is not None
        if by_partials and self.closing.holds_partials:
            partials = self.partials(df)
            if partials is not None:
                store = self.holding.store(ctx.folder)
                held = held_aggregates(
                    df, ctx, store, self.keys, partials, self.closing, self.name, self.number
                )
                if held is not None:
                    return held
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
        grouping = Grouping(
            self.number, self.keys, self.aggs, closed.group_columns, closed.window_id
        )
        out, groups = ctx.mode.anchoring.grouped(grouping, closed.windows)
        out = out.drop(*closed.hidden)
        cached = (*closed.cached, *before.cached)
        return StageOutput(
            out,
            rejected=None if closed.late is None else closed.late.select(*df.columns, REASON),
            cached=cached,
            groups=groups,
            acked=closed.released,
            fails=before.fails,
            holds=holds,
        )
