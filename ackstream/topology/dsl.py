"""The topology DSL: bolt stages declared over a tracked stream, ending in sinks.

A topology is Storm's idea in Spark terms: bolt stages written as ordinary
DataFrame or SQL code, ending in sinks. Each micro-batch runs every stage inside
``foreachBatch`` (:mod:`ackstream.topology.batch`); ackstream anchors every output
tuple to its inputs, acks and fails them.

A stage reads the stream of the stage declared before it, so stages chain like
DataFrame code; ``after=`` names the stream(s) it subscribes to instead (a stage's
``name``, or ``"spout"`` for the input), as Storm's bolts name the components they
subscribe to: several subscribers of one stream fan out, a stage after several
streams joins them (see :mod:`ackstream.topology.graph`).

>>> topology = (Topology("words", spark, channel)                    # doctest: +SKIP
...     .explode(F.split("value", " "), "word", name="split")
...     .aggregate("word", F.count("*").alias("n"))
...     .sink(counts)
...     .filter(F.length("word") > 9, after="split")                 # a second subscriber
...     .sink(long_words))
>>> running = topology.start(topology.read_stream(), "/tmp/ckpt")   # doctest: +SKIP
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql import Column, DataFrame

from ackstream.acker.precombine import precombine
from ackstream.channels import check_reach
from ackstream.channels.base import Channel
from ackstream.config.source import SourceConfig, same_value
from ackstream.errors import OptionError, StageError
from ackstream.sinks.base import Sink
from ackstream.sources.offsets import PlannedRoots
from ackstream.sources.upstream import check_options, open_upstream
from ackstream.spark.session import has_kafka_connector, is_connect, master_of
from ackstream.topology.batch import run_batch
from ackstream.topology.bolts import (
    AggregateStage,
    ExplodeStage,
    FailWhereStage,
    FilterStage,
    MapStage,
    RejectWhereStage,
    SqlStage,
    Stage,
)
from ackstream.topology.declared import analyse, record_start
from ackstream.topology.described import describe, record_run, write_graph
from ackstream.topology.graph import SPOUT, SinkNode
from ackstream.topology.hold_tokens import HoldTokens
from ackstream.topology.modes import Mode, mode_of
from ackstream.topology.pandas_bolt import PandasBoltStage
from ackstream.topology.running import RunningTopology, start_topology
from ackstream.topology.waiting_join import WaitingJoinStage, check_within
from ackstream.topology.window import WindowStage
from ackstream.topology.window_closing import positive_ms, window_closing
from ackstream.vocabulary.lineage import TRACKED_COLUMNS

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import SparkSession

__all__ = ["Topology"]

#: the stream(s) a stage or sink reads: a name, several, or None (the last declared)
After = str | Iterable[str] | None


class Topology:
    """A named graph of bolt stages over a tracked stream, with its ack channel.

    Declaring methods return the topology, so stages chain like DataFrame code;
    each takes ``name=`` (unique; default ``<kind>#<n>``) and ``after=``, the stream or
    streams it reads (default: the stage declared before it). A root completes when
    every branch has acked its tuples; a fail in any branch fails it, and its replay
    runs through every branch again.
    ``tracking=False`` runs the same stages and writes no ack records at all (the
    input then needs no lineage columns): the baseline to measure tracking against.

    The topology owns the facts its source must share: its ``name`` (the id
    namespace, the channel topics, the consumer group), its ``channel`` and its
    ``message_timeout_ms`` (Storm's message timeout, which the acker enforces and
    the source's tick follows). :meth:`read_stream` gives them to the source; a
    source given others is refused at the first batch, naming both values.

    ``ack_mode`` says how a batch's acks are computed, ``"telescoped"`` (the
    default) or ``"per_stage"`` (Storm-faithful, every edge through the acker);
    both give the same outcome for every root (see :mod:`ackstream.topology.modes`).

    ``ackers`` is Storm's ``topology.acker.executors``: the shards of the acker query
    that :meth:`start` runs. ``ackers=0`` is ``tracking=False``, as Storm with no
    ackers acks every tuple at emit: :meth:`read_stream` then reads the source
    untracked (its offsets are committed once Spark ran their batch).

    ``continue_trees=True`` makes it the downstream half of trees an upstream topology
    left open with ``KafkaSink(..., continue_trees=True)`` (see
    :mod:`ackstream.sinks.continued`): ``channel`` is then the *upstream* topology's channel,
    where its acks go, to the upstream acker; its source reads untracked and with
    headers (its offsets are committed as Spark runs their batches; replays come from
    upstream), and :meth:`start` runs no acker of its own. Its sinks may continue the
    trees again (``KafkaSink(..., continue_trees=True)``): the next process acks them
    on the same upstream channel.

    ``stage_counts=True`` counts the tuples each stage and sink reads and emits (Storm
    UI's executed and emitted; ``ackstream status --checkpoint``). Off by default: each
    count is a row-by-row Spark operator outside its generated code, and together they
    cost about a fifth of the README pipeline's throughput
    (see :mod:`ackstream.topology.stage_counts`).

    ``batch_deadline_ms`` bounds a micro-batch (Storm's answer to a hung bolt is the
    message timeout): a batch still running then has its Spark jobs cancelled and its
    roots failed; the source replays them apart until the record at fault hangs alone,
    and dead-letters it after ``maxRetries`` (see :mod:`ackstream.topology.batch_failure`).
    None: no deadline.

    ``spark`` may be None for a topology that only declares stages and runs
    :meth:`run_batch` on frames it is given (tests, notebooks); :meth:`read_stream` and
    :meth:`start` need a session, and say so (:meth:`session`).
    """

    def __init__(
        self,
        name: str,
        spark: SparkSession | None,
        channel: Channel,
        *,
        message_timeout_ms: int = 30_000,
        tracking: bool = True,
        ack_mode: str = "telescoped",
        ackers: int = 2,
        continue_trees: bool = False,
        stage_counts: bool = False,
        batch_deadline_ms: int | None = 300_000,
    ) -> None:
        if message_timeout_ms <= 0:
            raise OptionError("message_timeout_ms", message_timeout_ms, "a positive number of ms")
        if isinstance(ackers, bool) or not isinstance(ackers, int) or ackers < 0:
            raise OptionError(
                "ackers", ackers, "a whole number of acker shards, or 0: tracking off"
            )
        self.name, self.spark, self.channel = name, spark, channel
        if batch_deadline_ms is not None and (
            isinstance(batch_deadline_ms, bool)
            or not isinstance(batch_deadline_ms, int)
            or batch_deadline_ms <= 0
        ):
            raise OptionError(
                "batch_deadline_ms",
                batch_deadline_ms,
                "a positive number of ms, or None: no deadline",
            )
        tracked = tracking and ackers > 0
        if continue_trees and not tracked:
            raise OptionError(
                "continue_trees",
                continue_trees,
                "False when tracking is off (tracking=False or ackers=0): continuing an "
                "upstream topology's trees tracks them",
            )
        self.ackers = ackers
        self.batch_deadline_ms = batch_deadline_ms
        self.message_timeout_ms = message_timeout_ms
        #: how it tracks its tuples (see :mod:`ackstream.topology.modes`)
        self.mode: Mode = mode_of(tracked, ack_mode, continue_trees)
        self.stage_counts = stage_counts
        self.stages: list[Stage] = []
        #: where window stages keep their held tuples (set by :meth:`start` beside the
        #: checkpoint; None: in memory, as :meth:`run_batch` in tests)
        self.held_folder: str | None = None
        #: the batches whose roots wait for windows holding partial aggregates
        self.hold_tokens = HoldTokens()
        self.sinks: list[SinkNode] = []
        self._ends_in_sink = False
        #: the options of the stream :meth:`read_stream` made, parsed: a batch whose new
        #: records Spark's Kafka source reads takes its brokers and settings from them
        self.source_config: SourceConfig | None = None

    @property
    def tracking(self) -> bool:
        """Whether its tuples are tracked: ``tracking=True`` and ackers."""
        return self.mode.makes_ack_records

    def session(self) -> SparkSession:
        """The session it reads its stream and starts its queries with; an
        :class:`OptionError` saying what to give when it holds none."""
        if self.spark is None:
            raise OptionError(
                "spark",
                None,
                f"a SparkSession (e.g. ackstream.local_session()) for topology {self.name!r} "
                "to read its stream or start: give it to Topology(name, spark, channel) "
                "(a without_session() copy holds none)",
            )
        return self.spark

    def without_session(self) -> Topology:
        """A copy that holds no session: what a ``foreachBatch`` function may carry (under
        Spark Connect it is pickled to the server; each batch brings its own session)."""
        detached = copy.copy(self)
        detached.spark = None
        return detached

    # --- declaring stages -----------------------------------------------------------

    def _add(
        self, cls: Callable[..., Stage], *args: object, name: str | None = None, after: After = None
    ) -> Topology:
        stage = cls(len(self.stages) + 1, *args, name=name)
        stage.after = self._subscribe(stage.name, after, stage.kind)
        self.stages.append(stage)
        self._ends_in_sink = False
        return self

    def _subscribe(self, name: str, after: After, kind: str) -> tuple[str, ...]:
        """The streams a new stage or sink called ``name`` reads: ``after`` checked, or
        by default the stream of the last stage declared (the spout's if none)."""
        known = [SPOUT, *(s.name for s in self.stages)]
        if name in known or name in (s.name for s in self.sinks):
            raise StageError(name, "another stage, sink or the spout has this name: give name=")
        if after is None:
            if kind != "sink" and self._ends_in_sink:
                raise StageError(
                    name,
                    "the topology already ends in a sink: name the stream this stage "
                    f"reads with after= (one of {known})",
                )
            return (known[-1],)
        streams = (after,) if isinstance(after, str) else tuple(after)
        unknown = [s for s in streams if s not in known]
        if unknown or not streams or len(set(streams)) < len(streams):
            raise StageError(
                name,
                f"after={after!r}: name each stream it reads once, from the spout "
                f"and the stages declared before it: {known}",
            )
        return streams

    def map(
        self, fn: Callable[[DataFrame], DataFrame], *, name: str | None = None, after: After = None
    ) -> Topology:
        """Row-wise DataFrame code, ``fn(df) -> df`` (``withColumn``, ``select('*', ...)``):
        at most one output row per input row, lineage columns kept. For one-to-many
        use :meth:`explode` or :meth:`pandas_bolt`."""
        return self._add(MapStage, fn, name=name, after=after)

    def filter(
        self, condition: Column | str, *, name: str | None = None, after: After = None
    ) -> Topology:
        """Keep the rows where ``condition`` holds; every other row is acked."""
        return self._add(FilterStage, condition, name=name, after=after)

    where = filter

    def fail_where(
        self,
        condition: Column | str,
        reason: Column | str | None = None,
        *,
        name: str | None = None,
        after: After = None,
    ) -> Topology:
        """Fail the tuples where ``condition`` holds: their roots are replayed (after the
        last retry, dead-lettered with ``reason``; default: the stage and condition)."""
        return self._add(FailWhereStage, condition, reason, name=name, after=after)

    def reject_where(
        self,
        condition: Column | str,
        reason: Column | str | None = None,
        *,
        name: str | None = None,
        after: After = None,
    ) -> Topology:
        """Dead-letter the records whose tuples match ``condition`` at once, with
        ``reason``, without replays: for input that can never succeed (undecodable,
        null, out of range). ``reason`` may be a column, to say what was wrong."""
        return self._add(RejectWhereStage, condition, reason, name=name, after=after)

    def explode(
        self, column: Column | str, alias: str, *, name: str | None = None, after: After = None
    ) -> Topology:
        """One child row per element of the array ``column``, in a new column ``alias``."""
        return self._add(ExplodeStage, column, alias, name=name, after=after)

    def sql(
        self, text: str, *, view: str = "tuples", name: str | None = None, after: After = None
    ) -> Topology:
        """Row-wise SQL over the stage input, visible as the view ``view``; select the
        lineage columns along (``SELECT *, upper(word) AS w FROM tuples``)."""
        return self._add(SqlStage, text, view, name=name, after=after)

    def aggregate(
        self,
        keys: str | Column | Iterable[str | Column],
        *aggs: Column,
        name: str | None = None,
        after: After = None,
    ) -> Topology:
        """``groupBy(keys).agg(*aggs)`` within each batch; each output row is anchored
        to all of its input tuples (multi-anchoring, across roots)."""
        keys = [keys] if isinstance(keys, str | Column) else list(keys)
        return self._add(AggregateStage, keys, aggs, name=name, after=after)

    def window(
        self,
        keys: str | Column | Iterable[str | Column],
        *aggs: Column,
        count: int | None = None,
        duration: int | str | None = None,
        slide: int | str | None = None,
        time: str | Column | None = None,
        delay: int | str = 0,
        name: str | None = None,
        after: After = None,
    ) -> Topology:
        """A window per key: hold the tuples of each key, across micro-batches, until
        their window closes; then emit ``groupBy(keys).agg(*aggs)`` over the window,
        anchored to all of its tuples (across roots and batches).

        ``count=k``: Storm's tumbling count window, every k tuples of a key; with
        ``slide=m`` (1 <= m < k) its sliding one: every m tuples of a key, a window
        of its last k (a key's first windows hold fewer).
        ``duration`` (ms, or ``"10s"``, ``"2 min"``) and ``slide`` (default: the
        duration, a tumbling window): Storm's duration windows and Spark's
        ``window()``; output rows carry ``window``, ``struct<start, end>``. By
        processing time (the batch's), unless ``time`` names an event-time column
        (a timestamp or epoch ms): its windows close when the watermark, the
        largest time seen minus ``delay``, passes their end, and a tuple whose
        windows have all closed is rejected as late (dead-lettered with a reason).

        Held tuples stay un-acked (their offsets uncommitted) until their last window
        closes; a root held longer than the message timeout times out and is replayed.
        The held tuples are kept beside the checkpoint and survive a restart (see
        :mod:`ackstream.topology.window`)."""
        keys = [keys] if isinstance(keys, str | Column) else list(keys)
        number = len(self.stages) + 1
        stage_name = name or f"{WindowStage.kind}#{number}"
        closing = window_closing(stage_name, count, duration, slide, time, delay)
        closing.check(stage_name, self.message_timeout_ms, self.mode)
        return self._add_holding(WindowStage, keys, aggs, closing, name=name, after=after)

    def join(
        self,
        left: str,
        right: str,
        on: str | Iterable[str],
        *,
        how: str = "inner",
        within: int | str | None = None,
        suffix: str = "_right",
        name: str | None = None,
    ) -> Topology:
        """An equi-join of the streams ``left`` and ``right`` (the spout's or earlier
        stages' names) on the key column(s) ``on``, that waits across micro-batches: a
        tuple with no match yet is held, un-acked, until a tuple of the other side with
        its key arrives; the batch where it first gets one emits a row per matching
        pair (held and new tuples of both sides), anchored to both, and acks it.

        ``within`` (ms, or ``"10s"``) bounds the wait by processing time (Storm's
        ``JoinBolt`` over a window): a tuple still without a match at the first batch
        that long after it came is let go and acked. ``how="left"`` (Storm's
        ``leftJoin``; needs ``within``) emits such a left tuple, and at once a left
        tuple with a null key, with nulls for the right side's columns. A tuple may
        wait up to twice ``within``, which must fit the message timeout; without a
        bound a tuple that finds no match within the message timeout times out and
        its record is replayed.

        Output: the keys, the left's columns, the right's (``suffix`` on the names the
        left has too). Held tuples are kept beside the checkpoint and survive a
        restart (see :mod:`ackstream.topology.waiting_join`)."""
        keys = [on] if isinstance(on, str) else list(on)
        stage_name = name or f"{WaitingJoinStage.kind}#{len(self.stages) + 1}"
        within_ms = None if within is None else positive_ms(stage_name, "within", within)
        check_within(stage_name, within_ms, self.message_timeout_ms, self.mode)
        return self._add_holding(
            WaitingJoinStage,
            left,
            right,
            keys,
            suffix,
            how,
            within_ms,
            name=name,
            after=(left, right),
        )

    def _add_holding(
        self, cls: Callable[..., Stage], *args: object, name: str | None = None, after: After = None
    ) -> Topology:
        """Add a stage that holds tuples across batches, and ask every stage upstream of
        it to give its rows their roots (``Stage.hold_roots``): a held row keeps them,
        and an aggregate collects them in its own pass over its input."""
        self._add(cls, *args, name=name, after=after)
        by_name = {s.name: s for s in self.stages}
        todo, seen = list(self.stages[-1].after), set()
        while todo:
            stream = todo.pop()
            if stream in seen or stream not in by_name:  # the spout
                continue
            seen.add(stream)
            by_name[stream].hold_roots()
            todo.extend(by_name[stream].after)
        return self

    def pandas_bolt(
        self,
        fn: Callable[..., pd.DataFrame],
        schema: str,
        *,
        collector: bool = False,
        name: str | None = None,
        after: After = None,
    ) -> Topology:
        """A pandas bolt, ``fn(frame) -> frame`` indexed by parent row position (Storm's
        ``emit(anchor, values)``; -1: unanchored); ``schema`` is its output DDL.
        ``collector=True`` calls ``fn(frame, collector)``: ``collector.fail(rows,
        reason)`` (Storm's ``fail``: replayed) and ``collector.reject(rows, reason)``
        (dead-lettered at once) are the way to fail rows, a boolean mask or positions
        of ``frame``; ``collector.reset_timeout(rows)`` is Storm's ``resetTimeout``
        (see :class:`~ackstream.topology.pandas_bolt.Collector`). An exception, or output
        that does not fit ``schema`` (columns, index, a value's type), fails only the
        roots of the rows it came from, with a reason naming the stage and what was
        wrong, but finding them calls ``fn`` again on parts of the chunk."""
        return self._add(PandasBoltStage, fn, schema, collector, name=name, after=after)

    def sink(self, sink: Sink, *, name: str | None = None, after: After = None) -> Topology:
        """Write a stream to ``sink`` (``MemorySink``, ``ConsoleSink``, ``ParquetSink``,
        ``KafkaSink``, or a :class:`~ackstream.sinks.base.Sink` of one's own: a subclass
        with ``write(outputs, batch_id)``): its tuples are acked once it returns, except
        the rows it hands back as not written, whose roots fail. The sink is asked once,
        here, whether it continues its rows' trees (``Sink.continue_trees``).
        ``after``: the stream(s) it writes, by default the last stage's (so a second
        ``.sink(...)`` writes the same stream). A stream no stage or sink reads is
        acked at the end of each batch."""
        name = name or f"sink#{len(self.sinks) + 1}"
        if not isinstance(sink, Sink):
            raise StageError(
                name,
                f"a {type(sink).__name__} is not a Sink: subclass ackstream.sinks.base.Sink "
                "(which continues no trees and has nothing to close) and write its "
                "write(outputs, batch_id)",
            )
        after = self._subscribe(name, after, "sink")
        self.sinks.append(SinkNode(name, sink, after, continues_trees=sink.continue_trees))
        self._ends_in_sink = True  # what follows says which stream it reads
        return self

    # --- the source it reads -----------------------------------------------------------

    def source_options(self, options: Mapping[str, object] | None = None) -> dict[str, str]:
        """``options`` for ``format("ackstream")`` with this topology's name, channel and
        message timeout added. Giving one of those with another value is an
        :class:`OptionError` naming both."""
        ours = {
            "ackstream.topology": self.name,
            **self.channel.source_options(),
            "ackstream.messageTimeout": f"{self.message_timeout_ms}ms",
            "ackstream.tracking": str(self.mode.own_roots).lower(),
        }
        idle = [s.idle_batch_ms for s in self.stages if s.idle_batch_ms is not None]
        if idle:  # a processing-time window closes on time: batches while roots wait
            ours["ackstream.idleBatchInterval"] = f"{min(idle)}ms"
        if self.mode.continues_trees:  # the upstream lineage travels in the headers
            ours["includeHeaders"] = "true"
        merged = {str(k): str(v) for k, v in (options or {}).items()}
        lowered = {k.lower(): k for k in merged}
        for option, value in ours.items():
            given = lowered.get(option.lower())
            if given is not None and not same_value(option, merged[given], value):
                raise OptionError(
                    given,
                    merged[given],
                    f"{value!r}, the value of topology {self.name!r} (or leave "
                    "it out: the topology supplies it)",
                )
            if given is not None:
                merged.pop(given)
            merged[option] = value
        return merged

    def read_stream(self, options: Mapping[str, object] | None = None) -> DataFrame:
        """``spark.readStream.format("ackstream")`` with :meth:`source_options`, loaded.
        A bad option, or brokers and topics that are not there, raise ackstream's own
        error before Spark would wrap it (and before Spark starts a Python worker to
        load the source); under Spark Connect the server checks the brokers, which this
        client may not reach. A :class:`KafkaChannel` takes the source's ``kafka.*``
        client settings it lacks (see :meth:`KafkaChannel.agreeing_with`): give
        security settings once."""
        merged = self.source_options(options)
        config = check_options(merged)
        spark = self.session()
        if "ackstream.recordreader" not in {k.lower() for k in merged} and self._spark_reads(
            spark, config
        ):
            merged["ackstream.recordReader"] = "spark"
            config = check_options(merged)
        elif config.record_reader == "spark" and not has_kafka_connector(spark):
            raise OptionError(
                "ackstream.recordReader",
                "spark",
                '"python", or a session with Spark\'s Kafka connector (spark.jars.packages '
                "org.apache.spark:spark-sql-kafka-0-10_2.13:<Spark's version>)",
            )
        self.source_config = config
        self.check_reach()
        if not is_connect(spark):
            open_upstream(config).check()
        # the source's brokers and settings; a downstream topology's channel is the
        # upstream's, which its untracked source does not read
        if not self.mode.continues_trees:
            self.channel = self.channel.agreeing_with(merged)
        return spark.readStream.format("ackstream").options(**merged).load()

    def _spark_reads(self, spark: SparkSession, config: SourceConfig) -> bool:
        """Whether Spark's Kafka source should read the new records (when the user did
        not choose with ``ackstream.recordReader``): a Kafka upstream, a session that
        has the connector, and a batch that takes its roots from the source's offset
        (with a stage-by-stage ack mode a root is known by its row; an offset with no
        record would have none, and wait for the source's timeout)."""
        plans = not config.tracking or self.mode.plans_inits
        return config.upstream == "kafka" and plans and has_kafka_connector(spark)

    def check_reach(self) -> None:
        """Refuse a channel the executors of this session's master may not reach: a
        local folder on a cluster, unless declared shared (see
        :func:`ackstream.channels.check_reach`)."""
        if self.spark is not None:
            check_reach(self.channel, master_of(self.spark))

    # --- running ----------------------------------------------------------------------

    def run_batch(
        self,
        batch: DataFrame,
        batch_id: int = 0,
        inits: pa.Table | None = None,
        now_ms: int | None = None,
    ) -> pa.Table:
        """Run every stage on ``batch`` (a static DataFrame), write the sink, and return
        the batch's ack records, pre-combined per root, without reporting them: what a
        started topology does in each micro-batch, for tests and notebooks.
        ``inits``: the batch's init records when known (else read from the rows);
        ``now_ms``: the batch's time (default: the clock's)."""
        self._check_input(batch)
        planned = None if inits is None else PlannedRoots.of_inits(inits)
        return precombine(run_batch(self, batch, batch_id, planned, now=now_ms).table())

    def _check_input(self, tuples: DataFrame) -> None:
        missing = [c for c in TRACKED_COLUMNS if c not in tuples.columns]
        if self.mode.carries_lineage and missing:
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
        acker: bool = True,
        acker_trigger_ms: int | None = None,
    ) -> RunningTopology:
        """Start the topology query over the tracked stream ``tuples`` (best made by
        :meth:`read_stream`) and, unless ``acker=False`` (an acker runs elsewhere) or
        its roots are not its own (tracking off, or ``continue_trees``: the upstream
        topology's acker acks), the acker query with the topology's ``ackers`` shards.
        Checkpoints go to ``<checkpoint>/topology`` and ``<checkpoint>/acker``.

        Before any query starts, every SQL and DataFrame stage is analysed against an
        empty frame of the stream's schema (:func:`~ackstream.topology.declared.analyse`):
        a misspelled column or function raises :class:`StageError` naming the stage."""
        self.check_reach()
        self._check_input(tuples)
        analyse(self, tuples)
        folder = os.path.join(checkpoint, "topology")
        write_graph(folder, describe(self.stages, self.sinks))
        running = start_topology(
            self,
            tuples,
            checkpoint,
            trigger_ms=trigger_ms,
            acker=acker,
            acker_trigger_ms=acker_trigger_ms,
        )
        record_run(folder, running)
        record_start(self, checkpoint)
        return running
