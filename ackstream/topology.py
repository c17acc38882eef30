"""Topology: bolt stages declared over a tracked stream, run in ``foreachBatch``.

A topology is Storm's idea in Spark terms: a chain of bolt stages written as
ordinary DataFrame or SQL code, ending in a sink. Each micro-batch runs the whole
chain inside ``foreachBatch``; ackstream anchors every output tuple to its
inputs, acks and fails them, and pre-combines the batch's ack records per root
(XOR of values). Then it runs the XOR ledger over them: a tree the batch closed
(value 0 with its init, or failed) is reported straight to the completion
channel, and only the records of trees left open go to the ack channel, where
the acker query (started with the topology) waits for the rest. So the acker
query is off the path of every tree that lives within one batch: its batches
cost as much as a topology batch and would double the latency.

Order within a batch is the guarantee: outputs go to the sink first, completions
and ack records after. A crash in between replays the batch's roots; nothing is
acked unwritten.

>>> topology = (Topology("words", spark, channel)                    # doctest: +SKIP
...     .explode(F.split("value", " "), "word")
...     .fail_where(F.col("word") == "boom")
...     .aggregate("word", F.count("*").alias("n"))
...     .sink(MemorySink()))
>>> running = topology.start(spark.readStream.format("ackstream").load(), "/tmp/ckpt")
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ackstream.acker.precombine import precombine, settle
from ackstream.acker.query import start_acker
from ackstream.bolts import (
    REASON,
    REASON_LIMIT,
    AggregateStage,
    ExplodeStage,
    FailWhereStage,
    FilterStage,
    MapStage,
    PandasBoltStage,
    RejectWhereStage,
    SqlStage,
    Stage,
    anchor_pairs,
    failed_roots,
)
from ackstream.errors import OptionError, StageError
from ackstream.records import ACK, ACK_RECORD_SCHEMA, FAIL, INIT, REJECT, as_table
from ackstream.sources.offsets import logged_offsets, planned_inits

__all__ = ["Topology", "RunningTopology", "TRACKED_COLUMNS"]

log = logging.getLogger(__name__)

#: Columns a tracked input stream must have (the ``ackstream`` source's own).
TRACKED_COLUMNS = ("_root", "_edge", "_attempt", "topic", "partition", "offset")


class Topology:
    """A named chain of bolt stages over a tracked stream, with its ack channel.

    Declaring methods return the topology, so stages chain like DataFrame code.
    ``tracking=False`` runs the same stages and writes no ack records at all (the
    input then needs no lineage columns): the baseline to measure tracking against.

    ``ack_mode`` says how a batch's acks are computed; both give the same outcome
    for every root (tests hold them to it):

    - ``"telescoped"`` (the default) makes each root's init with value 0, plus the
      fails. Inside one batch Storm's acks telescope: what a stage emits, the next
      stage acks, and what the sink writes, it acks; each root's XOR of them equals
      its init's value, so only the init (the root was read) and the fails (a stage
      or the sink failed one of its tuples) carry information. Rows a stage drops,
      unanchored emits and multi-anchored aggregate rows cancel out alike. Stages
      then carry roots only, no edge ids, and the batch settles its own trees.
    - ``"per_stage"`` is Storm-faithful: it computes every stage's acks as Storm's
      bolts would send them (persisting each stage's output so that both sides of
      an edge see the same rows), XORs them per root and sends them all to the
      acker query. It costs a few times the batch time; use it to watch the XOR
      ledger at work.
    """

    ACK_MODES = ("per_stage", "telescoped")

    def __init__(self, name: str, spark, channel, *, tracking: bool = True,
                 ack_mode: str = "telescoped"):
        if ack_mode not in self.ACK_MODES:
            raise OptionError("ack_mode", ack_mode, " or ".join(self.ACK_MODES))
        self.name, self.spark, self.channel, self.tracking = name, spark, channel, tracking
        self.per_stage = ack_mode == "per_stage"
        self.stages: list[Stage] = []
        self.output = None
        self._offset_log: str | None = None  # the topology query's checkpoint, once started

    # --- declaring stages -----------------------------------------------------------

    def _add(self, cls, *args, name=None) -> Topology:
        if self.output is not None:
            raise StageError(cls.kind, "the topology already ends in a sink")
        self.stages.append(cls(len(self.stages) + 1, *args, name=name))
        return self

    def map(self, fn, *, name: str | None = None) -> Topology:
        """Row-wise DataFrame code, ``fn(df) -> df`` (``withColumn``, ``select('*', ...)``):
        at most one output row per input row, lineage columns kept. For one-to-many
        use :meth:`explode` or :meth:`pandas_bolt`."""
        return self._add(MapStage, fn, name=name)

    def filter(self, condition: Column | str, *, name: str | None = None) -> Topology:
        """Keep the rows where ``condition`` holds; every other row is acked."""
        return self._add(FilterStage, condition, name=name)

    where = filter

    def fail_where(self, condition: Column | str, reason: Column | str | None = None, *,
                   name: str | None = None) -> Topology:
        """Fail the tuples where ``condition`` holds: their roots are replayed (after the
        last retry, dead-lettered with ``reason``; default: the stage and condition)."""
        return self._add(FailWhereStage, condition, reason, name=name)

    def reject_where(self, condition: Column | str, reason: Column | str | None = None, *,
                     name: str | None = None) -> Topology:
        """Dead-letter the records whose tuples match ``condition`` at once, with
        ``reason``, without replays: for input that can never succeed (undecodable,
        null, out of range). ``reason`` may be a column, to say what was wrong."""
        return self._add(RejectWhereStage, condition, reason, name=name)

    def explode(self, column: Column | str, alias: str, *, name: str | None = None) -> Topology:
        """One child row per element of the array ``column``, in a new column ``alias``."""
        return self._add(ExplodeStage, column, alias, name=name)

    def sql(self, text: str, *, view: str = "tuples", name: str | None = None) -> Topology:
        """Row-wise SQL over the stage input, visible as the view ``view``; select the
        lineage columns along (``SELECT *, upper(word) AS w FROM tuples``)."""
        return self._add(SqlStage, text, view, name=name)

    def aggregate(self, keys, *aggs: Column, name: str | None = None) -> Topology:
        """``groupBy(keys).agg(*aggs)`` within each batch; each output row is anchored
        to all of its input tuples (multi-anchoring, across roots)."""
        keys = [keys] if isinstance(keys, str | Column) else list(keys)
        return self._add(AggregateStage, keys, aggs, name=name)

    def pandas_bolt(self, fn, schema: str, *, name: str | None = None) -> Topology:
        """A pandas bolt, ``fn(frame) -> frame`` indexed by parent row position (Storm's
        ``emit(anchor, values)``; -1: unanchored); ``schema`` is its output DDL. An
        exception fails only the roots of the rows that raise it."""
        return self._add(PandasBoltStage, fn, schema, name=name)

    def sink(self, sink) -> Topology:
        """End the chain in ``sink`` (``MemorySink``, ``ConsoleSink``, ``KafkaSink``, or
        anything with ``write(outputs, batch_id)``): its output tuples are acked once
        it returns, except the rows it hands back as not written, whose roots fail.
        Without a sink the final tuples are acked at the end of each batch."""
        if self.output is not None:
            raise StageError("sink", "the topology already ends in a sink")
        self.output = sink
        return self

    # --- running ----------------------------------------------------------------------

    def run_batch(self, batch: DataFrame, batch_id: int = 0,
                  inits: pa.Table | None = None) -> pa.Table:
        """Run every stage on ``batch`` (a static DataFrame), write the sink, and return
        the batch's ack records, pre-combined per root, without writing them. This is
        the body of the topology's ``foreachBatch``; tests and notebooks call it directly.

        ``inits``: the batch's telescoped init records, when they are known without
        reading the batch (from the source's offset, see :meth:`process_batch`); else
        they are read from the rows, which then costs a cache and a second Spark job.
        """
        return precombine(self._run(batch, batch_id, inits))

    def _run(self, batch: DataFrame, batch_id: int, inits: pa.Table | None) -> pa.Table:
        """:meth:`run_batch` without the pre-combination (the ledger combines anyway)."""
        self._check_input(batch)
        now = int(time.time() * 1000)
        kept: list[DataFrame] = []

        def keep(df: DataFrame) -> DataFrame:
            df = df.persist()
            kept.append(df)
            return df

        try:
            read_inits = self.tracking and (inits is None or self.per_stage)
            # then the batch is read more than once (sink, init records): read it once
            tuples = keep(batch) if read_inits else batch
            parts = [_init_records(tuples, now, self.per_stage)] if read_inits else []
            for stage in self.stages:
                out = stage.run(tuples, self.tracking, edges=self.per_stage)
                kept.extend(out.cached)
                children = keep(out.tuples) if self.per_stage else out.tuples
                if self.tracking and self.per_stage:
                    # Storm's ack of every input tuple: its own anchor pairs, XOR the
                    # edges of the children it emitted (the children's anchor pairs)
                    parts += [_records(anchor_pairs(tuples), ACK, now),
                              _records(anchor_pairs(children), ACK, now)]
                if self.tracking and out.failed is not None:
                    parts.append(_records(failed_roots(out.failed), FAIL, now))
                if self.tracking and out.rejected is not None:
                    parts.append(_records(failed_roots(out.rejected), REJECT, now))
                tuples = children
            parts += self._write_sink(tuples, batch_id, now)
            if not self.tracking:
                return ACK_RECORD_SCHEMA.empty_table()
            tables = [] if read_inits else [inits]
            if parts:
                tables.append(as_table(_union_all(parts).toArrow(), ACK_RECORD_SCHEMA))
            return pa.concat_tables(tables)
        finally:
            for df in kept:
                df.unpersist()

    def _check_input(self, tuples: DataFrame) -> None:
        missing = [c for c in TRACKED_COLUMNS if c not in tuples.columns]
        if self.tracking and missing:
            raise StageError("input", f"the input stream lacks the tracked column(s) {missing}; "
                             "read it with format('ackstream') or use tracking=False")

    def _write_sink(self, outputs: DataFrame, batch_id: int, now: int) -> list[DataFrame]:
        """Write the final tuples; return their ack records (and fails for unwritten rows)."""
        unwritten, reason = None, f"sink {type(self.output).__name__}: not written"
        if self.output is not None:
            try:
                unwritten = self.output.write(outputs, batch_id)
            except Exception as error:  # a failed write fails its roots, Storm-style
                log.exception("topology %s: sink write of batch %d failed", self.name, batch_id)
                unwritten = outputs
                reason = f"sink {type(self.output).__name__}: {type(error).__name__}: {error}"
        if not self.tracking:
            return []
        parts = [_records(anchor_pairs(outputs), ACK, now)] if self.per_stage else []
        if isinstance(unwritten, pa.Table) and unwritten.num_rows:
            unwritten = outputs.sparkSession.createDataFrame(unwritten)
        if isinstance(unwritten, DataFrame):
            if REASON not in unwritten.columns:
                unwritten = unwritten.withColumn(REASON, F.lit(reason[:REASON_LIMIT]))
            parts.append(_records(failed_roots(unwritten), FAIL, now))
        return parts

    def process_batch(self, batch: DataFrame, batch_id: int) -> None:
        """The ``foreachBatch`` function: run the batch, then report what became of its
        roots. Telescoped, the batch settles the trees it closed itself (their
        completions go straight to the completion channel) and sends only the open
        ones to the acker; per stage, every record goes to the acker query, as in Storm.

        Telescoped, the batch's roots come from the source's offset for this batch in
        the query's offset log, so the input is read once, by the stages: a root the
        stages drop, or a record the source never hands them, is acked like a filtered
        tuple (a rejection by the source still wins, see ``Tracker.complete``)."""
        records = self._run(batch, batch_id, self._planned_inits(batch_id))
        if not self.per_stage:
            done, records = settle(records, int(time.time() * 1000))
            if done.num_rows:
                self.channel.write_completions(done, batch_id)
        if records.num_rows:  # open trees: one record per root for the acker
            self.channel.write_acks(precombine(records))

    def _planned_inits(self, batch_id: int) -> pa.Table | None:
        """The init records of every root of batch ``batch_id``, from the offsets Spark
        logged for it; None when they must be read from the rows (per-stage acks, a run
        not started by :meth:`start`, an offset written before it named its records)."""
        if self.per_stage or not self.tracking or self._offset_log is None:
            return None
        try:
            offsets = logged_offsets(self.spark, self._offset_log, batch_id)
        except Exception:  # a Spark whose offset log looks otherwise: slower, still right
            log.warning("topology %s: no offset log for batch %d under %s; reading the "
                        "batch's roots from its rows", self.name, batch_id, self._offset_log,
                        exc_info=True)
            return None
        now = int(time.time() * 1000)
        tables = [planned_inits(offset, now) for offset in offsets]
        if not tables or any(t is None for t in tables):
            return None
        return pa.concat_tables(tables)

    def start(self, tuples: DataFrame, checkpoint: str, *, trigger_ms: int = 500,
              ackers: int = 2, message_timeout_ms: int = 30_000, acker: bool = True,
              acker_trigger_ms: int | None = None) -> RunningTopology:
        """Start the topology query over the tracked stream ``tuples`` and, unless
        ``acker=False`` (an acker runs elsewhere) or tracking is off, the acker query.
        Checkpoints go to ``<checkpoint>/topology`` and ``<checkpoint>/acker``."""
        self._check_input(tuples)
        self._offset_log = os.path.join(checkpoint, "topology")
        acker_query = None
        if acker and self.tracking:
            acker_query = start_acker(
                self.spark, self.channel, checkpoint=os.path.join(checkpoint, "acker"),
                ackers=ackers, message_timeout_ms=message_timeout_ms,
                trigger_ms=acker_trigger_ms or trigger_ms, query_name=f"{self.name}.acker")
        try:
            query = (
                tuples.writeStream.foreachBatch(self.process_batch)
                .option("checkpointLocation", os.path.join(checkpoint, "topology"))
                .trigger(processingTime=f"{trigger_ms} milliseconds")
                .queryName(self.name)
                .start()
            )
        except Exception:
            if acker_query is not None:
                acker_query.stop()
            raise
        return RunningTopology(query, acker_query)


@dataclass
class RunningTopology:
    """The two streaming queries of a started topology."""

    query: object  # StreamingQuery running the stages
    acker: object | None  # StreamingQuery running the acker, None when not started here

    @property
    def queries(self) -> list:
        return [q for q in (self.query, self.acker) if q is not None]

    def is_active(self) -> bool:
        return all(q.isActive for q in self.queries)

    def exception(self):
        """The first query's error, if one stopped with an error."""
        return next((e for e in (q.exception() for q in self.queries) if e), None)

    def process_all_available(self) -> None:
        """Block until the topology query has processed every input available now."""
        self.query.processAllAvailable()

    def await_termination(self, timeout_s: float | None = None) -> bool:
        return self.query.awaitTermination(timeout_s)

    def stop(self) -> None:
        """Stop the topology query, then the acker (so it sees the last ack records)."""
        for q in self.queries:
            try:
                q.stop()
            except Exception:  # stop the other query all the same
                log.exception("stopping query %s failed", q.name)


def _init_records(tuples: DataFrame, now: int, with_edges: bool = True) -> DataFrame:
    """The spout's init record per input tuple: value = its edge id (0 when the acks
    of the whole batch were telescoped into it), with the source coordinates."""
    value = "_edge" if with_edges else "0L"
    return tuples.where("_root IS NOT NULL").selectExpr(
        "_root AS root", f"{value} AS value", f"CAST({INIT} AS byte) AS kind", "topic",
        "partition", "offset", "_attempt AS attempt", f"{now}L AS ts",
        "CAST(NULL AS string) AS reason")


def _records(pairs: DataFrame, kind: int, now: int) -> DataFrame:
    """Ack records from ``(root, value)`` rows (``(root, reason)`` for fails and rejects),
    no coordinates. SQL text, and no casts but of constants: each Column object is a
    call to the JVM, and a cast of a column costs the collecting job (up to a third at
    10,000 rows); the union widens the types and pre-combination fixes them."""
    acking = kind not in (FAIL, REJECT)
    return pairs.selectExpr(
        "root", f"{'value' if acking else '0L'} AS value", f"CAST({kind} AS byte) AS kind",
        "CAST(NULL AS string) AS topic", "CAST(NULL AS int) AS partition",
        "CAST(NULL AS long) AS offset", "CAST(NULL AS long) AS attempt", f"{now}L AS ts",
        f"{'CAST(NULL AS string)' if acking else 'reason'} AS reason")


def _union_all(parts: list[DataFrame]) -> DataFrame:
    out = parts[0]
    for part in parts[1:]:
        out = out.unionByName(part)
    return out
