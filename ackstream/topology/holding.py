"""Tuples a stage holds across micro-batches: their hold ids, what survives of them
from one batch to the next, and their ack records.

A window (:mod:`ackstream.topology.window`) and a join that waits
(:mod:`ackstream.topology.waiting_join`) keep some of their input tuples un-acked
past the end of their batch. What they share is here, in :class:`Holding`:

- telescoped acks: a tuple still held at the end of its batch gets a fresh id ``h``
  (:func:`hold_ids`), and an ``ACK (root, h)`` per root it is anchored to, so its
  trees cannot close in that batch and go to the acker; the batch that releases it
  sends the same records again (:meth:`Holding.released`). Per-stage acks need no
  hold id: a held tuple's edge is simply acked when it is released.
- a held tuple whose root has an outcome (failed or timed out elsewhere: read from
  the completion channel at the start of each batch), or that was held longer than
  the message timeout, can no longer be acked: it is dropped, as its record is (or
  will be) replayed. A tuple of several roots (a count after an aggregate) goes
  with any of them, and its other roots fail at once, so that their replays bring
  its content back.
- the held rows, the completion position and the stage's own clock are saved per
  batch by a :class:`~ackstream.topology.held_store.HeldStore` in the stage's folder.

A held row's roots are its ``_root``, or the roots of its ``_anchors``
(:func:`root_pairs`).
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ackstream import ids
from ackstream.errors import StageError
from ackstream.lineage import ANCHORS, GROUP, ROOT
from ackstream.records import ACK, FAIL, NOTICES, ack_table
from ackstream.topology.bolts import BatchContext, anchored_to_roots
from ackstream.topology.held_store import HeldState, HeldStore

__all__ = [
    "HELD_MS",
    "HOLD",
    "Holding",
    "either",
    "finished_roots",
    "hold_ids",
    "released_holds",
    "root_pairs",
]

#: columns of a held row besides its stage's: its hold id (telescoped acks; null
#: until it is held past a batch) and when it came (ms)
HOLD, HELD_MS = "_hold", "_held_ms"


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


def root_pairs(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """``(row, root)`` for every root each row of ``table`` is anchored to (``_root``,
    or each entry of ``_anchors``), as two int64 arrays; rows with no root have none."""
    rows = [np.empty(0, np.int64)]
    roots = [np.empty(0, np.int64)]
    if ROOT in table.column_names:
        own = table.column(ROOT).combine_chunks()
        at = np.flatnonzero(own.is_valid().to_numpy(zero_copy_only=False))
        rows.append(at)
        roots.append(own.take(pa.array(at)).to_numpy(zero_copy_only=False).astype(np.int64))
    if ANCHORS in table.column_names:
        anchors = table.column(ANCHORS).combine_chunks()
        parents = pc.list_parent_indices(anchors).to_numpy(zero_copy_only=False)
        entries = pc.list_flatten(anchors).field("root")
        valid = entries.is_valid().to_numpy(zero_copy_only=False)
        rows.append(parents[valid].astype(np.int64))
        roots.append(entries.drop_null().to_numpy(zero_copy_only=False).astype(np.int64))
    return np.concatenate(rows), np.concatenate(roots)


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

    def before(
        self, tracking: bool, ctx: BatchContext
    ) -> tuple[HeldState | None, pa.Table | None, object, pa.Table | None]:
        """What the batch before this one left: its saved state, the rows of it that
        may still be released, the completion position read up to, and the FAIL
        records (or None) of the other roots of rows dropped."""
        state = self.store(ctx.folder).before(ctx.batch_id)
        held, position = (None, None) if state is None else (state.rows, state.position)
        if not tracking:
            return state, held, position, None
        dropped = None
        if ctx.channel is not None:
            if state is None:  # our roots' completions all come after this
                position = ctx.channel.end_position()
            else:
                done, position = ctx.channel.completions_since(position)
                if held is not None and held.num_rows and done.num_rows:
                    held, dropped = self._without_finished(held, finished_roots(done), ctx)
        if held is not None and held.num_rows:
            held = held.filter(pc.greater(held.column(HELD_MS), ctx.now_ms - ctx.timeout_ms))
        return state, held, position, dropped

    def _without_finished(self, held: pa.Table, finished: pa.Array, ctx: BatchContext):
        """``held`` without the rows that have a finished root, and the FAIL records of
        those rows' other roots (None if there are none)."""
        rows, roots = root_pairs(held)
        over = pc.is_in(pa.array(roots), finished).to_numpy(zero_copy_only=False)
        gone = np.zeros(held.num_rows, dtype=bool)
        gone[rows[over]] = True
        held = held.filter(pa.array(~gone))
        others = gone[rows] & ~over
        if not others.any():
            return held, None
        why = f"held in {self.kind} stage {self.name} with a root that failed or timed out"
        failing = np.unique(roots[others])
        return held, ack_table(failing, np.zeros(len(failing), np.int64), FAIL, ctx.now_ms, why)

    def hold(self, kept: pa.Table, ctx: BatchContext) -> tuple[pa.Table, pa.Table | None]:
        """``kept`` with a hold id for each row newly held, and the ``ACK (root, h)``
        records of those, one per root (None if none is new); telescoped acks only."""
        rows, roots = root_pairs(kept)
        unheld = pc.is_null(kept.column(HOLD)).to_numpy(zero_copy_only=False)
        new = unheld[rows]
        rows, roots = rows[new], roots[new]
        if not len(rows):
            return kept, None
        fresh, first = np.unique(rows, return_index=True)  # rows with a root, one root each
        hold = pc.fill_null(kept.column(HOLD), 0).to_numpy().astype(np.int64)
        hold[fresh] = hold_ids(roots[first], ctx.batch_id, self.number)
        mask = unheld.copy()
        mask[fresh] = False
        column = pa.array(hold, pa.int64(), mask=mask)
        kept = kept.set_column(kept.schema.get_field_index(HOLD), HOLD, column)
        return kept, ack_table(roots, hold[rows], ACK, ctx.now_ms)

    def save(self, ctx: BatchContext, state: HeldState) -> None:
        """Save what this batch leaves held."""
        self.store(ctx.folder).save(ctx.batch_id, state)


def either(*records: pa.Table | None) -> pa.Table | None:
    """The ack records of every table given that is not None, as one (None if none)."""
    given = [r for r in records if r is not None]
    return pa.concat_tables(given) if given else None


def released_holds(released: DataFrame) -> DataFrame:
    """``(root, value)``: each released row's hold id, once for every root it holds
    (the ``ACK (root, h)`` that undoes its hold)."""
    held = released.where(F.col(HOLD).isNotNull())
    pairs = held.select(F.col(ROOT).alias("root"), F.col(HOLD).alias("value"))
    if ANCHORS in released.columns:
        anchored = held.select(F.inline(ANCHORS), F.col(HOLD).alias("value"))
        pairs = pairs.unionByName(anchored.select("root", "value"))
    return pairs.where("root IS NOT NULL")
