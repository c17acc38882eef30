"""Tuples a stage holds across micro-batches: their hold ids, what survives of them
from one batch to the next, and their ack records.

A window (:mod:`ackstream.topology.window`) and a join that waits
(:mod:`ackstream.topology.waiting_join`) keep some of their input tuples un-acked
past the end of their batch. What they share is here, in :class:`Holding`:

- every tuple the stage may hold gets an id ``_hold`` when it comes (:meth:`Holding.
  stamp`): a hash of the stage, the batch and the tuple itself (its roots included),
  so that Spark running the batch again gives every tuple the same id whatever the
  order or partitioning of its rows. The store names a released tuple by it.
- telescoped acks: a tuple still held at the end of its batch sends an ``ACK (root,
  h)`` with its id ``h`` for each root it is anchored to, so its trees cannot close
  in that batch and go to the acker; the batch that releases it sends the same
  records again (:func:`hold_pairs`). Per-stage acks need no such record: a held
  tuple's edge is simply acked when it is released. A batch run again sends the same
  records as the first time (a local channel writes them over the first ones), so a
  re-run leaves no ack that no release will match.
- a held tuple whose root ended without an ack (failed or timed out elsewhere: read
  from the completion channel at the start of each batch), or that was held longer
  than the message timeout, can no longer be acked: it is dropped, as its record is
  (or will be) replayed. A tuple of several roots (a count after an aggregate) goes
  with any of them, and its other roots fail at once, so that their replays bring
  its content back.
- the roots of a held tuple are computed once, when it comes (an aggregate that feeds
  a holding stage collects them itself: see ``Stage.hold_roots``), and kept with it
  (``_root``, or ``_anchors``): later batches read them, never the aggregate's input.
- what changed is saved per batch by a :class:`~ackstream.topology.held_store.
  HeldStore` in the stage's folder: the tuples held anew and the ids of those let
  go, with the completion position and the stage's own clock.

Every step is a Spark frame: the held rows stay on the executors, and the driver
sees only the roots that ended without an ack and the ack records. A held row's
roots are its ``_root`` and the roots of its ``_anchors`` (:func:`roots_of`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ackstream.errors import StageError
from ackstream.topology.bolts import BatchContext, anchored_to_roots
from ackstream.topology.held_store import HOLD, ChangeLog, Changes, HeldState, HeldStore
from ackstream.topology.hold_tokens import FOLDER as TOKENS
from ackstream.vocabulary.lineage import ANCHORS, GROUP, ROOT
from ackstream.vocabulary.records import ACKED, NOTICES

__all__ = [
    "FRESH",
    "HELD_MS",
    "HOLD",
    "Before",
    "Holding",
    "content_of",
    "hold_pairs",
    "lost_roots",
    "roots_of",
]

#: a held row's time of coming (ms); its id is ``_hold`` (see the module doc)
HELD_MS = "_held_ms"
#: set by :meth:`Before.and_new` on the rows of the batch (false on those held before)
FRESH = "_fresh"
#: the column types a tuple's id hashes: those whose values a re-run computes the
#: same (floating-point sums may round otherwise, and an array from ``collect_list``
#: may come in another order); tuples alike in these get ids apart by their rank
_HASHED = (
    T.IntegralType,
    T.StringType,
    T.BinaryType,
    T.BooleanType,
    T.DateType,
    T.TimestampType,
    T.TimestampNTZType,
    T.DecimalType,
)
_CONTENT = "_content"
_HOLDING = (HOLD, HELD_MS, FRESH, _CONTENT)


def _column(name: str) -> Column:
    return F.col("`" + name.replace("`", "``") + "`")


def content_of(rows: DataFrame) -> Column:
    """A hash of what a row is: its columns of the types a re-run computes alike, and
    its anchors in order (Spark collects them in no fixed order); not the columns a
    holding stage adds (its id, time of coming and mark of the batch's rows)."""
    parts = [
        F.array_sort(_column(f.name)) if f.name == ANCHORS else _column(f.name)
        for f in rows.schema.fields
        if f.name not in _HOLDING and (f.name == ANCHORS or isinstance(f.dataType, _HASHED))
    ]
    return F.xxhash64(*parts) if parts else F.lit(0).cast("long")


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
    if ANCHORS in rows.columns:  # an anchor's root is never null (see anchoring)
        parts.append(F.col(ANCHORS)["root"])  # a field of an array's structs: no lambda
    empty = F.array().cast("array<bigint>")
    return F.concat(*(F.coalesce(p, empty) for p in parts)) if parts else empty


@dataclass(frozen=True)
class Before:
    """What the batches before leave a holding stage: the ``held`` rows that may still
    be released (None: none), the completion ``position`` read up to, the ``clock`` its
    closing reached, the ``fails`` (``(root, reason)``) of the other roots of rows
    dropped, the ids (``_hold``) of the rows ``dropped``, the ``log`` of pieces the
    rows were read from and the frames persisted to find them."""

    held: DataFrame | None
    position: object = None
    clock: int | None = None
    fails: DataFrame | None = None
    dropped: DataFrame | None = None
    log: ChangeLog = field(default_factory=ChangeLog)
    cached: tuple[DataFrame, ...] = ()

    def and_new(self, new: DataFrame) -> DataFrame:
        """The held rows and the batch's ``new`` ones, as one frame of ``new``'s columns
        (the saved rows carry more) and ``_fresh``, true on the new rows."""
        fresh = new.withColumn(FRESH, F.lit(True))
        if self.held is None:
            return fresh
        held = self.held.select(*new.columns).withColumn(FRESH, F.lit(False))
        return held.unionByName(fresh)


class Holding:
    """The held tuples of one stage (``name``, ``number``): its stores by folder, and
    the steps every holding stage takes each batch (see the module doc)."""

    def __init__(self, name: str, number: int, kind: str):
        if "/" in name or name.startswith(".") or name == TOKENS:  # its store's folder
            raise StageError(
                name, f"a {kind}'s name may not hold '/', start with '.' or be {TOKENS!r}"
            )
        self.name, self.number, self.kind = name, number, kind
        self._stores: dict[str | None, HeldStore] = {}

    def store(self, folder: str | None) -> HeldStore:
        """The stage's held store in ``folder`` (None: in memory, kept here)."""
        if folder not in self._stores:
            self._stores[folder] = HeldStore(
                None if folder is None else os.path.join(folder, self.name)
            )
        return self._stores[folder]

    def holdable(self, df: DataFrame, ctx: BatchContext) -> DataFrame:
        """``df`` as rows that can be held past the batch: a row that carries ``_group``
        (after an aggregate that was not asked for its roots) is anchored to its roots
        instead, as the aggregate's input that the group points to is gone after the
        batch."""
        if ctx.mode.carries_lineage and GROUP in df.columns:
            return anchored_to_roots(df, ctx.groups)
        return df

    def arriving(self, df: DataFrame, ctx: BatchContext) -> DataFrame:
        """The batch's rows as the stage takes them in: no id yet (``_hold`` null, see
        :meth:`stamp`) and their time of coming (``_held_ms``)."""
        return df.withColumn(HOLD, F.lit(None).cast("long")).withColumn(
            HELD_MS, F.lit(ctx.now_ms).cast("long")
        )

    def stamp(self, rows: DataFrame, keys: Sequence[str | Column], ctx: BatchContext) -> DataFrame:
        """``rows`` with an id (``_hold``) for each row of the batch: the rows
        :meth:`arriving` made, or those with the rows held before (``_fresh`` tells
        them apart; a held row keeps its id). An id is ``xxhash64(stage, batch,
        content, rank)``: the content as :func:`content_of` hashes it, the rank (among
        the batch's rows of one key, by content) telling apart rows alike in it; a
        re-run ranks those in another order, but gives the same set of ids. Ranked by
        ``keys``, so that a stage that next looks at each key's rows (a count window, a
        join) shuffles them once."""
        held = FRESH in rows.columns
        content = F.col(_CONTENT)
        order = [F.col(FRESH).desc(), content] if held else [content]
        rank = F.row_number().over(Window.partitionBy(*keys).orderBy(*order))
        stage, batch = F.lit(self.number).cast("long"), F.lit(ctx.batch_id).cast("long")
        given = F.xxhash64(stage, batch, content, rank)
        if held:
            given = F.when(F.col(FRESH), given).otherwise(F.col(HOLD))
        return rows.withColumn(_CONTENT, content_of(rows)).withColumn(HOLD, given).drop(_CONTENT)

    def before(self, spark: SparkSession, ctx: BatchContext) -> Before:
        """What the batch before this one left (see :class:`Before`): held rows whose
        root ended without an ack since the saved position, or held longer than the
        message timeout, are left out (their ids in ``Before.dropped``)."""
        state = self.store(ctx.folder).before(spark, ctx.batch_id)
        if state is None:
            state = HeldState(None)
        held, position = state.rows, state.position
        if not ctx.mode.holding_keeps_trees_open:
            return Before(held, position, state.clock, log=state.log)
        cached: tuple[DataFrame, ...]  # none, or the held rows persisted
        fails, dropped, cached = None, [], ()
        if ctx.channel is not None:
            if position is None:  # our roots' completions all come after this
                position = ctx.channel.end_position()
            else:
                done, position = ctx.channel.completions_since(position, runs=True)
                lost = lost_roots(done)
                if held is not None and len(lost):
                    held, fails, gone, cached = self._without_lost(spark, held, lost)
                    dropped.append(gone)
        if held is not None:
            too_old = F.col(HELD_MS) <= F.lit(ctx.now_ms - ctx.timeout_ms)
            dropped.append(held.where(too_old).select(HOLD))
            held = held.where(~too_old)
        gone_ids = None
        for part in dropped:
            gone_ids = part if gone_ids is None else gone_ids.unionByName(part)
        return Before(held, position, state.clock, fails, gone_ids, state.log, cached)

    def _without_lost(
        self, spark: SparkSession, held: DataFrame, lost: pa.Array
    ) -> tuple[DataFrame, DataFrame, DataFrame, tuple[DataFrame]]:
        """``held`` without the rows that have a lost root, the ``(root, reason)`` fails
        of those rows' other roots, the ids of the rows dropped, and the frame
        persisted to read the held rows once."""
        held = held.persist()
        gone_roots = F.broadcast(spark.createDataFrame(pa.table({"root": lost})))
        pairs = held.select(HOLD, F.explode(roots_of(held)).alias("root"))
        gone = pairs.join(gone_roots, "root", "left_semi").select(HOLD).distinct()
        kept = held.join(gone, HOLD, "left_anti")
        why = f"held in {self.kind} stage {self.name} with a root that failed or timed out"
        others = pairs.join(gone, HOLD, "left_semi").join(gone_roots, "root", "left_anti")
        fails = others.select("root", F.lit(why).alias("reason"))
        return kept, fails, gone, (held,)

    def keep(
        self,
        kept: DataFrame,
        released: DataFrame,
        ctx: BatchContext,
        before: Before,
        clock: int | None,
    ) -> DataFrame | None:
        """Save what changed: of ``kept``, the rows still held after this batch, those
        that came in it; of ``released``, the ids of those held before (with the rows
        :meth:`before` dropped), with ``before``'s position and the closing's
        ``clock``. When the mode's held tuples send hold records (telescoped), returns
        the ``(root, value)`` pairs to ack, of the new holds and of the released ones,
        XORed per root; otherwise None."""
        fresh = F.col(FRESH)
        let_go = released.where(~fresh)
        gone = let_go.select(HOLD)
        if before.dropped is not None:
            gone = gone.unionByName(before.dropped)
        added = kept.where(fresh).drop(FRESH)
        state = HeldState(kept.drop(FRESH), before.position, clock)
        self.store(ctx.folder).save(ctx.batch_id, state, Changes(added, gone, before.log))
        if not ctx.mode.hold_records:
            return None
        # one record per root: a held count has thousands of roots, and the collect to
        # the driver costs by the row (the ledger XORs a root's values all the same)
        pairs = hold_pairs(let_go).unionByName(hold_pairs(added))
        return pairs.groupBy("root").agg(F.bit_xor("value").alias("value"))


def hold_pairs(rows: DataFrame) -> DataFrame:
    """``(root, value)``: the hold id of each row, once for every root it holds (the
    ``ACK (root, h)`` that a hold sends and its release sends again)."""
    return rows.select(F.explode(roots_of(rows)).alias("root"), F.col(HOLD).alias("value"))
