"""A started topology: its ``foreachBatch`` function, and its two streaming queries.

The topology query runs :class:`BatchFunction` on each micro-batch; the acker
query (:mod:`ackstream.acker.query`) waits for the trees a batch leaves open.
The batch function takes its roots from the offset the ``ackstream`` source
logged for the batch, and holds the source to the topology's own name, channel
and message timeout: a source that waits for other completions than the
topology reports would never commit.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
from pyspark.sql import DataFrame

from ackstream.acker.query import start_acker
from ackstream.channels.base import Channel
from ackstream.config.source import SourceConfig, same_value
from ackstream.errors import OptionError
from ackstream.sources.offsets import PlannedRoots
from ackstream.sources.spark_reader import read_new_ranges, read_replays
from ackstream.spark.session import check_picklable, is_connect
from ackstream.storage.offset_log import clear_unfinished_first_entry, logged_offsets
from ackstream.topology.awaiting import await_topology
from ackstream.topology.batch import DeclaredTopology, run_batch
from ackstream.topology.batch_failure import (
    BatchDeadline,
    batch_failed_completions,
    cancel_batches,
    failure_reason,
    isolates,
    job_tag,
)
from ackstream.topology.held_store import FOLDER
from ackstream.topology.isolation_round import computed_first, is_isolation_round
from ackstream.topology.stage_counts import FILE as STAGE_COUNTS_FILE
from ackstream.topology.stage_counts import StageCounts
from ackstream.vocabulary.batch_offset import BatchOffset
from ackstream.vocabulary.clock import now_ms
from ackstream.vocabulary.lineage import REASON_LIMIT

if TYPE_CHECKING:
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery


__all__ = [
    "BatchFunction",
    "RunningTopology",
    "check_source_terms",
    "start_topology",
    "stop_queries",
]

log = logging.getLogger(__name__)


class StartedTopology(DeclaredTopology, Protocol):
    """What starting and running the queries read of a topology (``Topology`` is one),
    beyond what its batches read."""

    ackers: int
    batch_deadline_ms: int | None
    source_config: SourceConfig | None
    stage_counts: bool

    @property
    def channel(self) -> Channel: ...

    def session(self) -> SparkSession:
        """The session that starts the queries; raises when the topology holds none."""
        ...

    def without_session(self) -> StartedTopology: ...


def check_source_terms(topology: StartedTopology, offset: BatchOffset) -> None:
    """Raise an :class:`OptionError` naming both values if the ``ackstream`` source that
    wrote ``offset`` was given another topology name, channel or message timeout than
    ``topology`` (an offset written with tracking off says none)."""
    tracked = offset.tracked
    if tracked is None:
        return
    terms = (
        ("ackstream.topology", tracked.topology, topology.name),
        (
            "ackstream.channel",
            tracked.channel,
            topology.channel.source_options()["ackstream.channel"],
        ),
        ("ackstream.messageTimeout", tracked.timeout_ms, topology.message_timeout_ms),
    )
    for option, given, wanted in terms:
        if not same_value(option, given, wanted):
            raise OptionError(
                option,
                given,
                f"{wanted!r}, the value of topology "
                f"{topology.name!r}: read the stream with "
                "topology.read_stream(...) so that both agree",
            )


class BatchFunction:
    """The topology query's ``foreachBatch`` function: run the batch, then report what
    became of its roots (see :mod:`ackstream.topology.batch`).

    Under Spark Connect it is pickled and runs in a Python process beside the server,
    so it holds the topology without its session (each batch brings its own,
    ``batch.sparkSession``) and nothing else of the client's."""

    def __init__(self, topology: StartedTopology, offset_log: str):
        self.topology, self.offset_log = topology.without_session(), offset_log
        self.topology.held_folder = os.path.join(offset_log, FOLDER)  # window stages' state

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        topology = self.topology
        mode = topology.mode
        plans = mode.own_roots  # its source tracks roots: its offsets name them
        offsets = self._offsets(batch, batch_id, plans)
        batch = self._with_new_records(batch, offsets or [])
        planned = self._planned(offsets) if plans else None
        counts = StageCounts() if topology.stage_counts else None
        deadline = BatchDeadline(
            batch.sparkSession, job_tag(topology.name), topology.batch_deadline_ms, self.offset_log
        )
        # a round of isolation computes each sink's input before writing it: if the
        # round fails, it has written nothing that its records' later rounds write again
        runs = computed_first(topology) if is_isolation_round(offsets or []) else topology
        try:
            with deadline:
                records = run_batch(
                    runs,
                    batch,
                    batch_id,
                    planned if mode.plans_inits else None,
                    counts,
                    reported=True,
                )
        except Exception as error:
            if planned is None or not isolates(error, deadline):
                raise
            reason = failure_reason(error, deadline, self._stages())
            self._fail_batch(planned.inits, batch_id, reason)
            return
        mode.report(records, topology.channel, batch_id)
        if counts is not None:
            counts.add_to(os.path.join(self.offset_log, STAGE_COUNTS_FILE))

    def _fail_batch(self, inits: pa.Table, batch_id: int, reason: str) -> None:
        """Batch ``batch_id`` failed as a whole: its roots complete as ``batch_failed``,
        and the source isolates the record at fault (see
        :mod:`ackstream.topology.batch_failure`)."""
        log.warning(
            "topology %s: batch %d failed as a whole (%s); its %d root(s) are replayed "
            "apart until the record at fault fails alone",
            self.topology.name,
            batch_id,
            reason,
            inits.num_rows,
        )
        completions = batch_failed_completions(inits, reason[:REASON_LIMIT], now_ms())
        self.topology.channel.write_completions(completions, batch_id)

    def _stages(self) -> list[str]:
        return [stage.name for stage in self.topology.stages] + [
            node.name for node in self.topology.sinks
        ]

    def _offsets(self, batch: DataFrame, batch_id: int, plans: bool) -> list[BatchOffset] | None:
        """The ``ackstream`` offsets Spark logged for batch ``batch_id`` (read when the
        batch plans its roots from them, or reads its new records itself); None when
        there is no such log and the roots can be read from the rows instead."""
        config = self.topology.source_config
        spark_reads = config is not None and config.record_reader == "spark"
        if not (plans or spark_reads):
            return None
        try:
            return logged_offsets(batch.sparkSession, self.offset_log, batch_id)
        except Exception:  # a Spark whose offset log looks otherwise: slower, still right
            if spark_reads:  # ... unless the offset is the only record of what to read
                raise
            log.warning(
                "topology %s: no offset log for batch %d under %s; reading the "
                "batch's roots from its rows",
                self.topology.name,
                batch_id,
                self.offset_log,
                exc_info=True,
            )
            return None

    def _with_new_records(self, batch: DataFrame, offsets: list[BatchOffset]) -> DataFrame:
        """``batch`` with the records Spark's Kafka source reads for it (see
        :mod:`ackstream.sources.spark_reader`): the new ones, and replays of two records
        or more; the source's own rows are then a record replayed alone, and a batch
        without one is the records Spark read (a union costs another analysis of the
        plan)."""
        read = [offset for offset in offsets if offset.spark_reads_new]
        if not read:
            return batch
        config = self.topology.source_config
        if config is None:
            raise OptionError(
                "ackstream.recordReader",
                "spark",
                '"python" for a stream not made by topology.read_stream(...) (the '
                "topology reads the new records with the options given there)",
            )
        spark = batch.sparkSession
        frames = [
            records
            for offset in read
            for records in (
                read_new_ranges(spark, config, offset),
                read_replays(spark, config, offset),
            )
            if records is not None
        ]
        python_replays = any(
            offset.replays and not offset.spark_reads_replays for offset in offsets
        )
        if len(read) < len(offsets) or python_replays:
            frames.insert(0, batch)
        if not frames:
            return batch
        for frame in frames[1:]:
            frames[0] = frames[0].unionByName(frame, allowMissingColumns=True)
        return frames[0]

    def _planned(self, offsets: list[BatchOffset] | None) -> PlannedRoots | None:
        """The roots of the batch, from the offsets Spark logged for it; None when their
        inits must be read from the rows (no offset log). Checks the sources' terms first."""
        if offsets is None:
            return None
        for offset in offsets:
            check_source_terms(self.topology, offset)
        if not offsets:
            return None
        return PlannedRoots.of_offsets(offsets, now_ms())


def start_topology(
    topology: StartedTopology,
    tuples: DataFrame,
    checkpoint: str,
    *,
    trigger_ms: int,
    acker: bool,
    acker_trigger_ms: int | None,
) -> RunningTopology:
    """Start the topology query over ``tuples`` and, unless ``acker=False`` or the
    topology has no roots of its own (untracked, or an upstream topology's: their acker
    acks), the acker query; checkpoints under ``<checkpoint>/topology`` and ``/acker``."""
    spark = topology.session()
    offset_log = os.path.join(checkpoint, "topology")
    function = BatchFunction(topology, offset_log)
    connect = is_connect(spark)
    if connect:
        check_picklable(function, f"topology {topology.name!r}")
    acker_query = None
    if acker and topology.mode.own_roots:
        acker_query = start_acker(
            spark,
            topology.channel,
            checkpoint=os.path.join(checkpoint, "acker"),
            ackers=topology.ackers,
            message_timeout_ms=topology.message_timeout_ms,
            trigger_ms=acker_trigger_ms or trigger_ms,
            query_name=f"{topology.name}.acker",
        )
    try:
        clear_unfinished_first_entry(spark, offset_log)
        query = (
            tuples.writeStream.foreachBatch(function)
            .option("checkpointLocation", offset_log)
            .trigger(processingTime=f"{trigger_ms} milliseconds")
            .queryName(topology.name)
            .start()
        )
    except Exception:
        if acker_query is not None:
            acker_query.stop()
        raise
    # under Spark Connect the sinks that write are copies beside the server: none to close here
    sinks = () if connect else tuple(node.sink for node in topology.sinks)
    channel = None if connect else topology.channel
    return RunningTopology(query, acker_query, spark, job_tag(topology.name), sinks, channel)


@dataclass
class RunningTopology:
    """The two streaming queries of a started topology."""

    query: Any  # StreamingQuery running the stages
    acker: Any | None  # StreamingQuery running the acker, None when not started here
    spark: Any = None  # the session that started them
    tag: str | None = None  # the Spark job tag of the topology's batches
    sinks: tuple[Any, ...] = ()  # closed once the queries have stopped
    #: the channel the batches reported to, closed after the sinks: its producer's
    #: thread would otherwise outlive the topology (and spin once its brokers are gone)
    channel: Any = None

    @property
    def queries(self) -> list[StreamingQuery]:
        return [q for q in (self.query, self.acker) if q is not None]

    def is_active(self) -> bool:
        return all(q.isActive for q in self.queries)

    def exception(self) -> StreamingQueryException | None:
        """The first query's error, if one stopped with an error."""
        return next((e for e in (q.exception() for q in self.queries) if e), None)

    def process_all_available(self) -> None:
        """Block until the topology query has processed every input available now."""
        self.query.processAllAvailable()

    def await_termination(self, timeout_s: float | None = None) -> bool:
        """Block until the topology query stops (True) or ``timeout_s`` passes (False);
        Ctrl-C stops the topology and exits with one line (see :func:`await_topology`)."""
        return await_topology(self, timeout_s)

    def stop(self) -> None:
        """Stop the topology query once its batch in progress is committed, then the
        acker (see :func:`stop_queries`); a batch still running after the wait has its
        Spark jobs cancelled, so that a stage that hangs cannot hold the stop. Then each
        sink's ``close()`` and the channel's."""

        def cancel() -> None:
            if self.spark is not None and self.tag is not None:
                cancel_batches(self.spark, self.tag)

        stop_queries(self.queries, cancel=cancel)
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as error:  # the queries are stopped: a sink's error is only told
                log.warning(
                    "closing sink %s: %s: %s", type(sink).__name__, type(error).__name__, error
                )
        if self.channel is not None:
            self.channel.close()


#: Spark's status messages while a query runs a batch: planning it, its sink (a
#: topology's :class:`BatchFunction`), committing it and reporting its progress.
_RUNNING_A_BATCH = ("Processing new data", "No new data but cleaning up state")


def _running_a_batch(query: StreamingQuery) -> bool:
    """Whether ``query`` is between the start and the commit of a batch."""
    status = query.status
    return bool(status.get("isTriggerActive")) and status.get("message") in _RUNNING_A_BATCH


#: How long a stop keeps cancelling the jobs of a batch that goes on running.
CANCEL_S = 4.0


def _cancel_while_busy(query: StreamingQuery, cancel: Callable[[], None]) -> None:
    deadline = time.monotonic() + CANCEL_S
    while True:
        cancel()
        if time.monotonic() > deadline or not (query.isActive and _running_a_batch(query)):
            return
        time.sleep(0.5)


def stop_queries(
    queries: Iterable[StreamingQuery],
    batch_wait_s: float = 10.0,
    cancel: Callable[[], None] | None = None,
) -> None:
    """Stop streaming queries, topology queries before ackers (so an acker sees the last
    ack records), each once the batch it is running has been committed.

    Spark stops a query by interrupting its thread. Landing in the ``foreachBatch``
    function, the interruption fails the batch, and Spark then matches the error's text
    (with the Java stack trace py4j carries back) against a regular expression that
    overflows the thread's stack: a 1,024-line ``StackOverflowError``. Once the batch is
    committed, it lands in the planning of the next batch (its offsets, its offset log),
    which ends quietly and is taken up again on restart; that batch's function is called
    only after its planning. So a busy query, whose batches come back to back and leave
    no gap between triggers, stops within one batch. A query still running a batch after
    ``batch_wait_s`` (a stage that hangs) has ``cancel()`` called first, to end the
    batch's Spark jobs, again each half second while the batch goes on (a batch may
    start another job, e.g. to report its failure) for up to ``CANCEL_S``."""
    for q in sorted(queries, key=lambda q: (q.name or "").endswith(".acker")):
        deadline = time.monotonic() + batch_wait_s
        try:
            while (busy := q.isActive and _running_a_batch(q)) and time.monotonic() < deadline:
                time.sleep(0.02)
            if busy and cancel is not None:  # the wait ran out: a batch hangs
                _cancel_while_busy(q, cancel)
            q.stop()
        except Exception:  # stop the others all the same
            log.exception("stopping query %s failed", q.name)
