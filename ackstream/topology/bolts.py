"""Bolt stages over tracked DataFrames: anchoring, acking and failing, vectorised.

A tracked row is a tuple, its lineage in columns (:mod:`ackstream.topology.anchoring`).
Every stage turns input tuples into children with fresh edge ids
``xxhash64(parent edge, stage, ordinal)`` and yields the ack contributions
Storm's bolt would send: each input tuple's anchor pairs (its own edges) plus
each child's anchor pairs (the children's edges, XORed into the parent's ack).
The tuple that reaches a sink is acked with its anchor pairs once written. Per
root these XOR to 0 when every tuple was acked, and a ``FAIL`` record fails a
root at once (it is replayed), a ``REJECT`` record dead-letters it without a
replay; both carry the tuple's ``_reason``. All of it is Spark SQL in the JVM;
only pandas bolts (:mod:`ackstream.topology.pandas_bolt`) call Python.

How a stage anchors its children (roots only, edge ids, or no lineage at all) is
asked of its topology's mode, ``BatchContext.mode``. :func:`failed_roots` finds the
roots of a failed row that carries ``_group`` (telescoped acks) from the
aggregation's input in that batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ackstream.channels.base import Channel
from ackstream.errors import StageError
from ackstream.sinks.continued import UpstreamResets
from ackstream.topology.anchoring import (
    Grouping,
    GroupInput,
    is_multi_anchored,
    roots_of_row,
)
from ackstream.topology.described import sql_text
from ackstream.topology.modes import UNTRACKED, Mode
from ackstream.vocabulary.lineage import (
    ANCHORS,
    GROUP,
    LINEAGE_COLUMNS,
    REASON,
    ROOT,
    ROOTS,
)

if TYPE_CHECKING:
    from ackstream.topology.hold_tokens import BatchTokens

__all__ = [
    "BatchContext",
    "StageOutput",
    "Stage",
    "MapStage",
    "FilterStage",
    "FailWhereStage",
    "RejectWhereStage",
    "SqlStage",
    "ExplodeStage",
    "AggregateStage",
    "anchored_to_roots",
    "failed_roots",
    "with_tree_roots",
]

_ORDINAL, _ERROR, _REJECT, _GROUP_ID = "_ordinal", "_error", "_rejected", "_group_id"
_GROUP_ROOTS, _GROUP_STAGE = "_group_roots", "_group_stage"


@dataclass(frozen=True)
class BatchContext:
    """What a stage may need of its batch beyond the rows: its topology's mode (how it
    tracks tuples), and for a stage that holds tuples (see :mod:`ackstream.topology.
    window`) the batch id, the time, the completion channel (None: none to read),
    ``timeout_ms``, the folder of held tuples (None: in memory) and the resets of
    trees a stage keeps alive (a pandas bolt's :class:`Collector`).

    ``timeout_ms`` is the topology's ``message_timeout_ms`` read as the longest a stage
    holds a tuple: one held longer is dropped, as its root is past the acker's timeout
    and replays. It times no tree out itself (the acker does, with its own topology's
    timeout: for a ``continue_trees`` topology the upstream one's), and an untracked
    topology's stages never read it."""

    mode: Mode
    batch_id: int
    now_ms: int
    channel: Channel | None
    timeout_ms: int
    folder: str | None
    #: how a stage resets the timeout of its rows' trees: only a topology that continues
    #: upstream trees has any that can time out while its batch runs (None: it has not)
    resets: UpstreamResets | None = None
    #: the aggregates' inputs of the batch so far, by stage: where the roots of a row
    #: that carries ``_group`` are found (a stage that holds rows needs them)
    groups: Mapping[int, GroupInput] = field(default_factory=dict)
    #: the batch's hold tokens, when its roots may wait for windows that hold partial
    #: aggregates (None: a tracked window holds rows and their roots)
    tokens: BatchTokens | None = None


@dataclass(frozen=True)
class StageOutput:
    """What a stage made of a batch: the children that go on, the tuples it failed
    (their roots fail at once and replay) and the tuples it rejected (their roots
    are dead-lettered without a replay); failed and rejected carry ``_reason``.
    ``groups``: an aggregate's input, when its rows carry ``_group``. A stage that
    holds tuples across batches (:mod:`ackstream.topology.window`) also says which
    tuples it ``acked`` (released; default: its whole input), the ``fails``,
    ``(root, reason)`` pairs to fail, and the ``holds``, ``(root, value)`` pairs to ack."""

    tuples: DataFrame
    failed: DataFrame | None = None
    rejected: DataFrame | None = None
    cached: tuple[
        DataFrame, ...
    ] = ()  # DataFrames the stage persisted, to unpersist after the batch
    groups: GroupInput | None = None
    acked: DataFrame | None = None
    fails: DataFrame | None = None
    holds: DataFrame | None = None


def failed_roots(df: DataFrame, groups: dict[int, GroupInput] | None = None) -> DataFrame:
    """``(root, reason)``: the roots the given tuples are anchored to, a row per anchor,
    with the tuple's reason (``_reason``; null if none). A row that carries ``_group``
    gets the roots of its group's input rows in ``groups`` (by aggregate stage). No
    ``distinct()``: that would be a shuffle, and pre-combination merges repeats."""
    reason = F.col(REASON) if REASON in df.columns else F.lit(None).cast("string")
    if is_multi_anchored(df):
        pairs = df.select(F.inline(ANCHORS), reason.alias("reason")).select("root", "reason")
    else:
        pairs = df.select(F.col(ROOT).alias("root"), reason.alias("reason"))
    pairs = pairs.where(F.col("root").isNotNull())
    if GROUP not in df.columns:
        return pairs
    groups = groups or {}
    for stage, source in groups.items():
        failing = df.where(F.col(GROUP)["stage"] == stage).select(
            F.col(GROUP)["id"].alias(_GROUP_ID), reason.alias(REASON)
        )
        inputs = (
            source.tuples.drop(REASON)
            .withColumn(_GROUP_ID, source.group_id)
            .join(F.broadcast(failing), _GROUP_ID)  # empty: Spark skips the input
        )
        earlier = {s: g for s, g in groups.items() if s < stage}
        pairs = pairs.unionByName(failed_roots(inputs, earlier))
    return pairs


def with_tree_roots(df: DataFrame, groups: dict[int, GroupInput] | None = None) -> DataFrame:
    """``df`` with ``_roots``: the distinct roots each row is anchored to, as an array
    (empty for an unanchored row). A row that carries ``_group`` gets the roots of its
    group's input rows in ``groups``, as :func:`failed_roots` finds them for a failed
    row; here every row needs them (a sink that continues the trees writes them)."""
    empty = F.array().cast("array<bigint>")
    own = F.when(F.col(ROOT).isNotNull(), F.array(F.col(ROOT))) if ROOT in df.columns else None
    own = empty if own is None else own.otherwise(empty)
    if is_multi_anchored(df):
        own = F.array_distinct(F.concat(F.coalesce(roots_of_row(), empty), own))
    out = df.withColumn(ROOTS, own)
    if GROUP not in df.columns:
        return out
    known = groups or {}
    for stage, source in known.items():
        earlier = {s: g for s, g in known.items() if s < stage}
        inputs = with_tree_roots(source.tuples.withColumn(_GROUP_ID, source.group_id), earlier)
        by_group = (
            inputs.select(_GROUP_ID, F.explode(ROOTS).alias("root"))
            .groupBy(_GROUP_ID)
            .agg(F.collect_set("root").alias(_GROUP_ROOTS))
            .withColumn(_GROUP_STAGE, F.lit(stage))
        )
        match = (F.col(GROUP)["stage"] == F.col(_GROUP_STAGE)) & (
            F.col(GROUP)["id"] == F.col(_GROUP_ID)
        )
        out = (
            out.join(by_group, match, "left")
            .withColumn(ROOTS, F.array_distinct(F.concat(ROOTS, F.coalesce(_GROUP_ROOTS, empty))))
            .drop(_GROUP_ID, _GROUP_ROOTS, _GROUP_STAGE)
        )
    return out


def anchored_to_roots(df: DataFrame, groups: Mapping[int, GroupInput]) -> DataFrame:
    """``df``, whose rows carry ``_group`` (telescoped acks), anchored to their roots
    instead: ``_anchors`` with a null edge per root (found as :func:`with_tree_roots`
    finds them), ``_root`` null, no ``_group``. What a stage that holds rows across
    batches keeps: the aggregate's input that ``_group`` points to is gone after the
    batch."""
    anchor = F.transform(
        F.col(ROOTS),
        lambda r: F.struct(r.alias("root"), F.lit(None).cast("long").alias("edge")),
    )
    rooted = with_tree_roots(df, dict(groups))
    return (
        rooted.withColumn(ANCHORS, anchor)
        .withColumn(ROOT, F.lit(None).cast("long"))
        .drop(GROUP, ROOTS)
    )


def check_lineage(stage: Stage, before: DataFrame, after: DataFrame) -> None:
    """A user function must keep the lineage columns it was given."""
    wanted = [c for c in LINEAGE_COLUMNS if c in before.columns]
    missing = [c for c in wanted if c not in after.columns]
    if missing:
        raise StageError(
            stage.name,
            f"its output lost the lineage column(s) {missing}; "
            "keep them, e.g. select('*', ...) or withColumn(...)",
        )


class Stage:
    """One bolt stage. ``number`` (1, 2, ...) enters the children's edge ids, so the
    stages of a topology must keep their order for ids to be reproducible."""

    kind = "stage"
    #: how often the source should run a batch with no new records while roots are in
    #: flight, for this stage to go on (a processing-time window); None: no need
    idle_batch_ms: int | None = None

    def __init__(self, number: int, name: str | None = None):
        self.number = number
        self.name = name or f"{self.kind}#{number}"
        #: the streams it subscribes to (see :mod:`ackstream.topology.graph`)
        self.after: tuple[str, ...] = ()

    def hold_roots(self) -> None:
        """A stage downstream holds tuples across batches (a window, a waiting join):
        this stage's rows should carry their roots (``_root`` or ``_anchors``), not a
        ``_group`` that the batches after cannot look up. Nothing to do for a stage
        whose rows keep their parents' lineage; an aggregate collects its rows' roots."""

    def combine(self, streams: Mapping[str, DataFrame]) -> DataFrame | None:
        """The one frame this stage reads from the streams it subscribes to (by name),
        for a stage that tells them apart (a join that waits for its other side: see
        :mod:`ackstream.topology.waiting_join`); None, as here: their union
        (:func:`ackstream.topology.graph.join_streams`)."""
        return None

    def run(self, df: DataFrame, ctx: BatchContext) -> StageOutput:
        """The stage's output for ``df`` in the batch ``ctx``, its lineage as the batch's
        mode says (``ctx.mode``: none, roots only, or fresh edge ids)."""
        raise NotImplementedError

    def declared_output(self, frame: DataFrame, mode: Mode) -> DataFrame | None:
        """What the stage makes of ``frame`` (a frame of no rows with its input's
        columns), planned but not run, for ``start()`` to check the user's code against
        the stream before the first batch; None, as here, for a stage whose output
        depends on rows held across batches (it is not known then)."""
        return None

    def analysed(self, frame: DataFrame) -> None:
        """Called once ``start()`` has analysed the stage's output over its input
        (``frame``: one of the streams it reads), whether or not that failed."""

    def _own_output(self, frame: DataFrame) -> DataFrame:
        """The stage's own expressions over ``frame`` without the lineage ackstream adds
        (its ids cannot fail on the user's columns)."""
        return self.run(frame, BatchContext(UNTRACKED, 0, 0, None, 0, None)).tuples


class MapStage(Stage):
    """Row-wise DataFrame code (``select``/``withColumn``/...): each input row gives
    at most one output row that keeps the lineage columns. A row it drops is acked."""

    kind = "map"

    def __init__(
        self, number: int, fn: Callable[[DataFrame], DataFrame] | None, name: str | None = None
    ):
        super().__init__(number, name)
        self.fn = fn  # None: a subclass overrides apply

    def apply(self, df: DataFrame) -> DataFrame:
        assert self.fn is not None, "a map stage without fn overrides apply"
        return self.fn(df)

    def run(self, df: DataFrame, ctx: BatchContext) -> StageOutput:
        out = self.apply(df)
        if ctx.mode.carries_lineage:
            check_lineage(self, df, out)
        return StageOutput(ctx.mode.anchoring.children(out, self.number))

    def declared_output(self, frame: DataFrame, mode: Mode) -> DataFrame:
        """The user's code over ``frame``, and the lineage it must keep when tracked."""
        out = self.apply(frame)
        if mode.carries_lineage:
            check_lineage(self, frame, out)
        return out


class FilterStage(MapStage):
    """Keep rows where ``condition`` holds; the others are acked (a filtered tuple is done)."""

    kind = "filter"

    def __init__(self, number: int, condition: Column | str, name: str | None = None):
        super().__init__(number, lambda df: df.where(condition), name)


class SqlStage(MapStage):
    """SQL text over the stage input, registered as the temp view ``view``. Row-wise,
    like :class:`MapStage`: select the lineage columns (``SELECT *, ...``)."""

    kind = "sql"

    def __init__(self, number: int, text: str, view: str = "tuples", name: str | None = None):
        super().__init__(number, None, name)
        self.text, self.view = text, view

    def apply(self, df: DataFrame) -> DataFrame:
        df.createOrReplaceTempView(self.view)
        return df.sparkSession.sql(self.text)

    def analysed(self, frame: DataFrame) -> None:
        """The view ``start()`` registered goes: each batch registers its own frame."""
        frame.sparkSession.catalog.dropTempView(self.view)


class FailWhereStage(Stage):
    """Fail the tuples where ``condition`` holds (Storm's ``collector.fail``): their
    roots fail at once and will be replayed; the other rows go on. ``reason`` (a
    string or a string column) goes to the dead letter if the last attempt fails."""

    kind = "fail_where"

    def __init__(
        self,
        number: int,
        condition: Column | str,
        reason: Column | str | None = None,
        name: str | None = None,
    ):
        super().__init__(number, name)
        self.condition = F.expr(condition) if isinstance(condition, str) else condition
        reason = f"{self.name}: {sql_text(condition)}" if reason is None else reason
        #: the reason's text when it is the same for every row (the stage's own, for
        #: ``status`` to charge a reason that names no stage to it), else None
        self.fixed_reason = None if isinstance(reason, Column) else str(reason)
        self.reason = reason if isinstance(reason, Column) else F.lit(str(reason))

    def run(self, df: DataFrame, ctx: BatchContext) -> StageOutput:
        failing = F.coalesce(self.condition, F.lit(False))
        if not ctx.mode.makes_ack_records:  # no fail to record: the row is dropped
            return StageOutput(df.where(~failing))
        df = df.persist()  # kept and failed rows must come from one evaluation of the input
        caught = df.where(failing).withColumn(REASON, self.reason.cast("string"))
        return self._output(
            ctx.mode.anchoring.children(df.where(~failing), self.number), caught, cached=(df,)
        )

    def declared_output(self, frame: DataFrame, mode: Mode) -> DataFrame:
        """``frame`` itself, once its condition and reason are analysed over it."""
        frame.select(self.condition, self.reason).schema  # noqa: B018 - analyses both
        return frame

    def _output(
        self, kept: DataFrame, caught: DataFrame, cached: tuple[DataFrame, ...]
    ) -> StageOutput:
        return StageOutput(kept, failed=caught, cached=cached)


class RejectWhereStage(FailWhereStage):
    """Reject the tuples where ``condition`` holds: the input record itself is at fault
    (undecodable, null, out of range), so its root is dead-lettered at once with
    ``reason``, without the replays a fail gets. The other rows go on."""

    kind = "reject_where"

    def _output(
        self, kept: DataFrame, caught: DataFrame, cached: tuple[DataFrame, ...]
    ) -> StageOutput:
        return StageOutput(kept, rejected=caught, cached=cached)


class ExplodeStage(Stage):
    """One-to-many: one child per element of the array (or map) ``column``, named
    ``alias``; the element's position is the ordinal of the child's edge id, so
    children are distinct and the same on every re-run. A row with an empty or
    null array has no children and is acked."""

    kind = "explode"

    def __init__(self, number: int, column: Column | str, alias: str, name: str | None = None):
        super().__init__(number, name)
        self.column = F.col(column) if isinstance(column, str) else column
        self.alias = alias
        # built once, as the aggregate's: each Column is a few calls into the JVM
        self._elements = F.explode(self.column).alias(alias)
        self._positioned = F.posexplode(self.column).alias(_ORDINAL, alias)

    def run(self, df: DataFrame, ctx: BatchContext) -> StageOutput:
        anchoring = ctx.mode.anchoring
        if not anchoring.edges:  # no edge ids: the element's position is not needed
            return StageOutput(df.select("*", self._elements))
        out = anchoring.children(df.select("*", self._positioned), self.number, F.col(_ORDINAL))
        return StageOutput(out.drop(_ORDINAL))

    def declared_output(self, frame: DataFrame, mode: Mode) -> DataFrame:
        return self._own_output(frame)


class AggregateStage(Stage):
    """Many-to-one within the batch: ``groupBy(*keys).agg(*aggs)``. Each output row is
    anchored to all of its input tuples, across roots (multi-anchoring): the pair
    (parent p, output row) gets edge ``xxhash64(p._edge, stage, 0)`` (a parent lies in
    one group only), the parent is acked with its edge XOR the pair edge, and the
    output row keeps every pair in ``_anchors`` until it is acked."""

    kind = "aggregate"

    def __init__(
        self,
        number: int,
        keys: Iterable[str | Column],
        aggs: Iterable[Column],
        name: str | None = None,
    ):
        super().__init__(number, name)
        self.keys, self.aggs = list(keys), list(aggs)
        if not self.aggs:
            raise StageError(self.name, "needs at least one aggregate expression")
        self.grouping = Grouping(number, self.keys, self.aggs)  # its Columns built once
        #: telescoped: give each output row its roots as ``_anchors`` (null edges) in the
        #: aggregation itself, instead of ``_group`` (see :meth:`hold_roots`)
        self.keeps_roots = False

    def hold_roots(self) -> None:
        self.keeps_roots = True

    def run(self, df: DataFrame, ctx: BatchContext) -> StageOutput:
        out, groups = ctx.mode.anchoring.grouped(self.grouping, df, held=self.keeps_roots)
        return StageOutput(out, groups=groups)

    def declared_output(self, frame: DataFrame, mode: Mode) -> DataFrame:
        return self._own_output(frame)
