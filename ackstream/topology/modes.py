"""A topology's mode: whether it tracks its tuples, how its stages anchor their output,
where a batch's inits come from and where its ack records go.

One mode per topology (``Topology.mode``); the batch, the stages (through their
``BatchContext``) and the running query ask it, never its class.

- :data:`UNTRACKED` (``tracking=False``, or no ackers): no lineage, no ack records.
- :data:`TELESCOPED` (the default ``ack_mode``) makes each root's init with value 0,
  plus the fails. Inside one batch Storm's acks telescope: what a stage emits, the
  next stage acks, and what the sink writes, it acks; each root's XOR of them equals
  its init's value, so only the init (the root was read) and the fails (a stage or
  the sink failed one of its tuples) carry information. Rows a stage drops,
  unanchored emits and multi-anchored aggregate rows cancel out alike. Stages then
  carry roots only, no edge ids, and the batch settles its own trees: a tree it
  closed goes straight to the completion channel, and only trees left open go to
  the acker query.
- :data:`PER_STAGE` is Storm-faithful: it computes every stage's acks as Storm's
  bolts would send them (persisting each stage's output so that both sides of an
  edge see the same rows), and sends them all to the acker query. It costs a few
  times the batch time; use it to watch the XOR ledger at work.
- :class:`Continuing` (``continue_trees=True``) computes its acks as one of those
  two, for the trees an upstream topology left open (:mod:`ackstream.sinks.continued`):
  its source reads untracked, its inits are read from the rows, and every ack
  record goes to the upstream topology's acker.

Both ack modes give the same outcome for every root (tests hold them to it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ackstream.acker.precombine import precombine, settle
from ackstream.channels.base import Channel
from ackstream.errors import OptionError
from ackstream.sources.offsets import PlannedRoots
from ackstream.topology.anchoring import (
    BY_EDGES,
    BY_ROOTS,
    UNANCHORED,
    Anchoring,
    anchor_pairs,
)
from ackstream.vocabulary.clock import now_ms
from ackstream.vocabulary.records import ACK, FAIL, REJECT

if TYPE_CHECKING:
    from ackstream.topology.hold_tokens import BatchTokens

__all__ = [
    "ACK_MODES",
    "PER_STAGE",
    "TELESCOPED",
    "UNTRACKED",
    "BatchRecords",
    "Continuing",
    "Mode",
    "ack_mode",
    "ack_records",
    "mode_of",
]


@dataclass
class BatchRecords:
    """A batch's ack records: the init records of the roots its offsets planned (made
    only if asked for) and every other record (not pre-combined: the ledger combines
    them)."""

    planned: PlannedRoots | None  #: None: the inits were read from the rows, in ``rest``
    rest: pa.Table
    #: the batch's hold tokens (None: no window held its roots by token)
    tokens: BatchTokens | None = None

    def table(self) -> pa.Table:
        """Every record of the batch."""
        if self.planned is None:
            return self.rest
        return pa.concat_tables([self.planned.inits, self.rest])


class Mode:
    """How a topology tracks its tuples (see the module doc)."""

    name: str
    #: its rows carry lineage columns (``_root``, ``_edge``, ...): its input must have
    #: them, a stage's code must keep them and a stage gives them to the rows it makes
    carries_lineage: bool = True
    #: its batch makes ack records (acks, fails, rejects, holds): else a stage cannot
    #: fail a row, and drops it or stops the query
    makes_ack_records: bool = True
    #: a tuple a stage holds past its batch keeps its tree open: it must go before the
    #: message timeout, and goes when its tree ends (else a window may hold partial
    #: aggregates, not its rows)
    holding_keeps_trees_open: bool = True
    #: how a stage anchors its output to its input
    anchoring: Anchoring
    #: the batch's inits may come from the source's logged offset, not from its rows
    plans_inits: bool = False
    #: the roots are the topology's own: its source tracks them and its acker settles
    #: the trees a batch leaves open (else it has none, or an upstream topology's)
    own_roots: bool = True
    #: the topology continues the trees of an upstream topology
    continues_trees: bool = False
    #: a held tuple keeps its tree open with a hold record of its own, no edge's ack
    #: doing it (see :mod:`ackstream.topology.holding`)
    hold_records: bool = False
    #: a window holding partial aggregates holds the batch's roots by token, its acked
    #: completions waiting for the windows to close (:mod:`ackstream.topology.hold_tokens`)
    holds_by_token: bool = False

    def inits_from_rows(self, planned: PlannedRoots | None) -> bool:
        """Whether a batch reads its roots' inits from its rows: it makes ack records,
        and nothing planned its roots or the mode cannot take planned inits."""
        return self.makes_ack_records and (planned is None or not self.plans_inits)

    def stage_acks(self, inputs: DataFrame, children: DataFrame) -> list[DataFrame]:
        """The ack records a stage sends for its inputs, given the children it emitted."""
        return []

    def sink_acks(self, outputs: DataFrame) -> list[DataFrame]:
        """The ack records of the tuples the sink wrote."""
        return []

    def collected(self, records: DataFrame) -> DataFrame:
        """The batch's ack records (Spark's part) as the driver collects them."""
        return records

    def report(self, records: BatchRecords, channel: Channel, batch_id: int) -> None:
        """Send the batch's ack records where they belong."""
        raise NotImplementedError


class Untracked(Mode):
    name, anchoring, plans_inits, own_roots = "untracked", UNANCHORED, True, False
    carries_lineage = makes_ack_records = holding_keeps_trees_open = False

    def report(self, records: BatchRecords, channel: Channel, batch_id: int) -> None:
        pass  # it has none


class Telescoped(Mode):
    name, anchoring, plans_inits, hold_records = "telescoped", BY_ROOTS, True, True
    holds_by_token = True

    def report(self, records: BatchRecords, channel: Channel, batch_id: int) -> None:
        now = now_ms()
        planned, rest, tokens = records.planned, records.rest, records.tokens
        if tokens is not None:
            rest = tokens.take_outcomes(rest)
        if planned is None:
            done, still_open = settle(rest, now)
        else:  # a planned root no other record names is acked: its init's value is 0
            named = planned.inits_of(pc.unique(rest.column("root")))
            done, still_open = settle(pa.concat_tables([named, rest]), now)
            done = pa.concat_tables([planned.acked(now, named), done])
        if tokens is not None:
            done = tokens.completions(done, now)
        if done.num_rows:
            channel.write_completions(done, batch_id)
        if still_open.num_rows:  # open trees: one record per root for the acker
            channel.write_acks(precombine(still_open))


class PerStage(Mode):
    name, anchoring = "per_stage", BY_EDGES

    def stage_acks(self, inputs: DataFrame, children: DataFrame) -> list[DataFrame]:
        # Storm's ack of every input tuple: its own anchor pairs, XOR the edges of the
        # children it emitted (the children's anchor pairs)
        return [
            ack_records(anchor_pairs(inputs), ACK),
            ack_records(anchor_pairs(children), ACK),
        ]

    def sink_acks(self, outputs: DataFrame) -> list[DataFrame]:
        return [ack_records(anchor_pairs(outputs), ACK)]

    def collected(self, records: DataFrame) -> DataFrame:
        """The plain acks (one per tuple and edge, millions a batch at 100,000 records)
        folded per root in Spark, every other record as it is: the driver collects about
        one record per root, and ``precombine`` finishes the fold. Only numbers are
        aggregated (a string would take Spark off its fast hash aggregation); the
        filters on ``kind``, a constant in each part of the batch's union, drop whole
        parts before they run."""
        acks = records.where(f"kind = {ACK}").groupBy("root").agg(F.bit_xor("value").alias("value"))
        return ack_records(acks, ACK).unionByName(records.where(f"kind != {ACK}"))

    def report(self, records: BatchRecords, channel: Channel, batch_id: int) -> None:
        _to_acker(records, channel)


class Continuing(Mode):
    """The downstream half of trees an upstream topology left open, its acks computed
    as ``acks`` computes them; every record goes to the upstream acker (``channel``
    is the upstream topology's)."""

    own_roots, continues_trees = False, True

    def __init__(self, acks: Mode):
        self.acks = acks
        self.name, self.anchoring, self.hold_records = acks.name, acks.anchoring, acks.hold_records

    def stage_acks(self, inputs: DataFrame, children: DataFrame) -> list[DataFrame]:
        return self.acks.stage_acks(inputs, children)

    def sink_acks(self, outputs: DataFrame) -> list[DataFrame]:
        return self.acks.sink_acks(outputs)

    def collected(self, records: DataFrame) -> DataFrame:
        return self.acks.collected(records)

    def report(self, records: BatchRecords, channel: Channel, batch_id: int) -> None:
        _to_acker(records, channel)


def _to_acker(records: BatchRecords, channel: Channel) -> None:
    table = records.table()
    if table.num_rows:
        channel.write_acks(precombine(table))


UNTRACKED, TELESCOPED, PER_STAGE = Untracked(), Telescoped(), PerStage()

#: the ack modes a topology may be declared with, by name
ACK_MODES: dict[str, Mode] = {mode.name: mode for mode in (TELESCOPED, PER_STAGE)}


def ack_mode(name: str) -> Mode:
    """The ack mode called ``name``, or an :class:`OptionError` naming the choices."""
    if name not in ACK_MODES:
        raise OptionError("ack_mode", name, " or ".join(repr(n) for n in ACK_MODES))
    return ACK_MODES[name]


def mode_of(tracking: bool, acks: str, continue_trees: bool) -> Mode:
    """The mode of a topology declared with ``tracking``, ``ack_mode=acks`` (checked
    even untracked) and ``continue_trees``."""
    mode = ack_mode(acks)
    if not tracking:
        return UNTRACKED
    return Continuing(mode) if continue_trees else mode


def ack_records(pairs: DataFrame, kind: int) -> DataFrame:
    """Ack records from ``(root, value)`` rows (``(root, reason)`` for fails and rejects),
    no coordinates and no time (the batch sets it on the driver: see ``BatchRun.records``).
    SQL text, and no casts but of constants: each Column object is a call to the JVM, and
    a cast of a column costs the collecting job (up to a third at 10,000 rows); the union
    widens the types and pre-combination fixes them."""
    acking = kind not in (FAIL, REJECT)
    return pairs.selectExpr(
        "root",
        f"{'value' if acking else '0L'} AS value",
        f"CAST({kind} AS byte) AS kind",
        "CAST(NULL AS string) AS topic",
        "CAST(NULL AS int) AS partition",
        "CAST(NULL AS long) AS offset",
        "CAST(NULL AS long) AS attempt",
        "CAST(NULL AS long) AS ts",
        f"{'CAST(NULL AS string)' if acking else 'reason'} AS reason",
    )
