"""Kafka output sink: ack only what the broker confirmed.

Where the session has Spark's Kafka connector, ``write`` is Spark's own Kafka writer:
one job, the rows never leave the JVM, and a job that finishes means the broker
confirmed every row. Otherwise, and whenever that job fails, the produce runs inside
Spark's tasks (``mapInArrow``): each task builds its own kafka-python producer from
the sink's plain settings, sends its rows, flushes, and yields only the rows the
broker did not confirm, with their lineage columns and a ``_reason``. The driver
collects just those, so a clean batch moves no rows to the driver, and ackstream
fails their roots (they are replayed) and acks the rest. A row is never acked before
the broker confirmed it.

With ``continue_trees=True`` each message also carries its row's lineage as headers
(:mod:`ackstream.sinks.continued`: its roots and a fresh random edge id), and its trees stay
open until the message's consumer acks it: every confirmed row then comes back to
the driver as its roots and edge (16 bytes a root), which the batch reports as the
ack records ``(root, edge)`` (:meth:`KafkaSink.write_continued`).

A broker that times out or cannot be reached is no row's fault: a write it fails
raises :class:`~ackstream.errors.Unreachable` (its rows are not failed), and the batch
waits, asking :meth:`KafkaSink.answers` until the brokers answer, then writes again
(:mod:`ackstream.topology.outage`). So ``flush_timeout_s`` bounds one attempt, not
the outage.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from kafka.errors import KafkaTimeoutError
from kafka.serializer import Serializer, SerializeWrapper

from ackstream.errors import EnvironmentProblem, OptionError, Unreachable, cause_of
from ackstream.kafka.settings import client_settings, jvm_client_settings
from ackstream.kafka.topics import deleted_topics, shared_listing
from ackstream.sinks.base import ContinuingSink
from ackstream.sinks.continued import lineage_headers, mint_edges
from ackstream.spark.session import has_kafka_connector, kafka_through_v2
from ackstream.vocabulary.clock import now_ms
from ackstream.vocabulary.lineage import LINEAGE_COLUMNS, REASON, REASON_LIMIT, ROOTS
from ackstream.vocabulary.records import ACK, ack_table

if TYPE_CHECKING:
    from kafka import KafkaProducer
    from pyspark.sql import DataFrame

__all__ = ["WRITERS", "KafkaSink", "ProduceTask", "carried_columns"]

log = logging.getLogger(__name__)

#: How long a producer waits for a topic's metadata (or room to buffer a row): a topic
#: that does not exist is asked for once a write has waited this long.
BLOCK_MS = 10_000
#: How long a probe of an unreachable sink waits for the brokers' answer.
PROBE_MS = 5_000
#: Values of ``KafkaSink(writer=...)``.
WRITERS = ("auto", "spark", "python")
#: the edge id of a row's message, on the rows a continuing write hands back (with ROOTS)
SENT_EDGE = "_sent_edge"


class KafkaSink(ContinuingSink):
    """Writes the ``key`` (optional) and ``value`` columns of each output row to
    ``topic``, as Spark's Kafka sink does; strings are UTF-8 encoded, binary kept.

    ``kafka_options``: the client settings in the source's ``kafka.*`` form (the source's
    options may be given as they are), of which the producers take the connection and
    security ones, so the sink reaches a secured cluster as the source does.
    ``producer_config`` goes to ``kafka.KafkaProducer`` as it is (e.g. ``acks``,
    ``max_request_size``) and wins; ``flush_timeout_s`` bounds each task's wait for
    confirmations (a write the brokers do not answer within it raises
    :class:`~ackstream.errors.Unreachable`, and is tried again once they answer). The
    sink holds only these settings, so it pickles (Spark Connect pickles the
    ``foreachBatch`` function with it).

    ``writer``: ``"spark"``, Spark's own Kafka writer (one job, the rows stay in the
    JVM; needs Spark's Kafka connector), ``"python"``, a kafka-python producer per
    task, or ``"auto"``: Spark's when the session has the connector and no
    ``producer_config`` is given. A continuing sink always writes from Python (each
    message carries its own lineage headers).

    ``continue_trees=True``: the messages continue their rows' tuple trees in whatever
    process consumes the topic (see :mod:`ackstream.sinks.continued`); a topology's batch
    then calls :meth:`write_continued`, and the upstream records are acked only when
    the consumer acks the messages (``ackstream.sinks.continued.TreeClient``).
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        key: str | None = "key",
        value: str = "value",
        kafka_options: dict[str, Any] | None = None,
        producer_config: dict[str, Any] | None = None,
        flush_timeout_s: float = 30.0,
        continue_trees: bool = False,
        writer: str = "auto",
    ):
        if writer not in WRITERS:
            raise OptionError("writer", writer, " or ".join(repr(w) for w in WRITERS))
        self.bootstrap, self.topic = bootstrap, topic
        self.key, self.value = key, value
        self.kafka_options = {
            str(k): str(v) for k, v in (kafka_options or {}).items() if str(k).startswith("kafka.")
        }
        # a bad setting fails here, on the driver, not in every task
        self.producer_config = {**client_settings(self.kafka_options), **(producer_config or {})}
        if (
            "kafka.bootstrap.timeout.ms" not in self.kafka_options
            and "bootstrap_timeout_ms" not in (producer_config or {})
        ):  # a task's producer waits for unreachable brokers no longer than for its rows
            self.producer_config["bootstrap_timeout_ms"] = max(1, int(flush_timeout_s * 1000))
        self.flush_timeout_s = flush_timeout_s
        self.continue_trees = continue_trees
        #: whether Spark's Kafka writer writes (None: asked at the first write). "auto"
        #: not with a kafka-python ``producer_config``, which the JVM would not read.
        self._spark_writes: bool | None = {
            "spark": True,
            "python": False,
            "auto": False if producer_config else None,
        }[writer]

    def write(self, outputs: DataFrame, batch_id: int) -> DataFrame | None:
        """Write ``outputs``; return the rows the broker did not confirm (or None).

        With Spark's Kafka connector in the session, Spark's Kafka writer writes them in
        one job and the rows stay in the JVM. If that job fails because Kafka's producer
        did (a row too big for a request, one the broker refused or did not confirm),
        the rows are written again by the executors' Python producers, which say which
        rows were not written, and why: rows the failed job had written are then
        written twice, a replay's duplicates, and the stages run again for that write.
        So a batch pays for a row that does not fit only when one is there, not by
        counting such rows in every job. Any other failure of the job (a stage's error,
        a cancellation) is the batch's, raised as it is: writing row by row would run
        the stages again only to fail (or hang) the same way.

        A topic that does not exist (deleted, on brokers that create none) is an
        :class:`~ackstream.errors.EnvironmentProblem` naming it, not rows failed and
        replayed for ever. Brokers that time out or cannot be reached are
        :class:`~ackstream.errors.Unreachable` when they still do not answer a metadata
        request after the job failed: no row is failed, and the row-by-row writes,
        which would wait for them again task after task, are not tried."""
        if self._spark_writes is None:
            self._spark_writes = has_kafka_connector(outputs.sparkSession)
        if self._spark_writes:
            try:
                self._write_with_spark(outputs)
            except Exception as error:
                if not producer_failed(str(error)):
                    raise
                # a deleted topic shows as records expired unsent when Spark's cached
                # producer knew it: asked after any producer failure, not by its text
                self._check_topic()
                # records expired unsent say the brokers were slow, not that they are
                # gone: asked once more, brokers that answer now get the row-by-row
                # write, which says which rows they refuse
                if unreachable(str(error)) and not self.answers():
                    raise self._unreachable(cause_of(str(error))) from error
                log.warning(
                    "batch %d: Kafka's producer failed writing to %s (%s); writing the "
                    "batch row by row to learn which rows the broker refuses",
                    batch_id,
                    self.topic,
                    cause_of(str(error))[:300],
                )
            else:
                return None
        rows = self._write(outputs, continued=False)
        if any(_NO_TOPIC.search(r or "") for r in _reasons(rows)):
            self._check_topic()
        return self._unwritten(outputs, rows, batch_id)

    def _check_topic(self) -> None:
        """Raise, naming the topic, when the brokers answer without it (asked only once
        a write failed: a listing costs a request)."""
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError

        try:
            settings = {**client_settings(self.kafka_options), "bootstrap_timeout_ms": 5_000}
            consumer = KafkaConsumer(**settings, bootstrap_servers=self.bootstrap)
        except KafkaError:  # the brokers do not answer: that says nothing of the topic
            return
        try:
            listing = shared_listing()
            gone = deleted_topics([self.topic], lambda: listing.names(consumer, [self.topic]))
        finally:
            consumer.close()
        if gone:
            raise EnvironmentProblem(
                f"KafkaSink's topic {self.topic!r} does not exist on {self.bootstrap} (deleted, "
                "and the brokers create no topics)",
                f"create {self.topic!r} (kafka-topics.sh --create --topic {self.topic}) and "
                "start the topology again: the batch was not committed, its records replay",
            )

    def answers(self) -> bool:
        """Whether the brokers answer a metadata request for the topic (the probe of an
        outage: cheap, one request, waiting at most ``PROBE_MS``); raises
        :class:`~ackstream.errors.EnvironmentProblem` when they answer without it."""
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError

        settings = {
            **client_settings(self.kafka_options),
            "bootstrap_timeout_ms": PROBE_MS,
            "request_timeout_ms": PROBE_MS,
        }
        try:
            consumer = KafkaConsumer(**settings, bootstrap_servers=self.bootstrap)
        except KafkaError:
            return False
        try:
            partitions = consumer.partitions_for_topic(self.topic)
        except KafkaError:
            return False
        finally:
            consumer.close()
        if not partitions:
            self._check_topic()  # gone: raises
        return bool(partitions)

    def _unreachable(self, error: str) -> Unreachable:
        return Unreachable(f"KafkaSink to {self.topic} at {self.bootstrap}", error, self.answers)

    def _write_with_spark(self, outputs: DataFrame) -> None:
        """One Spark job: Spark's Kafka writer, with the producers' settings in the
        JVM's names: the source's ``kafka.*`` ones, acks from every replica, and the
        sink's flush timeout as the longest a record may take to be confirmed."""
        wait_ms = max(1, int(self.flush_timeout_s * 1000))
        given = {k.removeprefix("kafka."): v for k, v in self.kafka_options.items()}
        options = {
            "kafka.acks": "all",
            "kafka.delivery.timeout.ms": str(wait_ms),
            "kafka.request.timeout.ms": str(min(wait_ms, 30_000)),
            "kafka.max.block.ms": str(min(wait_ms, BLOCK_MS)),
            **{f"kafka.{k}": v for k, v in jvm_client_settings(given).items()},
            "kafka.bootstrap.servers": self.bootstrap,
            "topic": self.topic,
        }
        key = self.key if self.key and self.key in outputs.columns else None
        # SQL text, not Columns: each Column is a call into the JVM, on every batch
        columns = [f"{_as_bytes(outputs, self.value)} AS value"]
        if key:
            columns.append(f"{_as_bytes(outputs, key)} AS key")
        # version 2: the write is a job whose plan holds the batch's, so an Observation
        # on the batch (the topology's count of held-back rows) is filled by it
        writer = outputs.selectExpr(*columns).write.format("kafka").mode("append")
        with kafka_through_v2(outputs.sparkSession):
            writer.options(**options).save()

    def write_continued(
        self, outputs: DataFrame, batch_id: int
    ) -> tuple[DataFrame | None, pa.Table]:
        """Write ``outputs`` with their lineage as headers, leaving their trees open:
        returns the unwritten rows (or None) and the ack records ``(root, edge)`` of
        every confirmed message, one per root of its row. Each row carries ``_roots``,
        the roots it is anchored to (the topology's batch adds them)."""
        rows = self._write(outputs, continued=True)
        acks = sent_acks(rows.filter(pc.is_valid(rows.column(SENT_EDGE))))
        rows = rows.filter(pc.is_valid(rows.column(REASON))).drop_columns([SENT_EDGE, ROOTS])
        return self._unwritten(outputs, rows, batch_id), acks

    def _write(self, outputs: DataFrame, continued: bool) -> pa.Table:
        """Write ``outputs`` from the executors' producers: the rows they handed back,
        each unwritten one with its ``_reason`` (``continued``: every row, the written
        ones with their edge)."""
        from pyspark.sql.types import LongType, StringType

        key = self.key if self.key and self.key in outputs.columns else None
        payload = [*([key] if key else []), self.value]
        carried = carried_columns(outputs.columns, payload)
        schema = outputs.select(*carried).schema.add(REASON, StringType())
        if continued:
            schema = schema.add(SENT_EDGE, LongType())
        produce = ProduceTask(
            self.bootstrap,
            self.topic,
            key,
            self.value,
            tuple(carried),
            self.producer_config,
            self.flush_timeout_s,
            continued,
        )
        rows = outputs.select(*payload, *carried).mapInArrow(produce, schema).toArrow()
        reasons = [r for r in _reasons(rows) if r is not None]
        # every unwritten row waited for brokers that did not answer (and, continuing,
        # none was confirmed: a message sent twice would carry an edge nobody anchored)
        none_sent = not continued or not pc.any(pc.is_valid(rows.column(SENT_EDGE))).as_py()
        if reasons and none_sent and all(unreachable(r) for r in reasons):
            self._check_topic()
            raise self._unreachable(reasons[0])
        return rows

    def _unwritten(
        self, outputs: DataFrame, unwritten: pa.Table, batch_id: int
    ) -> DataFrame | None:
        """The rows the producers handed back, as the seam returns them: a DataFrame of
        ``outputs``' session (None: every row was written)."""
        if not unwritten.num_rows:
            return None
        log.warning(
            "batch %d: %d rows were not written to %s, first: %s",
            batch_id,
            unwritten.num_rows,
            self.topic,
            unwritten.column(REASON)[0],
        )
        return outputs.sparkSession.createDataFrame(unwritten)

    def close(self) -> None:
        """Nothing to release: every producer lives and dies inside one task."""


def sent_acks(sent: pa.Table) -> pa.Table:
    """The ack records of confirmed continued messages: per root of a row, its edge."""
    roots = sent.column(ROOTS)
    counts = pc.fill_null(pc.list_value_length(roots), 0).to_numpy()
    edges = np.repeat(sent.column(SENT_EDGE).to_numpy(), counts)
    return ack_table(pc.list_flatten(roots).to_numpy(), edges, ACK, now_ms())


def carried_columns(columns: list[str], payload: list[str]) -> list[str]:
    """The columns an unwritten row is handed back with: the lineage columns the frame
    has, then any other ``_``-prefixed column the topology passed through (e.g.
    ``_attempt``), but not ``_reason`` (the sink says why) nor a payload column."""
    taken = set(payload) | {REASON}
    lineage = [c for c in LINEAGE_COLUMNS if c in columns and c not in taken]
    return lineage + [
        c for c in columns if c.startswith("_") and c not in taken and c not in lineage
    ]


@dataclass(frozen=True)
class ProduceTask:
    """The ``mapInArrow`` function of one write: plain settings only, so it pickles to
    the executors, where each task makes, flushes and closes its own producer."""

    bootstrap: str
    topic: str
    key: str | None
    value: str
    carried: tuple[str, ...]
    producer_config: dict[str, Any]
    flush_timeout_s: float
    #: headers with the lineage and every row handed back with its edge (or why not)
    continued: bool = False

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        try:
            producer = self._producer()
        except Exception as error:  # every row of the task is unwritten, and says why
            refused = _reason("no producer", error)
            for batch in batches:
                if batch.num_rows:
                    yield self._handed_back(batch, [refused] * batch.num_rows, None)
            return
        try:
            for batch in batches:
                edges = mint_edges(batch.num_rows) if self.continued else None
                reasons = self._send(producer, batch, edges)
                if self.continued or any(r is not None for r in reasons):
                    yield self._handed_back(batch, reasons, edges)
        finally:
            producer.close(timeout=self.flush_timeout_s)

    def _producer(self) -> KafkaProducer:
        from kafka import KafkaProducer

        config = {
            "acks": "all",
            "client_id": "ackstream-sink",
            "max_block_ms": BLOCK_MS,
            **self.producer_config,
        }
        config["value_serializer"] = _NullMarked(config.get("value_serializer"))
        return KafkaProducer(bootstrap_servers=self.bootstrap, **config)

    def _send(
        self, producer: KafkaProducer, batch: pa.RecordBatch, edges: np.ndarray | None
    ) -> list[str | None]:
        """Send every row of ``batch`` (with ``edges``: and its lineage headers) and
        flush: per row, None once the broker confirmed it, else why not."""
        n = batch.num_rows
        keys = batch.column(self.key).to_pylist() if self.key else [None] * n
        values = batch.column(self.value).to_pylist()
        roots: list[list[int] | None]
        roots = batch.column(ROOTS).to_pylist() if edges is not None else [None] * n
        futures: list[Any] = []  # kafka-python's FutureRecordMetadata, or None: not sent
        reasons: list[str | None] = [None] * n
        no_metadata = None  # why the topic's metadata could not be had, once it could not
        for i, (key, value) in enumerate(zip(keys, values)):
            if no_metadata is not None:  # each send would wait max.block.ms again
                futures.append(None)
                reasons[i] = no_metadata
                continue
            anchored, headers = roots[i], None
            if edges is not None and anchored:  # a continued row anchored to roots
                headers = lineage_headers(anchored, edges[i])
            value = _NULL if key is None and value is None else _bytes(value)
            try:
                futures.append(
                    producer.send(self.topic, key=_bytes(key), value=value, headers=headers)
                )
            except KafkaTimeoutError as error:  # no metadata for the topic: every row
                futures.append(None)
                reasons[i] = no_metadata = _reason("refused by the producer", error)
            except Exception as error:  # e.g. MessageSizeTooLargeError: this row only
                futures.append(None)
                reasons[i] = _reason("refused by the producer", error)
        try:
            producer.flush(timeout=self.flush_timeout_s)
        except Exception as error:  # the rows left unconfirmed are failed below
            log.warning("flush to %s did not finish: %s", self.topic, error)
        for i, future in enumerate(futures):
            if future is None or (future.is_done and future.succeeded()):
                continue
            reasons[i] = (
                _reason("refused by the broker", future.exception)
                if future.is_done
                else f"not confirmed by the broker within {self.flush_timeout_s:g}s"
            )
        return reasons

    def _handed_back(
        self, batch: pa.RecordBatch, reasons: list[str | None], edges: np.ndarray | None
    ) -> pa.RecordBatch:
        """The rows that go back to the driver: the unwritten ones with why; with
        ``edges`` (a continuing write) every row, the confirmed ones with their edge
        (null for a row with no roots: nothing tracks it)."""
        failed = np.array([r is not None for r in reasons], dtype=bool)
        why = [f"KafkaSink to {self.topic}: {r}"[:REASON_LIMIT] if r else None for r in reasons]
        if edges is None:
            rows = batch.select(list(self.carried)).filter(pa.array(failed))
            why = [w for w in why if w is not None]
            return pa.RecordBatch.from_arrays(
                [*rows.columns, pa.array(why, pa.string())], names=[*self.carried, REASON]
            )
        rows = batch.select(list(self.carried))
        tracked = pc.fill_null(pc.greater(pc.list_value_length(batch.column(ROOTS)), 0), False)
        sent = pc.and_(pa.array(~failed), tracked)
        edge = pa.array(edges, pa.int64(), mask=~sent.to_numpy(zero_copy_only=False))
        return pa.RecordBatch.from_arrays(
            [*rows.columns, pa.array(why, pa.string()), edge],
            names=[*self.carried, REASON, SENT_EDGE],
        )


#: The value a row with neither key nor value is sent with (see :class:`_NullMarked`).
_NULL = object()


class _NullMarked(Serializer):  # type: ignore[misc]  # kafka-python has no types
    """kafka-python refuses to send a record with neither key nor value, which Kafka
    takes (and Spark's writer sends): such a row is sent with :data:`_NULL` as its
    value, which this value serializer turns back into null. Any other value goes
    through the producer's own ``value_serializer``, if one was given."""

    def __init__(self, inner: Any = None):  # a Serializer or a function, as the producer takes
        wrapped = inner is None or isinstance(inner, Serializer)
        self.inner = inner if wrapped else SerializeWrapper(inner)

    def serialize(self, topic: str, headers: Any, data: Any) -> Any:
        if data is _NULL:
            return None
        return data if self.inner is None else self.inner.serialize(topic, headers, data)

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()


def producer_failed(error: str) -> bool:
    """Whether a failed Spark job's ``error`` (its text, with the Java causes) is Kafka's
    producer's own: an exception of the Kafka client, not of the rows' computation."""
    return bool(_KAFKA_CLIENT_ERROR.search(error))


#: What a producer says when it cannot find a topic's partitions (it may be gone).
_NO_TOPIC = re.compile(r"metadata|UnknownTopicOrPartition", re.IGNORECASE)


def _reasons(rows: pa.Table) -> list[str | None]:
    """The distinct ``_reason`` values of unwritten rows."""
    return pc.unique(rows.column(REASON)).to_pylist() if rows.num_rows else []


def unreachable(error: str) -> bool:
    """Whether ``error`` (a failed job's text, or an unwritten row's reason) says the
    brokers timed out or could not be reached, as Kafka's Java client and kafka-python
    say it: the environment's fault, not the rows'.

    >>> unreachable("org.apache.kafka.common.errors.TimeoutException: Expiring 3 record(s)")
    True
    >>> unreachable("KafkaSink to out: not confirmed by the broker within 30s")
    True
    >>> unreachable("org.apache.kafka.common.errors.RecordTooLargeException: too big")
    False
    """
    return bool(_UNREACHABLE.search(error))


#: Kafka's words for brokers that time out, are not there, or have no leader yet.
_UNREACHABLE = re.compile(
    r"TimeoutException|NetworkException|DisconnectException|BrokerNotAvailable"
    r"|LeaderNotAvailable|NotLeaderOrFollower|NotLeaderForPartition|NotEnoughReplicas"
    r"|NoBrokersAvailable|KafkaTimeoutError|KafkaConnectionError|NodeNotReadyError"
    r"|RequestTimedOut|not confirmed by the broker within"
)

_KAFKA_CLIENT_ERROR = re.compile(r"org\.apache\.kafka\.common\.(?:errors\.)?\w*(?:Exception|Error)")


def _as_bytes(frame: DataFrame, name: str) -> str:
    """Column ``name`` as Spark's Kafka writer takes it, in SQL: string or binary kept,
    any other type as its string (as :func:`_bytes` does on the Python path)."""
    from pyspark.sql.types import BinaryType, StringType

    if isinstance(frame.schema[name].dataType, (StringType, BinaryType)):
        return _quoted(name)
    return f"CAST({_quoted(name)} AS STRING)"


def _quoted(name: str) -> str:
    """Column ``name`` as a SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def _reason(what: str, error: object) -> str:
    return f"{what}: {type(error).__name__}: {error}"


def _bytes(x: object) -> bytes | None:
    if x is None or isinstance(x, bytes):
        return x
    if isinstance(x, str):
        return x.encode("utf-8")
    return str(x).encode("utf-8")
