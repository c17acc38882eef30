"""The channel as two Kafka topics: a topology on a cluster.

Two topics per topology, ``<topology>.acks`` and ``<topology>.done``. Each Kafka
message carries a slice of records as one Arrow IPC stream (ack records or
completions), cut to fit the topic's message size whatever the batch holds
(:func:`~ackstream.channels.messages.encode_within`), and any process with
kafka-python and pyarrow can write ack records.

Every ack record of a root goes to partition ``pmod(root, partitions)`` of the acks
topic, so each partition is one acker shard: the acker reads the topic through a
small Python data source (:mod:`ackstream.channels.ack_source`) whose read task for
a partition runs that shard's ledger (:meth:`KafkaChannel.shard_stream`).
Completions are produced by the acker's tasks and by topology batches (the trees
they settle themselves), keyed by batch id; a batch re-run after a crash may
produce its completions twice, which the source ignores (a root it no longer
tracks is not acted on).

Every client the channel makes (its producer, its consumer, the admin client that
creates the topics, the acker's source and the executors' reads) takes the same
``kafka.*`` settings as the ``ackstream`` source, security included: the
connection and security ones that kafka-python's consumer, producer and admin client
share. Topics are created with the broker's default replication factor and retention
unless given (``-1`` in CreateTopics, Kafka >= 2.4).

A channel keeps one consumer for its reads (made on first use, dropped by
``close()`` and on pickling): building one per call was most of the source
planner's time. Executors read with :mod:`ackstream.channels.messages` instead.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa

from ackstream.channels.messages import (
    MESSAGE_BYTES,
    MessageTooLarge,
    channel_consumer,
    check_not_deleted,
    decode,
    encode_within,
    fetch_messages,
    message_ranges,
    partition_ends,
)
from ackstream.errors import EnvironmentProblem, OptionError
from ackstream.kafka.outage import RETRY_PAUSE_S, Outage, is_outage
from ackstream.kafka.settings import client_options, client_settings
from ackstream.kafka.topics import CHECK_EVERY_S, never_create_topics, shared_listing
from ackstream.vocabulary.ranges import checked, expand, is_run
from ackstream.vocabulary.records import ACK_RECORD_SCHEMA, COMPLETION_SCHEMA, as_table

if TYPE_CHECKING:
    from kafka import KafkaConsumer, KafkaProducer
    from pyspark.sql import DataFrame, SparkSession

    from ackstream.channels.ack_source import ChannelSource
    from ackstream.channels.base import ShardRunner

__all__ = ["KafkaChannel"]

#: A completions reader's position: ``{"<partition>": next offset}``.
KafkaPosition = dict[str, int]
#: Rows to send to one partition of a topic (None: the producer picks).
Piece = tuple[int | None, pa.Table]

log = logging.getLogger(__name__)

#: A topology's batches and its acker's write through one channel from two threads.
_PRODUCER_LOCK = threading.Lock()
#: The message size each channel topic of this process takes, once its brokers refused
#: :data:`~ackstream.channels.messages.MESSAGE_BYTES` (by brokers and topic).
_BUDGETS: dict[tuple[str, str], int] = {}
#: Below this a topic's messages are not cut further: its limit is reported instead.
SMALLEST_MESSAGE_BYTES = 4 << 10


class KafkaChannel:
    """Ack and completion channels of ``topology`` on the broker at ``bootstrap``.

    ``kafka_options``: client settings in the source's ``kafka.*`` form (e.g.
    ``{"kafka.security.protocol": "SSL", "kafka.ssl.cafile": "ca.pem"}``; the source's
    own options may be given as they are: keys without ``kafka.`` and consumer-only
    settings are left out).
    ``replication_factor`` and ``retention_ms`` of the topics it creates: None, the
    broker's defaults."""

    def __init__(
        self,
        bootstrap: str,
        topology: str,
        partitions: int = 2,
        *,
        kafka_options: Mapping[str, str] | None = None,
        replication_factor: int | None = None,
        retention_ms: int | None = None,
    ):
        self.bootstrap, self.topology, self.partitions = bootstrap, topology, partitions
        self.kafka_options = {
            str(k): str(v)
            for k, v in (kafka_options or {}).items()
            if str(k).startswith("kafka.")
            and str(k) not in ("kafka.bootstrap.servers", "kafka.group.id")
        }
        self.settings = client_settings(self.kafka_options)  # a bad one fails here
        if replication_factor is not None and replication_factor < 1:
            raise OptionError("replication_factor", replication_factor, "None or >= 1")
        if retention_ms is not None and retention_ms < 1:
            raise OptionError("retention_ms", retention_ms, "None (the broker's) or >= 1")
        self.replication_factor, self.retention_ms = replication_factor, retention_ms
        self.acks_topic, self.done_topic = f"{topology}.acks", f"{topology}.done"
        self._producer: Any = None  # a KafkaProducer once one is needed
        self._consumer: Any = None  # a KafkaConsumer once one is needed
        self._listing = shared_listing()  # is a topic deleted?
        self._outage = Outage(bootstrap)  # of the completion polls
        self._reading = threading.Lock()  # a consumer is not thread-safe
        #: topics this channel saw exist (made or read or written): only those can be
        #: deleted; one that never existed reads as empty (``ackstream status``)
        self._known: set[str] = set()

    ack_files = False  # the acks topic, read by Spark's stream of it
    one_host = False  # a broker every host reaches

    @property
    def ack_shards(self) -> KafkaChannel:
        """The channel itself: its acks topic's partitions are the acker's shards."""
        return self

    def __getstate__(self) -> dict[str, object]:
        return {
            **self.__dict__,
            "_producer": None,
            "_consumer": None,
            "_reading": None,
            "_listing": None,
        }

    def agreeing_with(self, source_options: Mapping[str, str]) -> KafkaChannel:
        """This channel as a source with ``source_options`` and ``ackstream.channel=kafka``
        must see it: the source reaches the channel's topics through its own brokers
        with its own client settings. Settings of the source's this channel lacks
        (security, timeouts) are added, in a new channel; other brokers, or a setting
        both give with different values, are an :class:`OptionError` naming both (the
        source would read one channel and the topology write another)."""
        given = {str(k): str(v) for k, v in source_options.items()}
        brokers = given.get("kafka.bootstrap.servers")
        if brokers is not None and set(brokers.split(",")) != set(self.bootstrap.split(",")):
            raise OptionError(
                "kafka.bootstrap.servers",
                brokers,
                f"{self.bootstrap!r}, the brokers of the topology's KafkaChannel (the "
                "source reads the channel's topics on its own brokers)",
            )
        lacking = {}
        for key, value in client_options(given).items():
            mine = self.kafka_options.get(key)
            if mine is None:
                lacking[key] = value
            elif mine != value:
                raise OptionError(
                    key,
                    value,
                    f"{mine!r}, the value the topology's KafkaChannel was given (give it "
                    "once, to the source: the channel takes it from there)",
                )
        if not lacking:
            return self
        return KafkaChannel(
            self.bootstrap,
            self.topology,
            self.partitions,
            kafka_options={**self.kafka_options, **lacking},
            replication_factor=self.replication_factor,
            retention_ms=self.retention_ms,
        )

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._reading = threading.Lock()
        self._listing = shared_listing()

    def source_options(self) -> dict[str, str]:
        options = {"ackstream.channel": "kafka"}
        if self.replication_factor is not None:  # its topics, whoever creates them
            options["ackstream.channelReplication"] = str(self.replication_factor)
        if self.retention_ms is not None:
            options["ackstream.channelRetention"] = f"{self.retention_ms}ms"
        return options

    def prepare(self) -> None:
        """Create both topics if they do not exist yet."""
        from kafka.admin import KafkaAdminClient, NewTopic
        from kafka.errors import TopicAlreadyExistsError

        admin = KafkaAdminClient(
            **self.settings, bootstrap_servers=self.bootstrap, client_id="ackstream"
        )
        configs = {} if self.retention_ms is None else {"retention.ms": str(self.retention_ms)}
        try:
            existing = set(admin.list_topics())
            wanted = [
                NewTopic(
                    t,
                    self.partitions,
                    -1 if self.replication_factor is None else self.replication_factor,
                    topic_configs=configs,
                )
                for t in (self.acks_topic, self.done_topic)
                if t not in existing
            ]
            if wanted:
                with contextlib.suppress(TopicAlreadyExistsError):  # a race with another
                    admin.create_topics(wanted)
            self._known.update((self.acks_topic, self.done_topic))
        finally:
            admin.close()

    # --- ack records ------------------------------------------------------------

    def write_acks(self, records: pa.Table | pd.DataFrame) -> None:
        """Append ack records, each to the partition of its root's shard; returns once
        the broker confirmed every message."""
        self._send(self.acks_topic, as_table(records, ACK_RECORD_SCHEMA), key=None, by_root=True)

    def shard_stream(self, spark: SparkSession, run_shard: ShardRunner, shards: int) -> DataFrame:
        """The acks topic as a stream of what ``run_shard(records, partition, batch,
        now_ms)`` returns for each partition's records of a batch, run in the task that
        reads them (see :class:`~ackstream.channels.ack_source.ShardSource`). An
        :class:`OptionError` unless the topic has ``shards`` partitions."""
        from ackstream.channels.ack_source import ShardSource

        found = self._partitions_of(self.acks_topic)
        if len(found) != shards:
            raise OptionError(
                "ackers",
                shards,
                f"{len(found)}, the partitions of the acks topic {self.acks_topic!r} (each "
                "is one acker shard): give the topology as many ackers as its "
                "KafkaChannel has partitions",
            )
        source = ShardSource.running(run_shard, f"ackstream-acker-{self.acks_topic}")
        return self._acks_stream(spark, source, shards=str(shards))

    def ack_stream(
        self, spark: SparkSession, max_files_per_trigger: int | None = None
    ) -> DataFrame:
        """The ack records as a streaming DataFrame."""
        from ackstream.channels.ack_source import ChannelSource

        return self._acks_stream(spark, ChannelSource)

    def _partitions_of(self, topic: str, wait_s: float = 10.0) -> set[int]:
        """``topic``'s partitions; a topic made a moment ago by :meth:`prepare` may not
        be in the brokers' metadata yet: asked again for up to ``wait_s``."""
        deadline = time.monotonic() + wait_s
        while True:
            with self._reader() as consumer:
                found = consumer.partitions_for_topic(topic) or set()
            if found or time.monotonic() > deadline:
                return found
            time.sleep(0.2)

    def _acks_stream(
        self, spark: SparkSession, source: type[ChannelSource], **options: str
    ) -> DataFrame:
        """The acks topic read by the Python data source ``source``, registered first.
        pyspark's data source API is imported only here: the channel's other users (the
        source's planner, the sinks, ``ackstream status``) do not need it."""
        spark.dataSource.register(source)
        return (
            spark.readStream.format(source.name())
            .options(**self.kafka_options)
            .option("kafka.bootstrap.servers", self.bootstrap)
            .option("topic", self.acks_topic)
            .options(**options)
            .load()
        )

    def ack_records(self) -> pa.Table:
        """Every ack record on the acks topic; foreign messages are logged and skipped."""
        return self._read(self.acks_topic, ACK_RECORD_SCHEMA, {})[0]

    # --- completions ------------------------------------------------------------

    def write_completions(self, table: pa.Table, batch_id: int | None = None) -> None:
        """Produce completions; a query's batch keys them by its batch id."""
        if table.num_rows:
            key = None if batch_id is None else b"%d" % batch_id
            self._send(self.done_topic, as_table(table, COMPLETION_SCHEMA), key=key)

    def completions_since(
        self, position: KafkaPosition | None = None, *, runs: bool = False
    ) -> tuple[pa.Table, KafkaPosition]:
        """Completions after ``position`` ({partition: next offset}) and the new position.
        While the brokers do not answer, none and the same position (the spout polls
        again next trigger); an outage past ``OUTAGE_LIMIT_S`` raises (see
        :class:`~ackstream.kafka.outage.Outage`).

        Runs of acked offsets come back one row per root, but only the runs their
        partition can hold on the channel's brokers (as ``ackstream status`` checks
        them): any other run, a forged or damaged one, or one of an upstream on other
        brokers, comes back as one ``invalid`` row saying why, so that what is expanded
        is bounded by the partitions' offsets. ``runs=True`` returns the runs as
        written, unchecked, for a reader that checks them itself (the source, against
        the offsets it read)."""
        from kafka.errors import KafkaError

        try:
            found = self._read(self.done_topic, COMPLETION_SCHEMA, dict(position or {}))
        except KafkaError as error:
            self._outage.failed(f"completions on {self.done_topic!r}", error)
            return COMPLETION_SCHEMA.empty_table(), dict(position or {})
        self._outage.answered()
        table, after = found
        return (table if runs else self._expanded(table)), after

    def _expanded(self, table: pa.Table) -> pa.Table:
        """``table``'s runs checked against their partitions' ends, then expanded."""
        run = is_run(table)
        if not run.any():
            return table
        ran = table.filter(pa.array(run))
        named = zip(ran.column("topic").to_pylist(), ran.column("partition").to_pylist())
        with self._reader() as consumer:
            ends = partition_ends(consumer, ((t, p) for t, p in named if t is not None))
        return expand(checked(table, ends))

    def answering(self) -> bool:
        """False from a completions read the brokers did not answer until one they did."""
        return self._outage.since is None

    def end_position(self) -> KafkaPosition:
        """The position after every completion written so far (see LocalChannel)."""
        with self._reader() as consumer:
            ranges = message_ranges(self.bootstrap, self.done_topic, {}, consumer=consumer)
        return {str(p): end for p, _, end in ranges}

    def _read(
        self, topic: str, schema: pa.Schema, position: KafkaPosition
    ) -> tuple[pa.Table, KafkaPosition]:
        from kafka.errors import KafkaError

        self._check_not_deleted(topic)
        try:
            return self._read_ranges(topic, schema, position)
        except KafkaError:
            self._listing.forget()
            self._check_not_deleted(topic)
            raise

    def _read_ranges(
        self, topic: str, schema: pa.Schema, position: KafkaPosition
    ) -> tuple[pa.Table, KafkaPosition]:
        tables = [schema.empty_table()]
        with self._reader() as consumer:
            for partition, start, end in message_ranges(
                self.bootstrap, topic, position, consumer=consumer
            ):
                for offset, message in fetch_messages(
                    self.bootstrap, topic, partition, start, end, consumer=consumer
                ):
                    table = decode(message, schema, topic, partition, offset)
                    tables += [table] if isinstance(table, pa.Table) else []
                position[str(partition)] = end
                self._known.add(topic)  # it has partitions: it exists
        return pa.concat_tables(tables), position

    @contextlib.contextmanager
    def _reader(self) -> Iterator[KafkaConsumer]:
        """The channel's own consumer, one reader at a time; a read that failed drops
        it, so the next one starts from a fresh client."""
        with self._reading:
            if self._consumer is None:
                self._consumer = channel_consumer(self.bootstrap, self.settings)
            try:
                yield self._consumer
            except BaseException:
                self._close_consumer()
                raise

    def _check_not_deleted(self, topic: str) -> None:
        if topic not in self._known:
            return
        with self._reader() as consumer:
            check_not_deleted(self.bootstrap, topic, consumer, self._listing)

    def _close_consumer(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    # --- plumbing ---------------------------------------------------------------

    def _send(self, topic: str, table: pa.Table, key: bytes | None, by_root: bool = False) -> None:
        """Produce ``table`` to ``topic``, waiting for every broker ack; ``by_root``: each
        row to partition ``pmod(root, partitions)``. However many rows, each message
        stays under the topic's message size (:meth:`_send_within`). A deleted topic
        is named instead of kafka-python's timeouts: asked for first when the producer
        does not know the topic's partitions (a send would block for ``max_block_ms``),
        and every second while the acks are awaited (a record for a partition gone
        expires after 120 s). A producer that knows them sends at once: asking costs a
        metadata request on every batch.

        Brokers that do not answer (stalled, restarting, electing a leader) are an
        outage, not the records' fault: what they did not take is sent again by a new
        producer every ``RETRY_PAUSE_S`` until they have failed for longer than
        ``OUTAGE_LIMIT_S`` (:class:`~ackstream.kafka.outage.Outage`), which raises naming
        them. kafka-python's idempotent producer turns a timed-out request for its
        producer id into a fatal error, so a stall must not end the send. A message sent
        again that the brokers had in fact written costs a timeout and a replay at worst
        (a duplicate ack record cancels itself), never a false ack. A send that fails
        drops its producer without waiting for what it holds (see :func:`_close_now`)."""
        outage = Outage(self.bootstrap)
        pending: list[Piece] | None = None  # what is left to send, cut by partition
        while True:
            budget = _BUDGETS.get((self.bootstrap, topic), MESSAGE_BYTES)
            producer = None
            try:
                producer = self._producer_now()
                if not _knows_partitions(producer, topic):
                    self._check_not_deleted(topic)
                if pending is None:
                    shards = len(producer.partitions_for(topic)) if by_root else 0
                    pending = list((_by_root(table, shards) if by_root else {None: table}).items())
                outcome = self._send_within(producer, topic, key, pending, budget)
            except BaseException as failure:  # what was taken is not known: all again
                if producer is not None:
                    self._drop_producer(producer)
                if not is_outage(failure):
                    raise
                self._wait_out(outage, topic, failure)
                continue
            self._known.add(topic)
            if not (outcome.refused or outcome.unsent):
                return
            self._drop_producer(producer)  # it failed a message: it is spent
            pending = outcome.refused + outcome.unsent
            if outcome.refused:  # refused for their size: cut smaller, sent again at once
                self._shrink(topic, budget)
            else:
                self._wait_out(outage, topic, outcome.error)

    def _wait_out(self, outage: Outage, topic: str, error: BaseException | None) -> None:
        """A send to ``topic`` failed for the brokers: stop if the topic was deleted or
        the outage lasted too long, else pause before the next attempt."""
        try:
            self._listing.forget()
            self._check_not_deleted(topic)
        except Exception as failure:  # noqa: BLE001 - no answer: nothing can be told
            if not is_outage(failure):
                raise
        outage.failed(f"sending to {topic!r}", error or TimeoutError("no answer"))
        time.sleep(RETRY_PAUSE_S)

    def _producer_now(self) -> KafkaProducer:
        """The channel's producer, made on first use (and after one was dropped)."""
        with _PRODUCER_LOCK:
            if self._producer is None:
                from kafka import KafkaProducer

                self._producer = never_create_topics(  # made by prepare(), never again
                    KafkaProducer(
                        **self.settings,
                        bootstrap_servers=self.bootstrap,
                        acks="all",
                        linger_ms=5,
                        max_request_size=8 << 20,
                    )
                )
            return self._producer

    def _send_within(
        self,
        producer: KafkaProducer,
        topic: str,
        key: bytes | None,
        pieces: list[Piece],
        budget: int,
    ) -> _Sent:
        """Send each ``(partition, rows)`` of ``pieces`` as messages of at most ``budget``
        bytes; say which rows the brokers refused for their size and which they did not
        take for another Kafka error (kafka-python's producer then fails what it held:
        those are sent again, by a new producer)."""
        from kafka.errors import KafkaError, KafkaTimeoutError, MessageSizeTooLargeError

        outcome = _Sent()
        messages = [
            (partition, rows, message)
            for partition, table in pieces
            for rows, message in _cut(table, topic, budget)
        ]
        futures: list[Any] = []
        for partition, _, message in messages:
            try:
                futures.append(producer.send(topic, key=key, value=message, partition=partition))
            except KafkaError as error:  # no metadata in max_block_ms, or a producer failed
                outcome.error = error
                break
        while outcome.error is None:
            try:
                producer.flush(timeout=CHECK_EVERY_S)
                break
            except KafkaTimeoutError:  # still waiting: is the topic there?
                self._check_not_deleted(topic)
        for index, (partition, rows, _) in enumerate(messages):
            try:
                if index >= len(futures) or not (outcome.error is None or futures[index].is_done):
                    outcome.unsent.append((partition, rows))  # not sent, or not known taken
                    continue
                futures[index].get(timeout=30)  # raise if the broker did not take it
            except MessageSizeTooLargeError:
                outcome.refused.append((partition, rows))
            except KafkaError as error:
                outcome.unsent.append((partition, rows))
                outcome.error = outcome.error or error
        return outcome

    def _shrink(self, topic: str, budget: int) -> None:
        """``topic``'s brokers refused messages of ``budget`` bytes: this process cuts them
        to half that from now on, down to :data:`SMALLEST_MESSAGE_BYTES`."""
        smaller = budget // 2
        if smaller < SMALLEST_MESSAGE_BYTES:
            raise _too_small(topic, budget, budget)
        _BUDGETS[(self.bootstrap, topic)] = smaller
        log.warning(
            "ackstream: topic %r refused channel messages of up to %d bytes: cut to %d bytes "
            "from now on (raise its max.message.bytes to avoid it)",
            topic,
            budget,
            smaller,
        )

    def _drop_producer(self, producer: KafkaProducer) -> None:
        with _PRODUCER_LOCK:
            if self._producer is producer:
                self._producer = None
        _close_now(producer)

    def close(self) -> None:
        """Release the producer and the reader; every send was awaited, so the
        producer holds nothing to flush (and a broker gone cannot hold the close)."""
        with _PRODUCER_LOCK:
            producer, self._producer = self._producer, None
        if producer is not None:
            _close_now(producer)
        with self._reading:
            self._close_consumer()


@dataclass
class _Sent:
    """What one producer did not deliver of a send: rows refused for their message's
    size, rows not taken for another Kafka error (the first of which is kept)."""

    refused: list[Piece] = field(default_factory=list)
    unsent: list[Piece] = field(default_factory=list)
    error: Exception | None = None


def _cut(table: pa.Table, topic: str, budget: int) -> list[tuple[pa.Table, bytes]]:
    """``table`` as messages of at most ``budget`` bytes, each with its rows."""
    try:
        return list(encode_within(table, budget))
    except MessageTooLarge as error:
        raise _too_small(topic, error.size, budget) from error


def _by_root(table: pa.Table, partitions: int) -> dict[int | None, pa.Table]:
    """``table``'s rows by the partition of their root, ``pmod(root, partitions)``; a
    row without a root (which the acker reports as invalid) goes with partition 0."""
    root = table.column("root").fill_null(0).to_numpy()
    shard = np.mod(root, partitions)
    if not len(shard) or (shard == shard[0]).all():
        return {int(shard[0]) if len(shard) else 0: table}
    return {int(p): table.filter(pa.array(shard == p)) for p in np.unique(shard)}


def _too_small(topic: str, size: int, budget: int) -> EnvironmentProblem:
    return EnvironmentProblem(
        f"the channel topic {topic!r} refused a message of {size} bytes (cut down to "
        f"{budget} bytes, the smallest ackstream makes, it still does not fit)",
        f"raise the topic's max.message.bytes (kafka-configs.sh --alter --entity-type "
        f"topics --entity-name {topic} --add-config max.message.bytes=1048588)",
    )


def _knows_partitions(producer: KafkaProducer, topic: str) -> bool:
    """Whether ``producer``'s cached metadata holds ``topic``'s partitions, so that a send
    cannot wait for them; asked without a request (kafka-python keeps that cache under
    a private name: where it is not found, the answer is no, and the brokers are asked)."""
    partitions_for_topic = getattr(
        getattr(producer, "_metadata", None), "partitions_for_topic", None
    )
    try:
        return partitions_for_topic is not None and bool(partitions_for_topic(topic))
    except Exception:  # noqa: BLE001 - another kafka-python: ask the brokers instead
        return False


def _close_now(producer: KafkaProducer) -> None:
    """Close ``producer`` dropping the records it still holds. kafka-python's
    ``close(timeout)`` flushes first and raises when the flush does not end in time,
    before it would force the close: a record for a deleted topic's partition held it
    for the producer's delivery timeout (120 s). Its sender is told to force the close
    first (a private name: where it is not found, the close waits as before)."""
    from kafka.errors import KafkaTimeoutError

    sender = getattr(producer, "_sender", None)
    force_close = getattr(sender, "force_close", None)
    if force_close is not None:
        force_close()
    with contextlib.suppress(KafkaTimeoutError):
        producer.close(timeout=CHECK_EVERY_S)
