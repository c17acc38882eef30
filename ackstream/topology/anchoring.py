"""How a tracked row is anchored: its lineage columns, and the children it gives.

A tracked row is a tuple. Its lineage lives in columns:

- ``_root``, ``_edge``: a tuple anchored to one root (every row the source emits);
- ``_anchors`` (``array<struct<root long, edge long>>``), ``_root`` null: a tuple
  anchored to several parents, possibly of several roots (an aggregation's
  output); it keeps, per parent, the root and the edge id of that
  (parent, child) pair, as Storm's ``MessageId.anchorsToIds`` does per root.
  ``_edge`` is then only the tuple's own id, from which its children's ids derive;
- ``_root`` null and no anchors: an unanchored tuple; nothing tracks it.

How a stage anchors its output is its topology's :class:`Anchoring`, one per mode
(:mod:`ackstream.topology.modes`):

- :data:`UNANCHORED` (untracked): no lineage at all;
- :data:`BY_ROOTS` (telescoped acks, which never send an edge's ack): children
  inherit their parents' ``_root`` (or ``_anchors``) and get no edge ids;
- :data:`BY_EDGES` (per-stage acks): each child gets an edge id of its own,
  ``xxhash64(parent edge, stage, ordinal)`` (:func:`mint`), so children are
  distinct and the same on every re-run.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ackstream.lineage import ANCHORS, EDGE, ROOT

__all__ = [
    "ANCHOR_TYPE",
    "BY_EDGES",
    "BY_ROOTS",
    "UNANCHORED",
    "Anchoring",
    "GroupInput",
    "anchor_list",
    "anchor_pairs",
    "child_edge",
    "collected_roots",
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


def collected_roots(df: DataFrame) -> Column:
    """An aggregate's expression for the distinct roots of its group's rows."""
    if is_multi_anchored(df):
        return F.array_distinct(F.flatten(F.collect_list(roots_of_row())))
    return F.collect_set(ROOT)


def roots_of_row() -> Column:
    """The distinct roots a multi-anchored row is anchored to, as an array column."""
    return F.array_distinct(F.transform(F.col(ANCHORS), lambda a: a["root"]))


def anchor_list(df: DataFrame, edge: Column) -> Column:
    """The anchor list a child gets from this row when their pair has edge ``edge``:
    one entry per root of the row (empty for an unanchored row)."""
    if is_multi_anchored(df):
        return F.transform(roots_of_row(), lambda r: F.struct(r.alias("root"), edge.alias("edge")))
    return F.when(
        F.col(ROOT).isNotNull(),
        F.array(F.struct(F.col(ROOT).alias("root"), edge.alias("edge"))),
    ).otherwise(F.array().cast(ANCHOR_TYPE))


def child_edge(stage: int, ordinal: Column | int = 0) -> Column:
    """The edge id of a row's child: ``xxhash64(parent edge, stage, ordinal)``."""
    ordinal = ordinal if isinstance(ordinal, Column) else F.lit(int(ordinal))
    return F.xxhash64(F.col(EDGE).cast("long"), F.lit(stage).cast("long"), ordinal.cast("long"))


def mint(df: DataFrame, stage: int, ordinal: Column | int = 0, edges: bool = True) -> DataFrame:
    """Give each row of ``df`` (still carrying its parent's lineage) a fresh edge id
    ``xxhash64(parent edge, stage, ordinal)``; a multi-anchored child is anchored to
    each of its parent's roots with that edge. ``edges=False``: ``df`` as it is (the
    telescoped topology needs only the roots, which children inherit)."""
    if not edges:
        return df
    edge = child_edge(stage, ordinal)
    if is_multi_anchored(df):
        df = df.withColumn(EDGE, edge)
        return df.withColumn(ANCHORS, anchor_list(df, F.col(EDGE)))
    return df.withColumn(EDGE, edge)


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


class Unanchored(Anchoring):
    """Untracked: rows carry no lineage."""


class ByRoots(Anchoring):
    """Telescoped acks: children inherit their parents' roots, no edge ids."""


class ByEdges(Anchoring):
    """Per-stage acks: every child gets an edge id of its own (:func:`mint`)."""

    edges = True

    def children(self, rows: DataFrame, stage: int, ordinal: Column | int = 0) -> DataFrame:
        return mint(rows, stage, ordinal)

    def edge(self, *parts: Column) -> Column:
        return F.xxhash64(*parts)


UNANCHORED, BY_ROOTS, BY_EDGES = Unanchored(), ByRoots(), ByEdges()
