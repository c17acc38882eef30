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
only pandas bolts call Python.

How a stage anchors its children (roots only, edge ids, or no lineage at all) is
asked of its topology's mode, ``BatchContext.mode``. :func:`failed_roots` finds the
roots of a failed row that carries ``_group`` (telescoped acks) from the
aggregation's input in that batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
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
from ackstream.topology.modes import Mode
from ackstream.vocabulary.lineage import (
    ANCHORS,
    EDGE,
    GROUP,
    LINEAGE_COLUMNS,
    REASON,
    REASON_LIMIT,
    ROOT,
    ROOTS,
)

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

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
    "PandasBoltStage",
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
        if ctx.mode.tracks:
            check_lineage(self, df, out)
        return StageOutput(ctx.mode.anchoring.children(out, self.number))


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
        if not ctx.mode.tracks:
            return StageOutput(df.where(~failing))
        df = df.persist()  # kept and failed rows must come from one evaluation of the input
        caught = df.where(failing).withColumn(REASON, self.reason.cast("string"))
        return self._output(
            ctx.mode.anchoring.children(df.where(~failing), self.number), caught, cached=(df,)
        )

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


class Collector:
    """What a pandas bolt declared with ``collector=True`` is given beside its chunk, as
    a Storm bolt is given its ``OutputCollector``: emits are its output; the collector
    adds :meth:`fail` and :meth:`reject` (the way to fail records in Python: no
    exception, so no isolation) and :meth:`reset_timeout`.

    ``rows`` names rows of the chunk the call was given: a boolean mask of its length
    (``frame["n"] < 0``) or the chunk's index labels, which are its positions (an int,
    a list or array of them, ``frame.index[mask]``)."""

    def __init__(
        self,
        size: int,
        roots: pd.Series | None = None,
        resets: UpstreamResets | None = None,
        stage: str = "",
    ):
        self._size, self._roots, self._resets, self._stage = size, roots, resets, stage
        #: per row of the chunk: 0 goes on, FAILED or REJECTED (reject wins over fail)
        self.verdicts = np.zeros(size, np.int8)
        self.reasons = np.full(size, None, dtype=object)

    def fail(self, rows: npt.ArrayLike, reason: str) -> None:
        """Storm's ``collector.fail``: the roots of ``rows`` fail (replayed after a
        backoff, a retry counted; after the last retry dead-lettered with ``reason``,
        after the stage's name). Their outputs are dropped; the rest of the chunk goes
        on. Untracked (``tracking=False``) nothing replays: the rows' outputs are
        dropped, as ``fail_where`` drops its rows."""
        self._mark(rows, reason, _FAILED)

    def reject(self, rows: npt.ArrayLike, reason: str) -> None:
        """Dead-letter the roots of ``rows`` at once with ``reason``, without replays
        (as ``reject_where``): the records themselves are at fault. Their outputs are
        dropped; untracked, only that."""
        self._mark(rows, reason, _REJECTED)

    def _mark(self, rows: npt.ArrayLike, reason: str, verdict: int) -> None:
        at = self._positions(rows)
        self.verdicts[at] = np.maximum(self.verdicts[at], verdict)
        self.reasons[at] = f"{self._stage}: {reason}"[:REASON_LIMIT]

    def _positions(self, rows: npt.ArrayLike) -> np.ndarray:
        """The positions ``rows`` names (see the class doc), checked."""
        given = np.atleast_1d(np.asarray(rows))
        if given.dtype == bool and given.shape == (self._size,):
            return np.flatnonzero(given)
        if not given.size:
            return np.empty(0, np.int64)
        integers = given.ndim == 1 and given.dtype.kind in "iu"
        if integers and given.min() >= 0 and given.max() < self._size:
            return given.astype(np.int64)
        raise ValueError(
            f"collector rows must be a boolean mask of the chunk's {self._size} rows or "
            f"positions in 0..{self._size - 1} (its index), not {given[:5].tolist()!r}"
        )

    def reset_timeout(self, rows: npt.ArrayLike | None = None) -> int:
        """Storm's ``collector.resetTimeout``: restart the message timeout of the trees of
        ``rows`` (see the class doc; None: every row), for work that outlasts the
        timeout. Call it more often than the timeout. Returns how many trees were reset.

        Only trees that an upstream topology keeps open can time out while a batch
        runs (``Topology(..., continue_trees=True)``): a topology's own records wait
        for its batch, whose deadline bounds it instead (``batch_deadline_ms``), so
        elsewhere this resets nothing and returns 0."""
        if self._resets is None or self._roots is None:
            return 0
        roots = self._roots if rows is None else self._roots.iloc[np.atleast_1d(rows)]
        return self._resets.reset(int(r) for r in roots.dropna())

    def kept(self, parent: np.ndarray) -> np.ndarray:
        """Mask of output rows (by ``parent`` position, -1: unanchored) that go on: those
        of rows neither failed nor rejected."""
        going = parent < 0
        going[~going] = self.verdicts[parent[~going]] == 0
        return going


#: :attr:`Collector.verdicts` of a failed row and of a rejected one.
_FAILED, _REJECTED = 1, 2


class PandasBoltStage(Stage):
    """A bolt in pandas: ``fn(frame) -> frame`` gets a chunk of input rows (payload
    columns only, index 0..n-1) and returns the output rows, each indexed by the
    position of the row it is anchored to (Storm's ``emit(anchor, values)``): pandas
    operations such as ``explode``, boolean masks and ``assign`` keep that index by
    themselves. Index -1 emits an unanchored row. ``schema`` is the DDL of the output
    columns. With ``collector``, ``fn(frame, collector)`` is also given a
    :class:`Collector` for its chunk.

    The way to fail rows is the collector's :meth:`Collector.fail` and
    :meth:`Collector.reject`: those rows' roots fail or are dead-lettered, the rest of
    the chunk goes on, and ``fn`` is called once a chunk.

    Raising costs more. A failure is per row, as a Storm bolt fails single tuples: if
    ``fn`` raises, or returns output that does not fit ``schema`` (other columns, an
    index that is not a parent position, a value of another type), the chunk is split
    (``fn`` called again on its parts) until the rows at fault are found; only their
    roots fail, with a reason naming the stage and what was wrong, and the rest of the
    chunk goes on. An error every row meets (a service the bolt calls is down) fails
    the chunk's rows together after a few levels of parts, instead of calling ``fn``
    twice a row (see ``_run_bolt``)."""

    kind = "pandas_bolt"

    def __init__(
        self,
        number: int,
        fn: Callable[..., pd.DataFrame],
        schema: str,
        collector: bool = False,
        name: str | None = None,
    ):
        super().__init__(number, name)
        self.fn, self.schema, self.collector = fn, schema, collector
        self._output: BoltOutput | None = None  # the schema's columns, found on first use

    def run(self, df: DataFrame, ctx: BatchContext) -> StageOutput:
        if is_multi_anchored(df) or GROUP in df.columns:
            raise StageError(self.name, "pandas bolts after an aggregation are not supported yet")
        payload = [c for c in df.columns if c not in LINEAGE_COLUMNS]
        fn, name, collector = self.fn, self.name, self.collector
        resets = ctx.resets if collector and ctx.mode.tracks else None
        if self._output is None:  # once: each DataFrame call is a trip to the JVM
            self._output = BoltOutput.of(df.sparkSession.createDataFrame([], self.schema).schema)
        output = self._output
        if not ctx.mode.tracks:  # no root to fail: output that does not fit stops the query

            def plain(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
                for frame in frames:
                    marks = Collector(len(frame), stage=name)
                    given = (marks,) if collector else ()
                    out = fn(frame[payload].reset_index(drop=True), *given)
                    try:
                        out, parent = output.checked(out, len(frame))
                    except BoltOutputError as error:
                        raise StageError(name, str(error)) from None
                    yield out[marks.kept(parent)] if marks.verdicts.any() else out

            return StageOutput(df.mapInPandas(plain, self.schema))

        schema = (
            f"{self.schema}, {ROOT} long, {EDGE} long, {_ORDINAL} long, {_ERROR} string, "
            f"{_REJECT} boolean"
        )

        def tracked(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            try:
                for frame in frames:
                    chunk = frame.reset_index(drop=True)
                    yield _run_bolt(fn, chunk, payload, name, output, collector, resets)
            finally:
                if resets is not None:
                    resets.close()  # the channel's client, if a reset made one

        out = df.mapInPandas(tracked, schema).persist()  # the bolt runs once per batch
        caught = out.where(F.col(_ERROR).isNotNull()).withColumnRenamed(_ERROR, REASON)
        failed = caught.where(~F.col(_REJECT)).drop(_ORDINAL, _REJECT)
        rejected = caught.where(F.col(_REJECT)).drop(_ORDINAL, _REJECT)
        good = out.where(F.col(_ERROR).isNull())
        good = ctx.mode.anchoring.children(good, self.number, F.col(_ORDINAL))
        good = good.drop(_ORDINAL, _ERROR, _REJECT)
        return StageOutput(good, failed=failed, rejected=rejected, cached=(out,))


class BoltOutputError(ValueError):
    """A pandas bolt's output does not fit its declared schema; its rows fail."""


#: Arrow types of the Spark types whose values are checked before Spark converts them.
#: Other types (temporal, decimal, nested) are left to Spark's own conversion.
_CHECKED_TYPES = {
    "long": pa.int64(),
    "integer": pa.int32(),
    "short": pa.int16(),
    "byte": pa.int8(),
    "double": pa.float64(),
    "float": pa.float32(),
    "boolean": pa.bool_(),
    "string": pa.string(),
    "binary": pa.binary(),
}


@dataclass(frozen=True)
class BoltOutput:
    """The columns a pandas bolt declared, and the Arrow type of those whose values are
    checked (see :data:`_CHECKED_TYPES`): a value Spark could not convert would fail the
    whole task, and with it the batch, instead of the rows that made it."""

    columns: tuple[str, ...]
    types: tuple[tuple[str, pa.DataType], ...]

    @classmethod
    def of(cls, schema: StructType) -> BoltOutput:
        types = [(f.name, _CHECKED_TYPES.get(f.dataType.typeName())) for f in schema.fields]
        return cls(tuple(schema.names), tuple((c, t) for c, t in types if t is not None))

    def checked(self, out: pd.DataFrame, rows: int) -> tuple[pd.DataFrame, np.ndarray]:
        """``out`` and the parent position of each of its rows (-1: unanchored), or a
        :class:`BoltOutputError` saying what does not fit, for a chunk of ``rows`` rows."""
        if not isinstance(out, pd.DataFrame):
            raise BoltOutputError(f"returned a {type(out).__name__}, not a pandas DataFrame")
        extra = [c for c in out.columns if c not in self.columns]
        missing = [c for c in self.columns if c not in out.columns]
        if extra or missing:
            raise BoltOutputError(
                f"returned columns {list(out.columns)}, its schema has {list(self.columns)}"
                + (f": not in the schema {extra}" if extra else "")
                + (f": missing {missing}" if missing else "")
            )
        try:
            parent = np.asarray(out.index, dtype=np.int64)
        except (TypeError, ValueError):
            parent = np.array([-2])
        if len(parent) and (parent.min() < -1 or parent.max() >= rows):
            raise BoltOutputError(
                "the output rows must be indexed by the position of their parent row "
                "in the input chunk (or -1: unanchored)"
            )
        for column, arrow_type in self.types:
            values = out[column]
            if values.dtype != object and pa.from_numpy_dtype(values.dtype) == arrow_type:
                continue  # already of the declared type
            try:
                pa.Array.from_pandas(values, type=arrow_type, safe=False)
            except (pa.ArrowException, TypeError, ValueError) as error:
                raise BoltOutputError(
                    f"column {column!r} is declared {arrow_type}: " + str(error).splitlines()[0]
                ) from None
        return out, parent


def _run_bolt(
    fn: Callable[..., pd.DataFrame],
    frame: pd.DataFrame,
    payload: list[str],
    name: str,
    output: BoltOutput,
    collector: bool = False,
    resets: UpstreamResets | None = None,
) -> pd.DataFrame:
    """Run ``fn`` on ``frame`` (with ``collector``, and a :class:`Collector` of the rows
    it is given, resetting with ``resets``); isolate the rows it fails on (it raises,
    or its output does not fit the schema), eight parts of a failing chunk at a time;
    attach lineage. Every returned frame has the schema's columns, the failed and
    rejected rows' set to null, with ``_error`` their reason and ``_rejected`` which
    they are. Rows the collector failed or rejected in a call that returned are
    marked so at once, their outputs dropped: no isolation.

    Once every part has failed three levels deep, the error is taken to be every
    row's (a service every row calls is down): the chunk's rows fail together with
    it, in some 600 calls of ``fn`` for 10,000 rows where isolating each row took
    20,000. Rows at fault here and there (a few in a hundred) leave some part whole at
    one of those levels, so they are still found one by one."""
    outputs: list[pd.DataFrame] = []
    #: (positions, reasons, rejected) of the rows failed, by a raise or by the collector
    marked: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    given_columns = frame[payload]

    def call(lo: int, hi: int) -> Exception | None:
        """``fn`` on rows ``[lo, hi)``: its output kept, or its error."""
        chunk = given_columns.iloc[lo:hi].reset_index(drop=True)
        roots = frame[ROOT].iloc[lo:hi].reset_index(drop=True) if collector else None
        marks = Collector(hi - lo, roots, resets, name)
        try:
            out, parent = output.checked(fn(chunk, *([marks] if collector else [])), hi - lo)
        except Exception as error:  # a user bolt's error fails its rows' roots
            return error
        if marks.verdicts.any():
            keep = marks.kept(parent)
            out, parent = out[keep], parent[keep]
            at = np.flatnonzero(marks.verdicts)
            marked.append((at + lo, marks.reasons[at], marks.verdicts[at] == _REJECTED))
        outputs.append((out, np.where(parent >= 0, parent + lo, -1)))
        return None

    def isolate(lo: int, hi: int, error: Exception, whole_levels: int) -> None:
        """Rows ``[lo, hi)`` failed together with ``error``; ``whole_levels``: how many
        levels above every part failed too."""
        if hi - lo == 1 or whole_levels >= EVERY_ROW_LEVELS:
            reasons = np.full(hi - lo, _reason(name, error), dtype=object)
            marked.append((np.arange(lo, hi), reasons, np.zeros(hi - lo, bool)))
            return
        cuts = np.linspace(lo, hi, min(CHUNK_SPLIT_PARTS, hi - lo) + 1).astype(int).tolist()
        parts = [(a, b, call(a, b)) for a, b in zip(cuts, cuts[1:])]
        every = all(e is not None for _, _, e in parts)
        for a, b, e in parts:
            if e is not None:
                isolate(a, b, e, whole_levels + 1 if every else 0)

    if len(frame) and (error := call(0, len(frame))) is not None:
        isolate(0, len(frame), error, 0)
    roots = pd.array(frame[ROOT], dtype="Int64")  # null: an unanchored input row
    edges = pd.array(frame[EDGE], dtype="Int64")
    pieces = []
    if outputs:  # put together once: isolating rows makes a thousand outputs a chunk
        made = [o for o, _ in outputs]
        if marked and len({tuple(o.dtypes.items()) for o in made}) > 1:
            # beside failed rows each call's values stay as it made them (see below):
            # concatenated first, a column of ints and floats would be floats
            made = [o.astype(dict.fromkeys(output.columns, object)) for o in made]
        out = pd.concat(made, ignore_index=True)
        parent = np.concatenate([p for _, p in outputs])
        anchored = parent >= 0
        # a row's children are numbered from 0; the unanchored rows of each call apart
        call_of = np.repeat(np.arange(len(outputs)), [len(p) for _, p in outputs])
        siblings = np.where(anchored, parent, -1 - call_of)
        ordinal = pd.Series(siblings).groupby(siblings).cumcount().to_numpy(np.int64)
        safe = np.where(anchored, parent, 0)
        root, edge = roots[safe].copy(), edges[safe].copy()
        root[~anchored] = pd.NA
        edge[~anchored] = pd.NA
        lineage = {ROOT: root, EDGE: edge, _ORDINAL: ordinal, _ERROR: None, _REJECT: False}
        pieces.append(out.assign(**lineage))
    empty = (np.empty(0, np.int64), np.empty(0, object), np.empty(0, bool))
    rows, errors, rejects = [
        np.concatenate([e, *(m[i] for m in marked)]) for i, e in enumerate(empty)
    ]
    if len(rows) or not pieces:  # Spark wants the schema's columns in every frame
        nothing = dict.fromkeys(output.columns)
        # beside the failed rows' nulls the output's columns are objects (Arrow converts
        # them to the schema's types), as pandas will make them: it warns of the change
        pieces = [p.astype(dict.fromkeys(output.columns, object)) for p in pieces]
        pieces.append(
            pd.DataFrame(
                {
                    **nothing,
                    ROOT: roots[rows],
                    EDGE: edges[rows],
                    _ORDINAL: np.zeros(len(rows), np.int64),
                    _ERROR: errors,
                    _REJECT: rejects,
                }
            )
        )
    return pd.concat(pieces, ignore_index=True)


#: A failing chunk of a pandas bolt is tried again in this many parts.
CHUNK_SPLIT_PARTS = 8
#: Levels of parts that all failed after which a bolt's error is every row's.
EVERY_ROW_LEVELS = 3


def _reason(name: str, error: Exception) -> str:
    """The reason a row fails with: the stage, then what went wrong."""
    what = str(error) if isinstance(error, BoltOutputError) else f"{type(error).__name__}: {error}"
    return f"{name}: {what}"[:REASON_LIMIT]
