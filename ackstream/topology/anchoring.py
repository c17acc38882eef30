"""How a tracked row is anchored: its lineage columns, and the children it gives.

A tracked row is a tuple. Its lineage lives in columns:

- ``_root``, ``_edge``: a tuple anchored to one root (every row the source emits);
- ``_anchors`` (``array<struct<root long, edge long>>``), ``_root`` null: a tuple
  anchored to several parents, possibly of several roots (an aggregation's
  output); it keeps, per parent, the root and the edge id of that
  (parent, child) pair, as Storm's ``MessageId.anchorsToIds`` does per root.
  An anchor's root is never null (an unanchored parent gives no anchor), so its
  roots are read as the array's ``root`` fields, without a higher-order function;
  ``_edge`` is then only the tuple's own id, from which its children's ids derive;
- ``_root`` null and no anchors: an unanchored tuple; nothing tracks it.

How a stage anchors its output is its topology's :class:`Anchoring`, one per mode
(:mod:`ackstream.topology.modes`):

- :data:`UNANCHORED` (untracked): no lineage at all;
- :data:`BY_ROOTS` (telescoped acks, which never send an edge's ack): children
  inherit their parents' ``_root`` (or ``_anchors``) and get no edge ids. An
  aggregation's output row needs its roots only if it fails (a later stage fails
  it, or the sink cannot write it), so it keeps no anchor list, only ``_group``:
  its stage and a hash of its group keys; ``bolts.failed_roots`` finds the roots of
  failed groups from the aggregation's input in that batch (:class:`GroupInput`),
  and a clean batch never computes them. A hash shared by two groups only fails
  more roots (they replay), never fewer. An aggregation whose rows a later stage
  holds past the batch gives them their roots instead (``_anchors``, null edges);
- :data:`BY_EDGES` (per-stage acks): each child gets an edge id of its own,
  ``xxhash64(parent edge, stage, ordinal)`` (:func:`mint`), so children are
  distinct and the same on every re-run; an aggregation's output row keeps, in
  ``_anchors``, the root and the child edge of every row of its group.

Each anchoring writes the children of a row (:meth:`Anchoring.children`) and the
rows of an aggregation or a window (:meth:`Anchoring.grouped`) once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from pyspark.sql import Column, DataFrame, GroupedData
from pyspark.sql import functions as F

from ackstream.vocabulary.lineage import ANCHORS, EDGE, GROUP, ROOT

__all__ = [
    "ANCHOR_TYPE",
    "BY_EDGES",
    "BY_ROOTS",
    "UNANCHORED",
    "Anchoring",
    "Grouping",
    "GroupInput",
    "anchor_list",
    "anchor_pairs",
    "is_multi_anchored",
    "mint",
    "roots_of_row",
]

#: the type of ``_anchors``
ANCHOR_TYPE = "array<struct<root:bigint,edge:bigint>>"


@dataclass(frozen=True)
class GroupInput:
    """An aggregate stage's input in one batch, and the id of each row's group there:
    where the roots of a failed output row (``_group``) are found."""

    tuples: DataFrame
    group_id: Column


def is_multi_anchored(df: DataFrame) -> bool:
    return ANCHORS in df.columns


def anchor_pairs(df: DataFrame) -> DataFrame:
    """``(root, value)``: one row per (root, edge) a tuple is anchored with; acking a
    tuple contributes exactly these (unanchored tuples contribute nothing)."""
    if is_multi_anchored(df):
        pairs = df.select(F.inline(ANCHORS)).select("root", F.col("edge").alias("value"))
    else:
        pairs = df.select(F.col(ROOT).alias("root"), F.col(EDGE).alias("value"))
    return pairs.where(F.col("root").isNotNull())


def _collected_anchors(df: DataFrame, edge: Column) -> Column:
    """An aggregate's expression for its group's distinct roots as anchors with ``edge``:
    a set of structs collected directly when each row has one root (a higher-order
    function over the roots would be evaluated without generated code, row by row)."""
    if is_multi_anchored(df):
        roots = F.array_distinct(F.flatten(F.collect_list(roots_of_row())))
        return F.transform(roots, lambda r: F.struct(r.alias("root"), edge.alias("edge")))
    anchor = F.struct(F.col(ROOT).alias("root"), edge.alias("edge"))
    return F.collect_set(F.when(F.col(ROOT).isNotNull(), anchor))  # a null is not collected


def roots_of_row() -> Column:
    """The distinct roots a multi-anchored row is anchored to, as an array column."""
    return F.array_distinct(F.col(ANCHORS)["root"])


def anchor_list(df: DataFrame, edge: Column) -> Column:
    """The anchor list a child gets from this row when their pair has edge ``edge``:
    one entry per root of the row (empty for an unanchored row)."""
    if is_multi_anchored(df):
        return F.transform(roots_of_row(), lambda r: F.struct(r.alias("root"), edge.alias("edge")))
    return F.when(
        F.col(ROOT).isNotNull(),
        F.array(F.struct(F.col(ROOT).alias("root"), edge.alias("edge"))),
    ).otherwise(F.array().cast(ANCHOR_TYPE))


def _child_edge(stage: int, ordinal: Column | int = 0) -> Column:
    """The edge id of a row's child: ``xxhash64(parent edge, stage, ordinal)``."""
    ordinal = ordinal if isinstance(ordinal, Column) else F.lit(int(ordinal))
    return F.xxhash64(F.col(EDGE).cast("long"), F.lit(stage).cast("long"), ordinal.cast("long"))


def mint(df: DataFrame, stage: int, ordinal: Column | int = 0) -> DataFrame:
    """Give each row of ``df`` (still carrying its parent's lineage) a fresh edge id
    ``xxhash64(parent edge, stage, ordinal)``; a multi-anchored child is anchored to
    each of its parent's roots with that edge."""
    edge = _child_edge(stage, ordinal)
    if is_multi_anchored(df):
        df = df.withColumn(EDGE, edge)
        return df.withColumn(ANCHORS, anchor_list(df, F.col(EDGE)))
    return df.withColumn(EDGE, edge)


class Grouping:
    """What a stage that groups its input (an aggregate, a window) groups by and
    computes: its stage ``number``, its ``keys`` and ``aggs``, and a window's
    ``windows`` (the columns it groups by beside the keys) and ``window_id`` (the id
    of a row's window, which tells apart its children in several windows). The
    Columns it builds are kept: each is a few calls into the JVM, which on every
    batch cost about as much as the aggregation's own analysis."""

    def __init__(
        self,
        number: int,
        keys: Sequence[str | Column],
        aggs: Sequence[Column],
        windows: Sequence[str] = (),
        window_id: Column | None = None,
    ):
        self.number, self.keys, self.aggs = number, list(keys), list(aggs)
        self.windows, self.window_id = list(windows), window_id

    def by(self, rows: DataFrame) -> GroupedData:
        return rows.groupBy(*self.keys, *self.windows)

    @cached_property
    def group_id(self) -> Column:
        """The id of a row's group, a hash of its keys (and window): an expression of
        the grouping columns, computed once per output row among the aggregates, and
        the same on an input row, where a failed output row's roots are looked up."""
        keys = [F.col(k) if isinstance(k, str) else k for k in self.keys]
        return F.xxhash64(*keys, *(() if self.window_id is None else (self.window_id,)))

    @cached_property
    def group(self) -> Column:
        """``_group``: the stage and the id of the row's group."""
        return F.struct(F.lit(self.number).alias("stage"), self.group_id.alias("id")).alias(GROUP)

    @cached_property
    def null(self) -> Column:
        return F.lit(None).cast("long")

    @cached_property
    def no_edge(self) -> Column:
        return self.null.alias(EDGE)

    @cached_property
    def no_root(self) -> Column:
        return self.null.alias(ROOT)


class Anchoring:
    """How a topology's stages anchor their output to their input (see the module
    doc); stages ask it, never its class."""

    #: each child gets an edge id of its own, which the stage that reads it acks
    edges: bool = False

    def children(self, rows: DataFrame, stage: int, ordinal: Column | int = 0) -> DataFrame:
        """``rows`` (still carrying their parents' lineage) as the children of stage
        number ``stage``; ``ordinal`` tells apart the children of one parent."""
        return rows

    def edge(self, *parts: Column) -> Column:
        """A child's edge id, hashed from ``parts`` (its parents' edges and the stage)
        when children get edge ids; else null."""
        return F.lit(None).cast("long")

    def grouped(
        self, grouping: Grouping, rows: DataFrame, held: bool = False
    ) -> tuple[DataFrame, GroupInput | None]:
        """``rows`` grouped as ``grouping`` says, each output row anchored to every row
        of its group; and the input where the roots of a failed output row are found,
        when it carries ``_group`` (else None). ``held``: a later stage holds the output
        rows past the batch, so they carry their roots (see ``Stage.hold_roots``)."""
        raise NotImplementedError


class Unanchored(Anchoring):
    """Untracked: rows carry no lineage."""

    def grouped(
        self, grouping: Grouping, rows: DataFrame, held: bool = False
    ) -> tuple[DataFrame, GroupInput | None]:
        return grouping.by(rows).agg(*grouping.aggs), None


class ByRoots(Anchoring):
    """Telescoped acks: children inherit their parents' roots, no edge ids; a group's
    row carries ``_group``, or its roots when it is held (see the module doc)."""

    def grouped(
        self, grouping: Grouping, rows: DataFrame, held: bool = False
    ) -> tuple[DataFrame, GroupInput | None]:
        g = grouping
        if held:  # its roots, found in this pass
            anchored = _collected_anchors(rows, g.null).cast(ANCHOR_TYPE).alias(ANCHORS)
            return g.by(rows).agg(*g.aggs, anchored, g.no_edge, g.no_root), None
        out = g.by(rows).agg(*g.aggs, g.group, g.no_edge, g.no_root)
        return out, GroupInput(rows, g.group_id)


class ByEdges(Anchoring):
    """Per-stage acks: every child gets an edge id of its own (:func:`mint`)."""

    edges = True

    def children(self, rows: DataFrame, stage: int, ordinal: Column | int = 0) -> DataFrame:
        return mint(rows, stage, ordinal)

    def edge(self, *parts: Column) -> Column:
        return F.xxhash64(*parts)

    def grouped(
        self, grouping: Grouping, rows: DataFrame, held: bool = False
    ) -> tuple[DataFrame, GroupInput | None]:
        g, stage = grouping, F.lit(grouping.number).cast("long")
        if g.window_id is None:  # a row is in one group: the pair's ordinal is 0
            pair, edge = _child_edge(g.number), F.xxhash64(F.bit_xor(EDGE), stage)
        else:  # a row in several windows gets a child edge per window, so no two cancel
            pair = F.xxhash64(F.col(EDGE).cast("long"), stage, g.window_id)
            edge = F.xxhash64(F.bit_xor(EDGE), stage, g.window_id)
        anchors = F.flatten(F.collect_list(anchor_list(rows, pair)))
        # the null root in the same call: each further DataFrame call is another analysis
        out = g.by(rows).agg(*g.aggs, anchors.alias(ANCHORS), edge.alias(EDGE), g.no_root)
        return out, None


UNANCHORED, BY_ROOTS, BY_EDGES = Unanchored(), ByRoots(), ByEdges()
