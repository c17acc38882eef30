"""Tuples a stage holds across micro-batches: their hold ids, what survives of them
from one batch to the next, and their ack records.

A window (:mod:`ackstream.topology.window`) and a join that waits
(:mod:`ackstream.topology.waiting_join`) keep some of their input tuples un-acked
past the end of their batch. What they share is here, in :class:`Holding`:

- telescoped acks: a tuple still held at the end of its batch gets a fresh id ``h``
  (:func:`hold_id`), and an ``ACK (root, h)`` per root it is anchored to, so its
  trees cannot close in that batch and go to the acker; the batch that releases it
  sends the same records again (:func:`hold_pairs`). Per-stage acks need no hold
  id: a held tuple's edge is simply acked when it is released.
- a held tuple whose root ended without an ack (failed or timed out elsewhere: read
  from the completion channel at the start of each batch), or that was held longer
  than the message timeout, can no longer be acked: it is dropped, as its record is
  (or will be) replayed. A tuple of several roots (a count after an aggregate) goes
  with any of them, and its other roots fail at once, so that their replays bring
  its content back.
- the held rows, the completion position and the stage's own clock are saved per
  batch by a :class:`~ackstream.topology.held_store.HeldStore` in the stage's folder.

Every step is a Spark frame: the held rows stay on the executors, and the driver
sees only the roots that ended without an ack and the ack records. A held row's
roots are its ``_root`` and the roots of its ``_anchors`` (:func:`roots_of`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from ackstream.errors import StageError
from ackstream.lineage import ANCHORS, GROUP, ROOT
from ackstream.records import ACKED, NOTICES
from ackstream.topology.bolts import BatchContext, anchored_to_roots
from ackstream.topology.held_store import HeldState, HeldStore

__all__ = [
    "HELD_MS",
    "HOLD",
    "Before",
    "Holding",
    "hold_id",
    "hold_pairs",
    "lost_roots",
    "roots_of",
]

#: columns of a held row besides its stage's: its hold id (telescoped acks; null
#: until it is held past a batch) and when it came (ms)
HOLD, HELD_MS = "_hold", "_held_ms"
_NEW = "_new_hold"  # a saved row whose hold id this batch gave
_ID = "_held_row"


def hold_id(roots: Column, batch_id: int, stage: int) -> Column:
    """A fresh id per held tuple: ``xxhash64(first root, batch, stage, i)``, ``i`` unique
    among the batch's rows, so that no two held tuples of one root cancel each other in
    its XOR (null for a tuple with no root)."""
    first = F.element_at(roots, 1)
    number = F.monotonically_increasing_id()
    hashed = F.xxhash64(first, F.lit(batch_id).cast("long"), F.lit(stage).cast("long"), number)
    return F.when(first.isNotNull(), hashed)


def lost_roots(completions: pa.Table) -> pa.Array:
    """The roots whose trees ended without an ack in ``completions`` (failed, timed
    out, rejected...). An acked root never has a held tuple (its hold keeps the tree
    open), so a run of acked offsets is never expanded here."""
    status = completions.column("status")
    skip = pc.fill_null(pc.is_in(status, value_set=pa.array([ACKED, *NOTICES])), True)
    return completions.filter(pc.invert(skip)).column("root").drop_null().combine_chunks()


def roots_of(rows: DataFrame) -> Column:
    """The roots each row is anchored to, as an array: its ``_root`` and the roots of
    its ``_anchors`` (the columns it has), nulls left out."""
    parts = []
    if ROOT in rows.columns:
        parts.append(F.when(F.col(ROOT).isNotNull(), F.array(F.col(ROOT))))
    if ANCHORS in rows.columns:
        anchored = F.filter(F.col(ANCHORS), lambda a: a["root"].isNotNull())
        parts.append(F.transform(anchored, lambda a: a["root"]))
    empty = F.array().cast("array<bigint>")
    return F.concat(*(F.coalesce(p, empty) for p in parts)) if parts else empty


@dataclass(frozen=True)
class Before:
    """What the batches before leave a holding stage: the ``held`` rows that may still
    be released (None: none), the completion ``position`` read up to, the ``clock`` its
    closing reached, the ``fails`` (``(root, reason)``) of the other roots of rows
    dropped, and the frames persisted to find them."""

    held: DataFrame | None
    position: object = None
    clock: int | None = None
    fails: DataFrame | None = None
    cached: tuple = ()

    def and_new(self, new: DataFrame) -> DataFrame:
        """The held rows and the batch's ``new`` ones, as one frame of ``new``'s columns
        (the saved rows carry more)."""
        return new if self.held is None else self.held.select(*new.columns).unionByName(new)


class Holding:
    """The held tuples of one stage (``name``, ``number``): its stores by folder, and
    the steps every holding stage takes each batch (see the module doc)."""

    def __init__(self, name: str, number: int, kind: str):
        if "/" in name or name.startswith("."):  # its held store's folder name
            raise StageError(name, f"a {kind}'s name may not hold '/' or start with '.'")
        self.name, self.number, self.kind = name, number, kind
        self._stores: dict[str | None, HeldStore] = {}

    def store(self, folder: str | None) -> HeldStore:
        """The stage's held store in ``folder`` (None: in memory, kept here)."""
        if folder not in self._stores:
            self._stores[folder] = HeldStore(
                None if folder is None else os.path.join(folder, self.name)
            )
        return self._stores[folder]

    def holdable(self, df: DataFrame, tracking: bool, ctx: BatchContext) -> DataFrame:
        """``df`` as rows that can be held past the batch: a row that carries ``_group``
        (after an aggregate, telescoped) is anchored to its roots instead, as the
        aggregate's input that the group points to is gone after the batch."""
        if tracking and GROUP in df.columns:
            return anchored_to_roots(df, ctx.groups)
        return df

    def before(self, spark: SparkSession, tracking: bool, ctx: BatchContext) -> Before:
        """What the batch before this one left (see :class:`Before`): held rows whose
        root ended without an ack since the saved position, or held longer than the
        message timeout, are left out."""
        state = self.store(ctx.folder).before(spark, ctx.batch_id)
        if state is None:
            state = HeldState(None)
        held, position = state.rows, state.position
        if not tracking:
            return Before(held, position, state.clock)
        fails, cached = None, ()
        if ctx.channel is not None:
            if position is None:  # our roots' completions all come after this
                position = ctx.channel.end_position()
            else:
                done, position = ctx.channel.completions_since(position, runs=True)
                lost = lost_roots(done)
                if held is not None and len(lost):
                    held, fails, cached = self._without_lost(spark, held, lost, ctx)
        if held is not None:
            held = held.where(F.col(HELD_MS) > F.lit(ctx.now_ms - ctx.timeout_ms))
        return Before(held, position, state.clock, fails, cached)

    def _without_lost(self, spark: SparkSession, held: DataFrame, lost: pa.Array, ctx):
        """``held`` without the rows that have a lost root, the ``(root, reason)`` fails
        of those rows' other roots, and the frame persisted to tell rows apart."""
        numbered = held.withColumn(_ID, F.monotonically_increasing_id()).persist()
        gone_roots = F.broadcast(spark.createDataFrame(pa.table({"root": lost})))
        pairs = numbered.select(_ID, F.explode(roots_of(held)).alias("root"))
        gone = pairs.join(gone_roots, "root", "left_semi").select(_ID)
        kept = numbered.join(gone, _ID, "left_anti").drop(_ID)
        why = f"held in {self.kind} stage {self.name} with a root that failed or timed out"
        others = pairs.join(gone, _ID, "left_semi").join(gone_roots, "root", "left_anti")
        fails = others.select("root", F.lit(why).alias("reason"))
        return kept, fails, (numbered,)

    def keep(
        self,
        kept: DataFrame,
        released: DataFrame,
        ctx: BatchContext,
        before: Before,
        clock,
        telescoped: bool,
    ) -> DataFrame | None:
        """Save ``kept``, the rows still held after this batch, with ``before``'s
        position and the closing's ``clock``. Telescoped, each row newly held gets a
        hold id first, and the ``(root, value)`` pairs to ack are returned: those of
        the ``released`` rows' holds and of the new ones (read back from what was
        saved, so they are the ids the release will send); otherwise None."""
        if telescoped:
            fresh = F.col(HOLD).isNull()
            kept = kept.withColumn(_NEW, fresh).withColumn(
                HOLD, F.coalesce(F.col(HOLD), hold_id(roots_of(kept), ctx.batch_id, self.number))
            )
        saved = self.store(ctx.folder).save(ctx.batch_id, HeldState(kept, before.position, clock))
        if not telescoped or saved is None:
            return None
        return hold_pairs(released).unionByName(hold_pairs(saved.where(F.col(_NEW))))


def hold_pairs(rows: DataFrame) -> DataFrame:
    """``(root, value)``: the hold id of each row that has one, once for every root it
    holds (the ``ACK (root, h)`` that a hold sends and its release sends again)."""
    held = rows.where(F.col(HOLD).isNotNull())
    return held.select(F.explode(roots_of(held)).alias("root"), F.col(HOLD).alias("value"))
