"""One micro-batch of a topology: run the stages and the sink, then report the trees.

Order within a batch is the guarantee: outputs go to the sink first, completions
and ack records after. A crash in between replays the batch's roots; nothing is
acked unwritten.

How the batch's acks are computed, and where they go, is its topology's mode
(:mod:`ackstream.topology.modes`).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol, cast

import pyarrow as pa
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ackstream.acker.precombine import precombine
from ackstream.channels.base import Channel
from ackstream.errors import EnvironmentProblem, OptionError, StageError
from ackstream.sinks.continued import Lineage, UpstreamResets, lineage_of, translate
from ackstream.sources.offsets import PlannedRoots
from ackstream.spark.jobs import described_jobs
from ackstream.topology.anchoring import GroupInput
from ackstream.topology.bolts import (
    BatchContext,
    Stage,
    StageOutput,
    failed_roots,
    with_tree_roots,
)
from ackstream.topology.graph import (
    SPOUT,
    SinkNode,
    join_streams,
    subscriber_copies,
    subscribers,
)
from ackstream.topology.held_watch import HeldWatch
from ackstream.topology.hold_tokens import BatchTokens, HoldTokens
from ackstream.topology.modes import BatchRecords, Mode, ack_records
from ackstream.topology.outage import StoppedWaiting, written_through
from ackstream.topology.stage_counts import StageCounts
from ackstream.vocabulary.clock import now_ms
from ackstream.vocabulary.lineage import ATTEMPT, EDGE, NO_RECORD, REASON, REASON_LIMIT, ROOT, ROOTS
from ackstream.vocabulary.records import ACK, ACK_RECORD_SCHEMA, FAIL, INIT, REJECT, as_table, timed

if TYPE_CHECKING:
    from ackstream.sinks.base import ContinuingSink

__all__ = ["BatchRun", "DeclaredTopology", "run_batch"]

log = logging.getLogger(__name__)


class DeclaredTopology(Protocol):
    """What a batch reads of the topology it runs (``Topology`` is one): declared
    here, below the declaration, so that the batch imports nothing above it."""

    name: str
    mode: Mode
    message_timeout_ms: int
    held_folder: str | None
    hold_tokens: HoldTokens
    stages: list[Stage]
    sinks: list[SinkNode]

    @property
    def channel(self) -> Channel | None: ...


def run_batch(
    topology: DeclaredTopology,
    batch: DataFrame,
    batch_id: int,
    planned: PlannedRoots | None,
    counts: StageCounts | None = None,
    now: int | None = None,
    reported: bool = False,
) -> BatchRecords:
    """Run every stage of ``topology`` on ``batch`` (a static DataFrame), write the
    sinks, and return the batch's ack records. ``planned``: the batch's roots when
    they are known without reading the batch (from the source's offset); else their
    inits are read from the rows, which then costs a cache and a second Spark job.
    ``counts``: where to count each stage's and sink's tuples in and out, as the
    batch's jobs read them. ``now``: the batch's time (default: the clock's).
    ``reported``: the records go to the mode's report (a started topology's batch),
    where a window may hold the batch's roots by token; returned records alone cannot
    say that, so without it a tracked window holds rows and their roots."""
    run = BatchRun(topology, batch_id, planned, counts, now, reported)
    spark = batch.sparkSession

    def part(name: str) -> contextlib.AbstractContextManager[None]:
        return described_jobs(spark, f"ackstream {topology.name}: {name}")

    try:
        with part("spout"):
            run.read_spout(batch)
        for stage in topology.stages:
            with part(f"stage {stage.name}"):
                run.run_stage(stage)
        for node in topology.sinks:
            with part(f"sink {node.name}"):
                run.write_sink(node)
        with part("ack records"):
            run.read_held_back(batch)
            return run.records()
    finally:
        run.release()


class BatchRun:
    """One batch of a topology, phase by phase (see :func:`run_batch`): what the stages
    handed on, the ack records gathered so far (Spark frames to collect at the end,
    Arrow tables made on the driver), and the frames persisted on the way."""

    def __init__(
        self,
        topology: DeclaredTopology,
        batch_id: int,
        planned: PlannedRoots | None,
        counts: StageCounts | None,
        now: int | None = None,
        reported: bool = False,
    ):
        self.topology, self.batch_id, self.planned = topology, batch_id, planned
        self.reported = reported
        self.mode = topology.mode
        self.now = now_ms() if now is None else now
        self.subs = subscribers(topology.stages, topology.sinks)
        #: nothing planned: no job may read the batch to count it
        self.counts = None if planned is not None and not planned.num_rows else counts
        #: per stage or sink, what it reads: a copy of each stream it subscribes to, by name
        self.copies: dict[str, dict[str, DataFrame]] = {}
        self.groups: dict[int, GroupInput] = {}  # aggregates' inputs: roots of failed rows
        self.frames: list[DataFrame] = []  # ack records, collected in one job at the end
        self.tables: list[pa.Table] = []  # ack records made on the driver
        #: ack records of upstream trees this topology passes on to another process
        self.passed_on: list[pa.Table] = []
        self.kept: list[DataFrame] = []
        self.watch: HeldWatch | None = None
        self.upstream: dict[int, Lineage] | None = None  # continued trees: the upstream lineage
        self.read_inits = self.mode.inits_from_rows(planned)
        self.context = BatchContext(
            self.mode,
            batch_id,
            self.now,
            topology.channel,
            topology.message_timeout_ms,
            topology.held_folder,
            groups=self.groups,  # filled as the stages run
            tokens=self._tokens(),
        )

    def _tokens(self) -> BatchTokens | None:
        """The batch's hold tokens, when its windows may hold its roots by token: a
        reported batch of its own roots (telescoped), no sink of which continues the
        trees (it writes each row's roots, which a token-held window no longer has)."""
        topology = self.topology
        if not (self.reported and self.mode.holds_by_token):
            return None
        if any(node.continues_trees for node in topology.sinks):
            return None
        return topology.hold_tokens.batch(topology.held_folder, self.batch_id)

    # --- the phases -------------------------------------------------------------------

    def read_spout(self, batch: DataFrame) -> None:
        """The spout's stream: the batch without the rows the source held back, whose
        acks (and the batch's inits, when they must be read) are gathered here."""
        held = self.mode.makes_ack_records and REASON in batch.columns  # rows the source held back
        readers = len(self.subs[SPOUT])
        if held and not self.read_inits and readers == 1:
            planned = 0 if self.planned is None else self.planned.num_rows
            self.watch = HeldWatch(batch, planned)  # counted as the sink reads
            spout = self.watch.frame
        else:  # the batch is read more than once (init records, held rows): read it once
            several = self.read_inits or held or readers > 1
            spout = self._keep(batch) if several else batch
        if self.mode.continues_trees:
            self.upstream = continued_lineage(spout, self.topology.name)
            resets = UpstreamResets(self.topology.channel, self.upstream)
            self.context = replace(self.context, resets=resets)
        if self.read_inits:
            self.frames.append(init_records(spout, self.mode.anchoring.edges))
        if held and self.watch is None:
            self.frames += held_back_acks(spout.where(f"{REASON} IS NOT NULL"), self.mode)
        if REASON in batch.columns:  # no stage sees a held-back row or the column
            spout = spout.where(f"{REASON} IS NULL").drop(REASON)
        self._publish(spout, SPOUT, 0)

    def run_stage(self, stage: Stage) -> None:
        """Run ``stage`` on the streams it subscribes to; gather its acks and fails."""
        streams = self.copies.pop(stage.name)
        tuples = stage.combine(streams)
        if tuples is None:
            tuples = join_streams(list(streams.values()))
        tuples = self._count(tuples, stage, "in")
        out = stage.run(tuples, self.context)
        self.kept.extend(out.cached)
        if out.groups is not None:
            self.groups[stage.number] = out.groups
        # both sides of an edge must see the same rows; subscribers share them
        children = self._count(out.tuples, stage, "out")
        if self.mode.anchoring.edges or len(self.subs[stage.name]) > 1:
            children = self._keep(children)
        if self.mode.makes_ack_records:
            self._gather_stage_acks(tuples, out, children)
        self._publish(children, stage.name, stage.number)

    def write_sink(self, node: SinkNode) -> None:
        streams = list(self.copies.pop(node.name).values())
        outputs = self._count(join_streams(streams), node, "in")
        written = _write_sink(
            self.topology, node, outputs, self.batch_id, self.groups, self.upstream
        )
        self.frames += written.frames
        self.tables += written.tables
        self.passed_on += written.passed_on

    def read_held_back(self, batch: DataFrame) -> None:
        """The held-back rows' acks, when the sink's job did not count them (or some)."""
        if self.watch is not None and self.watch.held() != 0:
            held = batch.where(f"{REASON} IS NOT NULL")
            self.frames += held_back_acks(held, self.mode)

    def records(self) -> BatchRecords:
        """The batch's ack records, in one Spark job; when this topology continues
        upstream trees, translated for their acker (the inits are then read from the
        rows: nothing is planned)."""
        if not self.mode.makes_ack_records:
            return BatchRecords(None, ACK_RECORD_SCHEMA.empty_table())
        tables = list(self.tables)
        if self.frames:
            frame = self.mode.collected(_union_all(self.frames))
            collected = as_table(frame.toArrow(), ACK_RECORD_SCHEMA)
            # the batch's time set here, not in the plans: a long literal that changes
            # every batch would have Spark compile the collecting job's code every batch
            tables.append(timed(collected, self.now))
        rest = pa.concat_tables(tables) if tables else ACK_RECORD_SCHEMA.empty_table()
        if self.upstream is not None:
            local = translate(precombine(rest), self.upstream, self.now)
            rest = pa.concat_tables([local, *self.passed_on])
        return BatchRecords(None if self.read_inits else self.planned, rest, self.context.tokens)

    def release(self) -> None:
        for df in self.kept:
            df.unpersist()

    # --- helpers ----------------------------------------------------------------------

    def _gather_stage_acks(self, tuples: DataFrame, out: StageOutput, children: DataFrame) -> None:
        acked = tuples if out.acked is None else out.acked
        self.frames += self.mode.stage_acks(acked, children)
        if out.holds is not None:
            self.frames.append(ack_records(out.holds, ACK))
        if out.fails is not None:
            self.frames.append(ack_records(out.fails, FAIL))
        if out.failed is not None:
            self.frames.append(ack_records(failed_roots(out.failed, self.groups), FAIL))
        if out.rejected is not None:
            rejected = failed_roots(out.rejected, self.groups)
            self.frames.append(ack_records(rejected, REJECT))

    def _publish(self, stream: DataFrame, name: str, number: int) -> None:
        """Hand ``stream`` to its subscribers; a stream nobody reads is acked."""
        names = self.subs[name]
        if not names:
            self.frames += self.mode.sink_acks(stream)
        handed = subscriber_copies(stream, number, names, self.mode.anchoring)
        if self.mode.anchoring.edges and len(names) > 1:
            # the fan-out acks the stream and emits the copies
            copies = _union_all(list(handed.values()))
            self.frames += self.mode.stage_acks(stream, copies)
        for subscriber, copy in handed.items():
            self.copies.setdefault(subscriber, {})[name] = copy

    def _keep(self, df: DataFrame) -> DataFrame:
        df = df.persist()
        self.kept.append(df)
        return df

    def _count(self, df: DataFrame, node: Stage | SinkNode, side: str) -> DataFrame:
        return df if self.counts is None else self.counts.watch(df, node.name, side)


@dataclass
class SinkAcks:
    """The ack records of a sink's write: Spark frames, the Arrow table of the
    messages that continue their trees in another process, and (a middle hop) that
    of the messages that pass upstream trees on, already in the upstream's terms."""

    frames: list[DataFrame]
    tables: list[pa.Table]
    passed_on: list[pa.Table]


def _write_sink(
    topology: DeclaredTopology,
    node: SinkNode,
    outputs: DataFrame,
    batch_id: int,
    groups: dict[int, GroupInput],
    upstream: dict[int, Lineage] | None = None,
) -> SinkAcks:
    """Write tuples to ``node``'s sink; return their ack records (and fails for unwritten
    rows). A sink that continues the trees also gives the ack records of the tuples it
    emitted to another process: their trees stay open until that process acks. With
    ``upstream`` (this topology continues trees itself: its local roots' lineage), the
    messages name the upstream roots instead, and their acks go to the upstream acker
    as they are (see :func:`with_upstream_roots`). A sink that does not answer
    (:class:`~ackstream.errors.Unreachable`) fails no row: the batch waits for it and
    writes again (:mod:`ackstream.topology.outage`)."""
    sink = node.sink
    unwritten: DataFrame | None = None
    reason = f"sink {type(sink).__name__}: not written"
    continued = None  # a sink that continues the trees: its messages' (root, edge) acks
    try:
        if topology.mode.carries_lineage and node.continues_trees:
            rooted = with_tree_roots(outputs, groups)  # the sink writes each row's roots
            if upstream is not None:
                rooted = with_upstream_roots(rooted, upstream)
            # continues_trees: Topology.sink found the sink's continue_trees true
            continuing = cast("ContinuingSink", sink)
            unwritten, continued = written_through(
                lambda: continuing.write_continued(rooted, batch_id), topology.name, batch_id
            )
        else:
            unwritten = written_through(
                lambda: sink.write(outputs, batch_id), topology.name, batch_id
            )
    except Exception as error:  # a failed write fails its roots, Storm-style
        if isinstance(error, StoppedWaiting):  # the sink did not answer before the stop
            raise
        if isinstance(error, EnvironmentProblem):  # e.g. the sink's topic is gone
            raise  # the query stops naming it: replaying cannot mend it
        if isinstance(error, (StageError, PySparkException, Py4JJavaError)) or (
            "StageError:" in str(error)
        ):
            # a stage's code is wrong, or a Spark job computing the outputs failed (the
            # sink only ran it): the batch fails as a whole (see batch_failure)
            raise
        log.exception("topology %s: sink write of batch %d failed", topology.name, batch_id)
        unwritten = outputs
        reason = f"sink {type(sink).__name__}: {type(error).__name__}: {error}"
    if not topology.mode.makes_ack_records:
        return SinkAcks([], [], [])
    acks = SinkAcks(topology.mode.sink_acks(outputs), [], [])
    if unwritten is not None:
        if REASON not in unwritten.columns:
            unwritten = unwritten.withColumn(REASON, F.lit(reason[:REASON_LIMIT]))
        acks.frames.append(ack_records(failed_roots(unwritten, groups), FAIL))
    if continued is not None and continued.num_rows:
        (acks.tables if upstream is None else acks.passed_on).append(continued)
    return acks


def with_upstream_roots(rooted: DataFrame, upstream: dict[int, Lineage]) -> DataFrame:
    """``rooted`` with its ``_roots`` (this topology's local roots) replaced by the
    upstream roots of their messages, once each: a middle hop passes the upstream trees
    on, so that the next process acks them in the upstream acker's terms.

    Its batch's acks then add, per upstream root, the edge of its incoming message
    (:func:`~ackstream.sinks.continued.translate`) and the edge of each outgoing message
    (the sink's ``(root, edge)`` records, which bypass ``translate``): the tree waits
    for the next process as it waited for this one. A row of two local roots that share
    an upstream root names it once, as its edge is sent once. A local root without
    lineage names none: its row is untracked downstream too."""
    roots_of = {local: roots for local, (roots, _) in upstream.items()}

    def passed_on(local: list[int]) -> list[int]:
        return sorted({u for r in local for u in roots_of.get(r, ())})

    return rooted.withColumn(ROOTS, F.udf(passed_on, "array<bigint>", useArrow=True)(ROOTS))


def continued_lineage(spout: DataFrame, name: str) -> dict[int, Lineage]:
    """Per root of a downstream topology's input rows, the upstream roots and edge its
    message's headers name (:mod:`ackstream.sinks.continued`); rows without are counted and
    logged: they are processed untracked."""
    if "headers" not in spout.columns:
        raise OptionError(
            "includeHeaders",
            "false",
            "true: a topology with continue_trees reads the upstream lineage from the "
            "headers (read the stream with topology.read_stream(...))",
        )
    rows = spout.where(f"{ROOT} IS NOT NULL").select(ROOT, "headers").toArrow().to_pylist()
    found = {}
    for row in rows:
        pairs = [(h["key"], h["value"]) for h in row["headers"] or ()]
        lineage = lineage_of(pairs)
        if lineage is not None:
            found[row[ROOT]] = lineage
    if len(found) < len(rows):
        log.warning(
            "topology %s: %d input record(s) carry no upstream lineage headers; they are "
            "processed untracked",
            name,
            len(rows) - len(found),
        )
    return found


def held_back_acks(held: DataFrame, mode: Mode) -> list[DataFrame]:
    """The ack records of the rows the source held back from the bolts (see
    ``ackstream.sources.rows``): an offset with no record is acked as if the sink had
    written it; any other is rejected with its ``_reason`` (no replay)."""
    no_record = f"{REASON} = '{NO_RECORD}'"
    rejected = held.where(f"NOT ({no_record})").selectExpr(f"{ROOT} AS root", f"{REASON} AS reason")
    return [ack_records(rejected, REJECT), *mode.sink_acks(held.where(no_record))]


def init_records(tuples: DataFrame, with_edges: bool = True) -> DataFrame:
    """The spout's init record per input tuple: value = its edge id (0 when the acks
    of the whole batch were telescoped into it), with the source coordinates."""
    value = EDGE if with_edges else "0L"
    return tuples.where(f"{ROOT} IS NOT NULL").selectExpr(
        f"{ROOT} AS root",
        f"{value} AS value",
        f"CAST({INIT} AS byte) AS kind",
        "topic",
        "partition",
        "offset",
        f"{ATTEMPT} AS attempt",
        "CAST(NULL AS long) AS ts",  # the batch's time: set on the driver
        "CAST(NULL AS string) AS reason",
    )


def _union_all(parts: list[DataFrame]) -> DataFrame:
    out = parts[0]
    for part in parts[1:]:
        out = out.unionByName(part)
    return out
