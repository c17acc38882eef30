"""The topology DSL: bolt stages declared over a tracked stream, ending in a sink.

A topology is Storm's idea in Spark terms: a chain of bolt stages written as
ordinary DataFrame or SQL code, ending in a sink. Each micro-batch runs the whole
chain inside ``foreachBatch`` (:mod:`ackstream.topology.batch`); ackstream anchors
every output tuple to its inputs, acks and fails them.

>>> topology = (Topology("words", spark, channel)                    # doctest: +SKIP
...     .explode(F.split("value", " "), "word")
...     .fail_where(F.col("word") == "boom")
...     .aggregate("word", F.count("*").alias("n"))
...     .sink(MemorySink()))
>>> running = topology.start(topology.read_stream(), "/tmp/ckpt")   # doctest: +SKIP
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import pyarrow as pa
from pyspark.sql import Column, DataFrame

from ackstream.acker.precombine import precombine
from ackstream.channels import KafkaChannel, LocalChannel, check_reach
from ackstream.errors import OptionError, StageError
from ackstream.lineage import TRACKED_COLUMNS
from ackstream.session import master_of
from ackstream.sources.upstream import check_options
from ackstream.topology.batch import ack_mode as ack_mode_named
from ackstream.topology.batch import run_batch
from ackstream.topology.bolts import (
    AggregateStage,
    ExplodeStage,
    FailWhereStage,
    FilterStage,
    MapStage,
    PandasBoltStage,
    RejectWhereStage,
    SqlStage,
    Stage,
)
from ackstream.topology.running import RunningTopology, same_term, start_topology

__all__ = ["Topology"]


class Topology:
    """A named chain of bolt stages over a tracked stream, with its ack channel.

    Declaring methods return the topology, so stages chain like DataFrame code.
    ``tracking=False`` runs the same stages and writes no ack records at all (the
    input then needs no lineage columns): the baseline to measure tracking against.

    The topology owns the facts its source must share: its ``name`` (the id
    namespace, the channel topics, the consumer group), its ``channel`` and its
    ``message_timeout_ms`` (Storm's message timeout, which the acker enforces and
    the source's tick follows). :meth:`read_stream` gives them to the source; a
    source given others is refused at the first batch, naming both values.

    ``ack_mode`` says how a batch's acks are computed, ``"telescoped"`` (the
    default) or ``"per_stage"`` (Storm-faithful, every edge through the acker);
    both give the same outcome for every root (see :mod:`ackstream.topology.batch`).
    """

    def __init__(
        self,
        name: str,
        spark,
        channel,
        *,
        message_timeout_ms: int = 30_000,
        tracking: bool = True,
        ack_mode: str = "telescoped",
    ):
        if message_timeout_ms <= 0:
            raise OptionError("message_timeout_ms", message_timeout_ms, "a positive number of ms")
        self.name, self.spark, self.channel, self.tracking = name, spark, channel, tracking
        self.message_timeout_ms = message_timeout_ms
        self.mode = ack_mode_named(ack_mode)
        self.stages: list[Stage] = []
        self.output = None

    def without_session(self) -> Topology:
        """A copy that holds no session: what a ``foreachBatch`` function may carry (under
        Spark Connect it is pickled to the server; each batch brings its own session)."""
        detached = copy.copy(self)
        detached.spark = None
        return detached

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

    def fail_where(
        self,
        condition: Column | str,
        reason: Column | str | None = None,
        *,
        name: str | None = None,
    ) -> Topology:
        """Fail the tuples where ``condition`` holds: their roots are replayed (after the
        last retry, dead-lettered with ``reason``; default: the stage and condition)."""
        return self._add(FailWhereStage, condition, reason, name=name)

    def reject_where(
        self,
        condition: Column | str,
        reason: Column | str | None = None,
        *,
        name: str | None = None,
    ) -> Topology:
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

    # --- the source it reads -----------------------------------------------------------

    def source_options(self, options: Mapping[str, str] | None = None) -> dict[str, str]:
        """``options`` for ``format("ackstream")`` with this topology's name, channel and
        message timeout added. Giving one of those with another value is an
        :class:`OptionError` naming both."""
        ours = {
            "ackstream.topology": self.name,
            "ackstream.channel": self.channel.source_option(),
            "ackstream.messageTimeout": f"{self.message_timeout_ms}ms",
        }
        if isinstance(self.channel, LocalChannel):  # a folder one host sees, or all
            ours["ackstream.channelShared"] = str(self.channel.shared).lower()
        if isinstance(self.channel, KafkaChannel):  # its topics, whoever creates them
            if self.channel.replication_factor is not None:
                ours["ackstream.channelReplication"] = str(self.channel.replication_factor)
            if self.channel.retention_ms is not None:
                ours["ackstream.channelRetention"] = f"{self.channel.retention_ms}ms"
        merged = {str(k): str(v) for k, v in (options or {}).items()}
        lowered = {k.lower(): k for k in merged}
        for option, value in ours.items():
            given = lowered.get(option.lower())
            if given is not None and not same_term(option, merged[given], value):
                raise OptionError(
                    given,
                    merged[given],
                    f"{value!r}, the value of topology {self.name!r} (or leave "
                    "it out: the topology supplies it)",
                )
            merged.pop(given, None)
            merged[option] = value
        return merged

    def read_stream(self, options: Mapping[str, str] | None = None) -> DataFrame:
        """``spark.readStream.format("ackstream")`` with :meth:`source_options`, loaded.
        A bad option raises :class:`OptionError` itself, before Spark would wrap it."""
        merged = self.source_options(options)
        check_options(merged)
        self.check_reach()
        return self.spark.readStream.format("ackstream").options(**merged).load()

    def check_reach(self) -> None:
        """Refuse a channel the executors of this session's master may not reach: a
        local folder on a cluster, unless declared shared (see
        :func:`ackstream.channels.check_reach`)."""
        if self.spark is not None:
            check_reach(self.channel, master_of(self.spark))

    # --- running ----------------------------------------------------------------------

    def run_batch(
        self, batch: DataFrame, batch_id: int = 0, inits: pa.Table | None = None
    ) -> pa.Table:
        """Run every stage on ``batch`` (a static DataFrame), write the sink, and return
        the batch's ack records, pre-combined per root, without reporting them: what a
        started topology does in each micro-batch, for tests and notebooks.
        ``inits``: the batch's init records when known (else read from the rows)."""
        self._check_input(batch)
        return precombine(run_batch(self, batch, batch_id, inits))

    def _check_input(self, tuples: DataFrame) -> None:
        missing = [c for c in TRACKED_COLUMNS if c not in tuples.columns]
        if self.tracking and missing:
            raise StageError(
                "input",
                f"the input stream lacks the tracked column(s) {missing}; "
                "read it with topology.read_stream() or use tracking=False",
            )

    def start(
        self,
        tuples: DataFrame,
        checkpoint: str,
        *,
        trigger_ms: int = 500,
        ackers: int = 2,
        acker: bool = True,
        acker_trigger_ms: int | None = None,
    ) -> RunningTopology:
        """Start the topology query over the tracked stream ``tuples`` (best made by
        :meth:`read_stream`) and, unless ``acker=False`` (an acker runs elsewhere) or
        tracking is off, the acker query with ``ackers`` shards. Checkpoints go to
        ``<checkpoint>/topology`` and ``<checkpoint>/acker``."""
        self.check_reach()
        self._check_input(tuples)
        return start_topology(
            self,
            tuples,
            checkpoint,
            trigger_ms=trigger_ms,
            ackers=ackers,
            acker=acker,
            acker_trigger_ms=acker_trigger_ms,
        )
