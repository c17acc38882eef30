"""A stream-stream join that waits for its other side across micro-batches.

``Topology.join(left, right, on)`` is an inner equi-join of two streams (the spout's
or earlier stages') on the key column(s) ``on``, as a Storm bolt that subscribes to
two components and keeps each tuple in memory until its match arrives: a tuple that
finds no match in its batch is held, in any number of batches, until a tuple of the
other side with the same key arrives. The batch in which a tuple first gets a match
releases it: one output row per matching pair among every tuple of that key the
batch has (held ones and new ones, of both sides), anchored to both of its inputs.
A released tuple is done, so a tuple of its key arriving later waits for a new
match: it never meets the released one (its root was acked).

``within`` bounds the wait, by processing time, as Storm's ``JoinBolt`` joins within
a window: a tuple still without a match at the first batch ``within`` or more after
it came is let go, acked, and meets no tuple of that batch. ``how="left"`` (Storm's
``leftJoin``, which needs the bound) then emits a left tuple let go with nulls for
the right side's columns, as it does at once a left tuple with a null key; a right
tuple let go is dropped. While tuples wait for their bound, the source runs a batch
with nothing new every ``within`` (``ackstream.idleBatchInterval``), so a tuple may
wait up to twice the bound plus a batch: the bound must leave that within the
message timeout.

Output rows have the key columns once, then the left side's other columns, then the
right side's; a right column whose name the left side (or a key) has too gets
``suffix`` (``"_right"`` by default), as in Polars' ``join``. A tuple with a null key
can never match: it is dropped, and acked, as a filter drops a row (a left join
emits a left one with nulls).

Acks, as the count window's (:mod:`ackstream.topology.window`):

- telescoped (the default): a tuple still held at the end of its batch adds a fresh
  id ``h`` to its root's XOR (``ACK (root, h)``), so its tree stays open and goes to
  the acker; the batch that releases it sends ``ACK (root, h)`` again. The output row
  carries ``_anchors`` with both roots (edges null: nothing acks them), so a failed
  row fails the roots of both of its inputs, of whichever batches.
- per-stage: a held tuple is not acked until it is released; then its edge is acked
  XOR the edges of its pairs. The pair (l, r) is a child with the edge
  ``xxhash64(l._edge, stage, r._edge)``, distinct per pair, multi-anchored
  (``_anchors``) to the roots of both.

The message timeout applies: a root whose tuple waits too long times out in the
acker and its record is replayed (and held again, if it still finds no match). The
held tuple of a root that has an outcome (timed out, or failed elsewhere), or that
was held longer than the message timeout, is dropped at the start of a batch, as the
window drops it. Held rows are saved per batch beside the checkpoint
(:mod:`ackstream.topology.held_store`), so a driver restart keeps them and a batch run
again starts from the rows held before it.

Either side may come after an aggregate, a window or another join: rows that carry
a group are anchored to their roots first, and a row of several roots is held with
all of them (see :mod:`ackstream.topology.holding`).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from ackstream.errors import StageError
from ackstream.topology.anchoring import ANCHOR_TYPE
from ackstream.topology.bolts import BatchContext, Stage, StageOutput
from ackstream.topology.graph import join_streams
from ackstream.topology.holding import FRESH, HELD_MS, Holding, roots_of
from ackstream.topology.modes import Mode
from ackstream.vocabulary.lineage import ANCHORS, EDGE, LINEAGE_COLUMNS, ROOT

__all__ = ["HOW", "JoinColumns", "WaitingJoinStage", "check_within"]

#: the side a row of the join's input came from: 0 left, 1 right
SIDE = "_side"
#: the joins a :class:`WaitingJoinStage` does
HOW = ("inner", "left")
_MATCHED, _EXPIRED = "_matched", "_expired"
_L_ROOTS, _L_EDGE, _R_ROOTS, _R_EDGE = "_l_roots", "_l_edge", "_r_roots", "_r_edge"


@dataclass(frozen=True)
class JoinColumns:
    """The columns of a join's input, as the batch's two streams have them: the keys,
    each side's other columns (the right's as they are named in the output) and the
    lineage columns the streams carry."""

    keys: tuple[str, ...]
    left: tuple[str, ...]
    right: tuple[str, ...]
    lineage: tuple[str, ...]


class WaitingJoinStage(Stage):
    """An equi-join of the streams ``left`` and ``right`` on ``keys`` that holds each
    side's tuples across batches until their match arrives, or (``within_ms``) until
    the bound passes; ``how="left"`` then emits the left ones with nulls (see the
    module doc)."""

    kind = "join"

    def __init__(
        self,
        number: int,
        left: str,
        right: str,
        keys: Iterable[str],
        suffix: str,
        how: str = "inner",
        within_ms: int | None = None,
        name: str | None = None,
    ):
        super().__init__(number, name)
        self.left, self.right, self.keys, self.suffix = left, right, tuple(keys), suffix
        if left == right:
            raise StageError(self.name, f"joins the stream {left!r} with itself: give two streams")
        if not self.keys or not all(isinstance(k, str) and k for k in self.keys):
            raise StageError(self.name, f"on={keys!r}: give the key column name(s) both sides have")
        if not isinstance(suffix, str) or not suffix:
            raise StageError(self.name, f"suffix={suffix!r}: give a non-empty string")
        if how not in HOW:
            raise StageError(self.name, f"how={how!r}: give one of {', '.join(map(repr, HOW))}")
        if how == "left" and within_ms is None:
            raise StageError(
                self.name,
                "how='left' emits a left tuple without a match once its wait is over: "
                "give within= (e.g. within='10s')",
            )
        self.how, self.within_ms = how, within_ms
        self.idle_batch_ms = within_ms  # a bound passes without new records too
        self.holding = Holding(self.name, number, self.kind)
        self.columns: JoinColumns | None = None  # set by combine, each batch

    def combine(self, streams: Mapping[str, DataFrame]) -> DataFrame:
        """The two streams as one frame, each row tagged with its side (``_side``), the
        right side's columns renamed as in the output (see :class:`JoinColumns`)."""
        left, right = streams[self.left], streams[self.right]
        for side, frame in ((self.left, left), (self.right, right)):
            missing = [k for k in self.keys if k not in frame.columns]
            if missing:
                raise StageError(self.name, f"stream {side!r} has no key column(s) {missing}")
        types_l, types_r = dict(left.dtypes), dict(right.dtypes)
        differ = [f"{k}: {types_l[k]}, {types_r[k]}" for k in self.keys if types_l[k] != types_r[k]]
        if differ:
            raise StageError(
                self.name, f"the key types differ ({'; '.join(differ)}): cast one side first"
            )
        own = [c for c in left.columns if c not in self.keys and c not in LINEAGE_COLUMNS]
        theirs = [c for c in right.columns if c not in self.keys and c not in LINEAGE_COLUMNS]
        taken = set(own) | set(self.keys)
        named = {c: c + self.suffix if c in taken else c for c in theirs}
        clash = sorted(n for c, n in named.items() if n != c and n in set(theirs) | taken)
        if clash:
            raise StageError(
                self.name,
                f"suffix {self.suffix!r} gives column(s) {clash} that exist already: give "
                "another suffix=",
            )
        lineage = tuple(c for c in LINEAGE_COLUMNS if c in left.columns or c in right.columns)
        self.columns = JoinColumns(self.keys, tuple(own), tuple(named.values()), lineage)
        right = right.select(
            *self.keys,
            *(F.col(c).alias(named[c]) for c in theirs),
            *(c for c in lineage if c in right.columns),
        ).withColumn(SIDE, F.lit(1).cast("byte"))
        left = left.select(*self.keys, *own, *(c for c in lineage if c in left.columns)).withColumn(
            SIDE, F.lit(0).cast("byte")
        )
        return join_streams([left, right])  # a row's roots in one place, whichever side

    def run(self, df: DataFrame, ctx: BatchContext) -> StageOutput:
        """The pairs this batch's and the held tuples make (and, a left join, the left
        tuples whose wait is over with nulls); saves what changed in the tuples held
        (``ctx`` says where, and which roots finished). ``StageOutput.acked`` is
        the tuples released or dropped (per-stage acks ack those, not the input),
        ``holds`` the ``(root, value)`` pairs of the new and released holds
        (telescoped) and ``fails`` the other roots of held tuples dropped."""
        columns = self.columns
        if columns is None:
            raise StageError(self.name, "a join runs inside a topology batch")
        df = self.holding.holdable(df, ctx)
        before = self.holding.before(df.sparkSession, ctx)
        keyed = functools.reduce(operator.and_, (F.col(k).isNotNull() for k in self.keys))
        new = self.holding.arriving(df.where(keyed), ctx)
        expired = F.lit(False)
        if self.within_ms is not None:  # the bound passed before this batch: no match now
            expired = ~F.col(FRESH) & (F.col(HELD_MS) <= F.lit(ctx.now_ms - self.within_ms))
        by_key = Window.partitionBy(*self.keys)
        live = F.when(~F.col(_EXPIRED), F.col(SIDE))
        both = F.min(live).over(by_key) != F.max(live).over(by_key)
        marked = (
            self.holding.stamp(before.and_new(new), self.keys, ctx)  # one shuffle by key
            .withColumn(_EXPIRED, expired)
            .withColumn(_MATCHED, ~F.col(_EXPIRED) & F.coalesce(both, F.lit(False)))
            .persist()
        )  # kept, released and the pairs must come from one evaluation
        waits = ~F.col(_MATCHED) & ~F.col(_EXPIRED)
        kept = marked.where(waits).drop(_MATCHED, _EXPIRED)
        released = marked.where(~waits)
        holds = self.holding.keep(kept, released, ctx, before, None)
        out = self._pairs(marked.where(F.col(_MATCHED)), columns, ctx.mode)
        if self.how == "left":
            lefts = (F.col(SIDE) == 0) & F.col(_EXPIRED)
            alone = marked.where(lefts).select(*df.columns)
            alone = alone.unionByName(df.where(~keyed & (F.col(SIDE) == 0)))
            out = out.unionByName(self._alone(alone, columns, df, ctx.mode))
        cached = (marked, *before.cached)
        acked = None
        if ctx.mode.anchoring.edges:  # its acks name the edges of the tuples let go
            lineage = [c for c in (ROOT, EDGE, ANCHORS) if c in df.columns]
            acked = released.select(*lineage).unionByName(df.where(~keyed).select(*lineage))
        return StageOutput(out, cached=cached, acked=acked, fails=before.fails, holds=holds)

    def _pairs(self, released: DataFrame, columns: JoinColumns, mode: Mode) -> DataFrame:
        """One row per (left, right) pair of the released tuples with equal keys."""
        sides = F.col(SIDE)
        roots = roots_of(released)
        left = released.where(sides == 0).select(
            *columns.keys,
            *columns.left,
            *((roots.alias(_L_ROOTS), F.col(EDGE).alias(_L_EDGE)) if mode.carries_lineage else ()),
        )
        right = released.where(sides == 1).select(
            *columns.keys,
            *columns.right,
            *((roots.alias(_R_ROOTS), F.col(EDGE).alias(_R_EDGE)) if mode.carries_lineage else ()),
        )
        joined = left.join(right, list(columns.keys))
        payload = [*columns.keys, *columns.left, *columns.right]
        if not mode.carries_lineage:
            return joined.select(*payload)
        null = F.lit(None).cast("long")
        edge = mode.anchoring.edge(F.col(_L_EDGE), F.lit(self.number).cast("long"), F.col(_R_EDGE))
        both = F.array_distinct(F.concat(F.col(_L_ROOTS), F.col(_R_ROOTS)))  # longs: hashed
        return joined.select(*payload, null.alias(ROOT), edge.alias(EDGE), _anchors(both, edge))

    def _alone(
        self,
        lefts: DataFrame,
        columns: JoinColumns,
        combined: DataFrame,
        mode: Mode,
    ) -> DataFrame:
        """Left tuples without a match as output rows: nulls for the right side's
        columns; per stage the child's edge is ``xxhash64(left edge, stage)``."""
        nulls = [F.lit(None).cast(combined.schema[c].dataType).alias(c) for c in columns.right]
        payload: list[Column | str] = [*columns.keys, *columns.left, *nulls]
        if not mode.carries_lineage:
            return lefts.select(*payload)
        null = F.lit(None).cast("long")
        edge = mode.anchoring.edge(F.col(EDGE), F.lit(self.number).cast("long"))
        roots = F.array_distinct(roots_of(lefts))
        return lefts.select(*payload, null.alias(ROOT), edge.alias(EDGE), _anchors(roots, edge))


def check_within(stage: str, within_ms: int | None, message_timeout_ms: int, mode: Mode) -> None:
    """Refuse a bound that lets a tracked tuple wait past its message timeout: it may
    wait for the bound, then up to one idle batch's interval (the bound) and a batch."""
    if within_ms is None or not mode.holding_keeps_trees_open:
        return
    held = 2 * within_ms
    if held > message_timeout_ms:
        raise StageError(
            stage,
            f"within={within_ms} ms: a tuple may wait twice the bound ({held} ms), longer "
            f"than the message timeout ({message_timeout_ms} ms), and its root would time "
            "out first; shorten within or raise message_timeout_ms",
        )


def _anchors(roots: Column, edge: Column) -> Column:
    """``_anchors``: one entry per root, each with ``edge``."""
    anchors = F.transform(roots, lambda r: F.struct(r.alias("root"), edge.alias("edge")))
    return anchors.cast(ANCHOR_TYPE).alias(ANCHORS)
