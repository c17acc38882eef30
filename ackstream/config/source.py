# Over 600 lines: OPTIONS declares every source option in one table (parser, hints, docs).
"""Options of the ``ackstream`` source, parsed once into a frozen :class:`SourceConfig`.

Spark hands a data source its options as case-insensitive strings. They are parsed
here on the driver when the DataFrame is created (``load()``), so a bad value fails
before the query starts, with an :class:`~ackstream.errors.OptionError` naming the
option, the value and what is allowed. Unknown ``ackstream.*`` keys are rejected;
nothing falls back silently to a default. Kafka options mirror Spark's Kafka source.

Each option is declared once, as a row of :data:`OPTIONS` (see
:mod:`ackstream.config.options`): :func:`parse` reads the rows in order, the did-you-mean
suggestions come from their names, and the options page of the docs is made from
them (``docs/hooks/options_page.py``).

>>> cfg = parse({"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "a,b",
...              "ackstream.messageTimeout": "2 min"})
>>> cfg.kafka.topics, cfg.message_timeout_ms
(('a', 'b'), 120000)
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any, Literal, get_args

import numpy as np

from ackstream.config.options import (
    DURATION,
    FLAG,
    NAME,
    TEXT,
    NotAllowed,
    Only,
    Option,
    Reader,
    Seen,
    choice,
    did_you_mean,
    parse_duration_ms,
    whole,
)
from ackstream.errors import OptionError

__all__ = [
    "DEFAULTS",
    "OPTIONS",
    "REFUSED",
    "RECORD_READERS",
    "RecordReader",
    "RetryPolicy",
    "SourceConfig",
    "Upstream",
    "default_channel_dir",
    "default_tick_ms",
    "option_names",
    "parse",
    "parse_duration_ms",
    "same_value",
]

#: Where records come from: a Kafka cluster, or the built-in generator (no broker).
Upstream = Literal["kafka", "generator"]
#: Who reads a batch's new offset ranges (see ``SourceConfig.record_reader``).
RecordReader = Literal["python", "spark"]
#: Values of ``ackstream.recordReader``.
RECORD_READERS: tuple[str, ...] = get_args(RecordReader)
#: What a partition with no record as late as the starting timestamp does.
TimestampStrategy = Literal["error", "latest"]
_NAMED_STARTS = ("earliest", "latest", "committed")


@dataclass(frozen=True)
class RetryPolicy:
    """When a failed record is replayed, Storm's KafkaSpout schedule: the first replay
    after ``initial_delay_ms``, replay n >= 2 after ``delay_period_ms * 2**(n-1)``
    (``delay_period_ms`` defaults to the initial delay), never later than
    ``max_delay_ms``; after ``max_retries`` replays the record is dead-lettered.

    >>> [RetryPolicy(500, 10_000).delay_ms(n) for n in (1, 2, 3, 6)]
    [500, 1000, 2000, 10000]
    >>> [RetryPolicy(0, 60_000, delay_period_ms=2_000).delay_ms(n) for n in (1, 2, 3)]
    [0, 4000, 8000]
    """

    initial_delay_ms: int = 500
    max_delay_ms: int = 10_000
    max_retries: int = 5
    delay_period_ms: int | None = None

    def __post_init__(self) -> None:
        if self.initial_delay_ms < 0:
            raise OptionError(
                "ackstream.retryInitialDelay", self.initial_delay_ms, "a duration >= 0"
            )
        if self.max_delay_ms < self.initial_delay_ms:
            raise OptionError(
                "ackstream.retryMaxDelay",
                self.max_delay_ms,
                f"a duration of at least ackstream.retryInitialDelay ({self.initial_delay_ms} ms)",
            )
        if self.delay_period_ms is not None and self.delay_period_ms <= 0:
            raise OptionError(
                "ackstream.retryDelayPeriod", self.delay_period_ms, "a positive duration"
            )
        if self.max_retries < 0:
            raise OptionError("ackstream.maxRetries", self.max_retries, "a whole number >= 0")

    def delay_ms(self, attempt: int) -> int:
        """The wait before attempt ``attempt`` (1: the first replay)."""
        if attempt <= 0:
            return 0
        if attempt == 1:
            return self.initial_delay_ms
        period = self.initial_delay_ms if self.delay_period_ms is None else self.delay_period_ms
        return min(self.max_delay_ms, period * (1 << min(attempt - 1, 40)))

    def delays_ms(self, attempts: Any) -> np.ndarray:
        """:meth:`delay_ms` of each of ``attempts`` at once.

        >>> RetryPolicy(500, 10_000).delays_ms([0, 1, 2, 3, 6]).tolist()
        [0, 500, 1000, 2000, 10000]
        """
        attempts = np.asarray(attempts, np.int64)
        period = self.initial_delay_ms if self.delay_period_ms is None else self.delay_period_ms
        doubled = period * np.exp2(np.clip(attempts - 1, 0, 40))
        later = np.minimum(self.max_delay_ms, doubled).astype(np.int64)
        return np.where(attempts <= 0, 0, np.where(attempts == 1, self.initial_delay_ms, later))


@dataclass(frozen=True)
class KafkaOptions:
    """What to read from Kafka and how, as Spark's Kafka source names it."""

    bootstrap_servers: str | None = None
    #: exactly one of the three ways to name what to read, as Spark's: ``subscribe``
    #: (topics), ``assign`` (fixed partitions) or ``subscribePattern`` (a regex matched
    #: against the brokers' topics on every batch, so new matching topics are read)
    topics: tuple[str, ...] = ()
    assign: tuple[tuple[str, int], ...] = ()
    subscribe_pattern: str | None = None
    #: "earliest", "latest", "committed" (group offset, else earliest), or a JSON map
    #: ``{"topic": {"0": offset}}`` with -2 = earliest, -1 = latest (as Spark's).
    starting_offsets: str = "committed"
    #: ``startingTimestamp`` (ms, every partition) or ``startingOffsetsByTimestamp``
    #: (JSON ``{"topic": {"0": ms}}``): start at the first offset whose timestamp is at
    #: or after it (the broker's offsets-for-times); they win over ``startingOffsets``
    starting_timestamp: int | None = None
    starting_timestamps: str | None = None
    #: a partition with no record that late: "error" (fail the start) or "latest"
    starting_timestamp_strategy: TimestampStrategy = "error"
    #: a ``headers`` column: array<struct<key: string, value: binary>>, null when none
    include_headers: bool = False
    group_id: str = "ackstream-ackstream"
    fail_on_data_loss: bool = True
    options: tuple[tuple[str, str], ...] = ()  #: other ``kafka.*`` settings

    def starting_map(self) -> dict[str, dict[int, int]] | None:
        """The JSON form of ``startingOffsets`` as ``{topic: {partition: offset}}``, or None."""
        if self.starting_offsets in _NAMED_STARTS:
            return None
        raw = json.loads(self.starting_offsets)
        return {t: {int(p): int(o) for p, o in parts.items()} for t, parts in raw.items()}

    def timestamp_map(self) -> dict[str, dict[int, int]] | None:
        """``startingOffsetsByTimestamp`` as ``{topic: {partition: ms}}``, or None."""
        if self.starting_timestamps is None:
            return None
        raw = json.loads(self.starting_timestamps)
        return {t: {int(p): int(ms) for p, ms in parts.items()} for t, parts in raw.items()}


@dataclass(frozen=True)
class Admission:
    """How much the source lets in: per batch, per read task, in flight, per record."""

    max_offsets_per_trigger: int | None = None
    #: at least this many read tasks per batch: big offset ranges are split (Spark's)
    min_partitions: int | None = None
    #: at most this many records per read task: bigger offset ranges are split (Spark's)
    max_records_per_partition: int | None = None
    #: records not done at most: in flight, or waiting for a replay or their dead letter
    #: (None: no limit)
    max_pending: int | None = None
    #: a bigger record value is rejected on read: dead-lettered (without its value) and
    #: never handed to the bolts, which it could stall or crash (None: no limit)
    max_value_bytes: int | None = 16 << 20


@dataclass(frozen=True)
class GeneratorOptions:
    """The test upstream's records (``ackstream.upstream=generator``)."""

    count: int | None = None
    rate: float = 0.0  #: records per second over all partitions; 0 = no limit
    partitions: int = 2


@dataclass(frozen=True)
class SourceConfig:
    """Everything the source needs, validated; picklable (it travels to ``read()``)."""

    upstream: Upstream = "kafka"
    kafka: KafkaOptions = KafkaOptions()
    admission: Admission = Admission()
    generator: GeneratorOptions = GeneratorOptions()
    topology: str = "ackstream"
    channel: str = ""
    #: the local channel's folder is on a file system every host mounts at the same path
    channel_shared: bool = False
    #: replication factor and retention of the Kafka channel's topics (None: broker's)
    channel_replication: int | None = None
    channel_retention_ms: int | None = None
    #: where the source keeps the unfinished records behind each offset (see
    #: ``ackstream.sources.state``); "" = <channel>/source_state, or with the Kafka
    #: channel <tmp>/ackstream/<id_namespace>/source_state
    state_dir_option: str = ""
    tracking: bool = True
    message_timeout_ms: int = 30_000
    source_timeout_ms: int = 60_000  #: in-flight roots with no completion replay after this
    #: a batch with no new records this often while roots are in flight (a topology
    #: with a processing-time window sets it, so its windows close on time); None: never
    idle_batch_ms: int | None = None
    retry: RetryPolicy = RetryPolicy()
    dead_letter_topic: str | None = None
    #: who reads a batch's new offset ranges: "python" (the source's read tasks) or
    #: "spark" (Spark's own Kafka source, in the topology's batch: the source's tasks
    #: then read replays only; see ``ackstream.sources.spark_reader``)
    record_reader: RecordReader = "python"

    @property
    def id_namespace(self) -> str:
        """What root ids hash besides a record's coordinates: the topology's name, and
        the consumer group when it is not the topology's default one. Two topologies of
        one name that commit to different groups share the channel (it is named by the
        topology) but then never settle each other's records. (The generator has no
        group: two of one name share their commits and are refused by the claim.)"""
        if self.upstream != "kafka" or self.kafka.group_id == f"ackstream-{self.topology}":
            return self.topology
        return f"{self.topology}@{self.kafka.group_id}"

    @property
    def value_limit(self) -> int | None:
        """The size over which a read value is rejected (``ackstream.maxValueBytes``);
        None: no limit (untracked, or ``none``), since only tracking can dead-letter."""
        return self.admission.max_value_bytes if self.tracking else None

    @property
    def dead_letter_dir(self) -> str:
        """Parquet folder for dead letters when no dead-letter topic is configured."""
        return os.path.join(self.channel, "dead_letters")

    @property
    def state_dir(self) -> str:
        """The folder of the source's state files (read and written on the driver only)."""
        if self.state_dir_option:
            return self.state_dir_option
        if self.channel == "kafka":
            folder = self.id_namespace.replace(os.sep, "_")  # one per group, as the ids
            return os.path.join(tempfile.gettempdir(), "ackstream", folder, "source_state")
        return os.path.join(self.channel, "source_state")


def default_channel_dir(topology: str) -> str:
    """Where the local completion channel lives when ``ackstream.channel`` is not set."""
    return os.path.join(tempfile.gettempdir(), "ackstream", topology, "channel")


def default_tick_ms(message_timeout_ms: int) -> int:
    """How often an idle acker shard wakes to expire roots: a quarter of the message
    timeout, at least 10 ms and at most 1 s. So a tree that never completes times out
    between ``message_timeout`` and ``message_timeout + tick`` after its init, and the
    source wakes the acker (a tick record) at most once per tick.

    >>> default_tick_ms(30_000), default_tick_ms(2_000)
    (1000, 500)
    """
    return max(10, min(1000, message_timeout_ms // 4))


# Readers and checks of the options that need more than a number, a flag or a name.

_ONE_OF = (
    'subscribe (topics), assign (JSON {"topic": [0, 1]}) or subscribePattern '
    "(a regex of topic names)"
)
_STARTS = (
    '"earliest", "latest", "committed", or JSON {"topic": {"0": offset}} '
    "with -2 = earliest and -1 = latest"
)
_BY_TIME = 'JSON {"topic": {"0": epoch ms}} naming only topics read'


def _topology_name(name: str, seen: Seen) -> str | None:
    if re.fullmatch(r"[A-Za-z0-9._-]{1,200}", name) and name not in (".", ".."):
        return None
    return (
        "1 to 200 letters, digits, '.', '_' or '-', but not '.' or '..' (it names the "
        "channel's folder and Kafka topics)"
    )


def _topics(text: str) -> tuple[str, ...]:
    topics = tuple(t.strip() for t in text.split(",") if t.strip())
    if not topics:
        raise NotAllowed("a comma-separated list of one or more topics")
    twice = sorted({t for t in topics if topics.count(t) > 1})
    if twice:
        raise NotAllowed(
            f"a comma-separated list of distinct topics ({', '.join(map(repr, twice))} twice)"
        )
    return topics


def _assign(text: str) -> tuple[tuple[str, int], ...]:
    pairs = sorted({(str(t), int(p)) for t, parts in json.loads(text).items() for p in parts})
    if not pairs or any(p < 0 for _, p in pairs):
        raise ValueError(text)
    return tuple(pairs)


def _pattern(text: str) -> str:
    try:
        re.compile(text)
    except re.error as problem:
        raise NotAllowed(f"a Python regular expression ({problem})") from None
    if not text:
        raise NotAllowed("a regular expression of topic names")
    return text


def _beside(*others: str) -> Callable[[Seen], str | None]:
    """Refuse a way to name what to read given beside one of ``others``."""

    def conflicts(seen: Seen) -> str | None:
        given = [name for name in others if seen.gave(name)]
        return f"no value beside {given[0]}: exactly one of {_ONE_OF}" if given else None

    return conflicts


def _read_something(topics: tuple[str, ...], seen: Seen) -> str | None:
    return None if topics or seen.gave("subscribePattern") else f"one of {_ONE_OF} (required)"


def _by_partition(text: str) -> dict[str, dict[int, int]]:
    """A JSON ``{"topic": {"0": number}}`` map with its keys read."""
    return {t: {int(p): int(n) for p, n in parts.items()} for t, parts in json.loads(text).items()}


def _start(text: str) -> str:
    if text.strip().lower() in _NAMED_STARTS:
        return text.strip().lower()
    _by_partition(text)
    return json.dumps(json.loads(text), sort_keys=True)


def _only_topics_read(
    at_least: int, allowed: Callable[[list[str]], str]
) -> Callable[[str | None, Seen], str | None]:
    """Refuse a JSON map naming a topic not read, or a number below ``at_least``."""

    def check(value: str | None, seen: Seen) -> str | None:
        if value is None or value in _NAMED_STARTS:
            return None
        parsed = _by_partition(value)
        stray = not seen["kafka.subscribe_pattern"] and set(parsed) - set(seen["kafka.topics"])
        low = any(n < at_least for parts in parsed.values() for n in parts.values())
        return allowed(sorted(seen["kafka.topics"])) if low or stray else None

    return check


def _by_time(text: str) -> str:
    parsed = _by_partition(text)
    return json.dumps(
        {t: {str(p): ms for p, ms in parts.items()} for t, parts in parsed.items()}, sort_keys=True
    )


def _value_bytes(text: str) -> int | None:
    return None if text.strip().lower() == "none" else whole(1).convert(text)


def _rate(text: str) -> float:
    if not (rate := float(text)) >= 0:
        raise ValueError(text)
    return rate


def _positive(what: str) -> Callable[[float | None, Seen], str | None]:
    return lambda value, seen: None if value is None or value > 0 else what


def _no_text(text: str) -> Any:
    raise ValueError(text)


#: The ``kafka.*`` options that are rows of their own, not client settings passed on.
_NAMED_KAFKA = ("kafka.bootstrap.servers", "kafka.group.id")
_KAFKA = Only("upstream", "kafka")
_KAFKA_ONLY = Only("upstream", "kafka", refused="no value with ackstream.upstream=generator")
_GENERATOR = Only("upstream", "generator")
_KAFKA_CHANNEL = Only("channel", "kafka", refused="no value without ackstream.channel=kafka")
_READER = (
    '"python" or "spark" (Spark\'s Kafka source; a Kafka upstream only; '
    "topology.read_stream(...) chooses it when the connector is there)"
)

#: Every option of the source, in the order :func:`parse` reads them: an option's
#: default and check see the values of the options above it. Options of Spark's Kafka
#: source say how ackstream's compares (``spark``); the options page lists them apart.
OPTIONS: tuple[Option[Any], ...] = (
    Option(
        "ackstream.topology",
        "topology",
        NAME,
        "the topology's name: it names the ids, the channel topics and the default group",
        check=_topology_name,
    ),
    Option(
        "ackstream.upstream",
        "upstream",
        choice(Upstream, blank=True),
        "`kafka`, or `generator` for the built-in generator (no broker)",
    ),
    Option(
        "ackstream.channel",
        "channel",
        Reader(
            str, "a name", lambda text: "kafka" if text.lower() == "kafka" else text, blank=True
        ),
        "the local channel's folder, or `kafka` for the Kafka channel (`<topology>.acks` and "
        "`<topology>.done` on the source's brokers)",
        default=lambda seen: default_channel_dir(seen["topology"]),
        check=lambda channel, seen: (
            "a local directory path with ackstream.upstream=generator "
            "(the Kafka channel lives on the upstream's brokers)"
            if channel == "kafka" and seen["upstream"] != "kafka"
            else None
        ),
        shown_default="`<tmp>/ackstream/<topology>/channel`",
        key=lambda channel: channel if channel == "kafka" else os.path.abspath(channel),
    ),
    Option(
        "ackstream.channelShared",
        "channel_shared",
        FLAG,
        "`true` declares the local channel's folder a file system every host mounts at the "
        "same path; without it a local channel on a cluster is refused",
        check=lambda shared, seen: (
            "no value with ackstream.channel=kafka (it declares a local channel folder "
            "shared between hosts)"
            if shared and seen["channel"] == "kafka"
            else None
        ),
    ),
    Option(
        "ackstream.channelReplication",
        "channel_replication",
        whole(1),
        "replication factor of the Kafka channel's topics",
        only=_KAFKA_CHANNEL,
        shown_default="the broker's",
    ),
    Option(
        "ackstream.channelRetention",
        "channel_retention_ms",
        DURATION,
        "retention of the Kafka channel's topics, a duration",
        check=_positive("a positive value"),
        only=_KAFKA_CHANNEL,
        shown_default="the broker's",
    ),
    Option(
        "ackstream.stateDir",
        "state_dir_option",
        NAME,
        "where the source keeps the records in flight behind each offset, on the driver; a "
        "lost folder costs replays, not records",
        shown_default="`<channel>/source_state`, with the Kafka channel "
        "`<tmp>/ackstream/<topology>/source_state`",
    ),
    Option(
        "ackstream.tracking",
        "tracking",
        FLAG,
        "`false` reads plain rows and commits what Spark has run",
    ),
    Option(
        "ackstream.messageTimeout",
        "message_timeout_ms",
        DURATION,
        "Storm's message timeout: a record whose tree is not complete by then is failed "
        "and replayed",
        check=_positive("a positive duration"),
    ),
    Option(
        "ackstream.sourceTimeout",
        "source_timeout_ms",
        DURATION,
        "a record that got no outcome at all (its acks were never written) is replayed after "
        "this, once the acker has caught up past its deadline",
        default=lambda seen: 2 * seen["message_timeout_ms"],
        check=lambda timeout, seen: (
            None
            if timeout > seen["message_timeout_ms"]
            else "a duration longer than ackstream.messageTimeout "
            f"({seen['message_timeout_ms']} ms)"
        ),
        shown_default="twice the message timeout",
    ),
    Option(
        "ackstream.idleBatchInterval",
        "idle_batch_ms",
        DURATION,
        "while records are in flight, a batch runs this often even when nothing new "
        "arrived, so a time window closes on time",
        check=_positive("a positive duration"),
        shown_default="none; a topology with a processing-time window sets its slide",
    ),
    Option(
        "ackstream.retryInitialDelay",
        "retry.initial_delay_ms",
        DURATION,
        "the wait before the first replay",
    ),
    Option(
        "ackstream.retryDelayPeriod",
        "retry.delay_period_ms",
        DURATION,
        "replay n >= 2 waits this times 2^(n-1)",
        shown_default="the initial delay",
    ),
    Option(
        "ackstream.retryMaxDelay",
        "retry.max_delay_ms",
        DURATION,
        "the longest wait before a replay",
    ),
    Option(
        "ackstream.maxRetries",
        "retry.max_retries",
        whole(0),
        "replays before a record is dead-lettered",
    ),
    Option(
        "ackstream.maxPending",
        "admission.max_pending",
        whole(1),
        "Storm's max spout pending, over every record not done: no new offsets while this "
        "many are in flight, waiting for a replay or for their dead letter. Storm frees a "
        "tuple's slot at its fail; here a failed record keeps its slot until it is acked "
        "or dead-lettered, so an outage that fails every record holds at most this many",
        shown_default="unlimited",
    ),
    Option(
        "ackstream.maxValueBytes",
        "admission.max_value_bytes",
        Reader(int, 'a whole number >= 1, or "none" for no limit', _value_bytes),
        "a larger value is rejected, dead-lettered without its value, never given to a "
        "stage: the Python reader holds it back as it reads; with Spark's reader the job "
        "that reads it fails, the batch fails as a whole and is replayed apart, and the "
        "Python reader then holds it back; `none`: no limit. Untracked there is no limit",
    ),
    Option(
        "ackstream.recordReader",
        "record_reader",
        choice(RecordReader, _READER, blank=True),
        "who reads a batch's new records: `spark`, Spark's own Kafka source inside the "
        "topology's batch (the records stay in the JVM; the source's Python tasks read only "
        "replays), or `python`, the source's own read tasks; `spark` needs a topology to "
        "read the stream (`topology.read_stream`)",
        check=lambda reader, seen: (
            _READER if reader == "spark" and seen["upstream"] != "kafka" else None
        ),
        shown_default="`spark` from `topology.read_stream` when the session has Spark's "
        "Kafka connector, else `python`",
    ),
    Option(
        "ackstream.deadLetterTopic",
        "dead_letter_topic",
        NAME,
        "the dead-letter topic; without one, dead letters are Parquet files in "
        "`<channel>/dead_letters`",
        default=lambda seen: f"{seen['topology']}.dead" if seen["channel"] == "kafka" else None,
        only=Only(
            "upstream",
            "kafka",
            refused="no value with ackstream.upstream=generator (its dead letters go "
            "to <channel>/dead_letters as Parquet)",
            otherwise=None,
        ),
        shown_default="`<topology>.dead` with the Kafka channel, else none",
    ),
    Option(
        "ackstream.generator.count",
        "generator.count",
        whole(0),
        "the generator's number of records",
        only=_GENERATOR,
        shown_default="unbounded",
    ),
    Option(
        "ackstream.generator.rate",
        "generator.rate",
        Reader(
            float,
            "records per second, a number >= 0 (0: as fast as possible)",
            _rate,
            lambda rate: f"{rate:g}",
        ),
        "the generator's records per second over all partitions; 0 is as fast as it can",
        only=_GENERATOR,
    ),
    Option(
        "ackstream.generator.partitions",
        "generator.partitions",
        whole(1),
        "the generator's partitions",
        only=_GENERATOR,
    ),
    Option(
        "kafka.bootstrap.servers",
        "kafka.bootstrap_servers",
        TEXT,
        "the brokers, `host:port[,host:port...]`",
        check=lambda servers, seen: (
            None if servers else ("host:port[,host:port...] of the Kafka brokers (required)")
        ),
        only=_KAFKA,
        shown_default="(required)",
        spark="same",
    ),
    Option(
        "assign",
        "kafka.assign",
        Reader(
            tuple[tuple[str, int], ...],
            'JSON {"topic": [partition, ...]} naming one or more partitions',
            _assign,
        ),
        'JSON `{"topic": [0, 1]}`: those partitions only',
        shown_default="",
        conflicts=_beside("subscribe"),
        only=_KAFKA_ONLY,
        spark="same",
    ),
    Option(
        "subscribePattern",
        "kafka.subscribe_pattern",
        Reader(str, "a regular expression of topic names", _pattern),
        "a regular expression matched against whole topic names; topics created later "
        "that match are read from their start",
        conflicts=_beside("subscribe", "assign"),
        only=_KAFKA_ONLY,
        spark="same; the expression is Python's, not Java's",
    ),
    Option(
        "subscribe",
        "kafka.topics",
        Reader(tuple[str, ...], "topics", _topics),
        "comma-separated topics; one of `subscribe`, `assign`, `subscribePattern` is required",
        default=lambda seen: tuple(sorted({t for t, _ in seen["kafka.assign"]})),
        check=_read_something,
        only=Only("upstream", "kafka", otherwise=("generator",)),
        shown_default="",
        spark="same",
    ),
    Option(
        "startingOffsets",
        "kafka.starting_offsets",
        Reader(str, _STARTS, _start),
        "where a new query starts: `committed` (the group's committed offset, else the "
        'earliest), `earliest`, `latest`, or JSON `{"topic": {"0": offset}}` with -2 for '
        "earliest and -1 for latest; an offset before a partition's earliest or past its end "
        "stops the new query at its first planning, naming the partition and its range, "
        "before anything is committed",
        check=_only_topics_read(-2, lambda topics: f"{_STARTS}, naming only topics read {topics}"),
        only=_KAFKA,
        spark="**differs**: Spark's default is `latest`, and it has no `committed`",
    ),
    Option(
        "startingTimestamp",
        "kafka.starting_timestamp",
        whole(0),
        "epoch ms: every partition starts at its first record at or after it; wins over "
        "`startingOffsets`",
        only=_KAFKA_ONLY,
        spark="same",
    ),
    Option(
        "startingOffsetsByTimestamp",
        "kafka.starting_timestamps",
        Reader(str, _BY_TIME, _by_time),
        'JSON `{"topic": {"0": ms}}`: the same for the partitions named; the others start '
        "as `startingOffsets` says",
        check=_only_topics_read(0, lambda topics: _BY_TIME),
        only=_KAFKA_ONLY,
        spark="same",
    ),
    Option(
        "startingOffsetsByTimestampStrategy",
        "kafka.starting_timestamp_strategy",
        choice(
            TimestampStrategy,
            allowed='"error" (fail when a partition has no record that late) or "latest"',
        ),
        "a partition with no record that late: `error` stops the start (naming the "
        "partition and its range), `latest` starts at its end",
        only=_KAFKA_ONLY,
        spark="same",
    ),
    Option(
        "maxOffsetsPerTrigger",
        "admission.max_offsets_per_trigger",
        whole(1),
        "at most this many new offsets per batch, split over partitions by their lag",
        shown_default="none",
        spark="same; replays come on top",
    ),
    Option(
        "minPartitions",
        "admission.min_partitions",
        whole(1),
        "at least this many read tasks per batch: big ranges are cut",
        shown_default="none",
        spark="same",
    ),
    Option(
        "maxRecordsPerPartition",
        "admission.max_records_per_partition",
        whole(1),
        "at most this many records per read task: bigger ranges, and the replays of a "
        "partition, are cut",
        shown_default="none",
        spark="same (Spark 4's); replays are cut too",
    ),
    Option(
        "includeHeaders",
        "kafka.include_headers",
        FLAG,
        "adds a `headers` column, `array<struct<key: string, value: binary>>`",
        spark="same",
    ),
    Option(
        "failOnDataLoss",
        "kafka.fail_on_data_loss",
        FLAG,
        "stop when offsets not yet read were deleted by retention",
        spark="**differs**: a topic read that is deleted stops the query either way; "
        "Spark's, with `subscribePattern` and `false`, goes on without it",
    ),
    Option(
        "kafka.group.id",
        "kafka.group_id",
        TEXT,
        "the consumer group that acked offsets are committed to",
        default=lambda seen: f"ackstream-{seen['topology']}",
        check=lambda group, seen: (
            None
            if group.strip()
            else (
                "a consumer group id, not empty (leave the option out for "
                f"ackstream-{seen['topology']})"
            )
        ),
        only=_KAFKA,
        shown_default="`ackstream-<topology>`",
        spark="**differs**: Spark commits to no group, and makes up a group id per query",
    ),
    Option(
        "kafka.*",
        "kafka.options",
        Reader(tuple[tuple[str, str], ...], "other kafka.* settings", _no_text),
        "any other client setting, passed to kafka-python: `kafka.request.timeout.ms` "
        "becomes `request_timeout_ms`; with Spark's reader, its executors' consumers read "
        "records already written, so unless given they wait at most 10 ms for a fetch "
        "(`kafka.fetch.max.wait.ms`) and take up to 100,000 records a poll "
        "(`kafka.max.poll.records`)",
        default=lambda seen: tuple(
            sorted(
                (key[len("kafka.") :], value)
                for key, value in seen.given.items()
                if key.startswith("kafka.") and key not in _NAMED_KAFKA
            )
        ),
        only=_KAFKA,
        shown_default="",
        spark="Java-only settings are translated where the meaning is the same "
        "(`kafka.sasl.jaas.config` of a PLAIN or SCRAM login) and otherwise refused, naming "
        "the setting to use (`kafka.ssl.truststore.location`: use `kafka.ssl.cafile`, a PEM "
        "file)",
    ),
)

#: Options of Spark's Kafka source that ackstream refuses by name, and why.
REFUSED: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("endingOffsets", "endingOffsetsByTimestamp", "endingTimestamp"),
        "they bound a batch query, and the `ackstream` source is a stream only",
    ),
    (("minOffsetsPerTrigger", "maxTriggerDelay"), "not implemented yet"),
    (("groupIdPrefix",), "ackstream commits to one named group, `kafka.group.id`"),
    (
        ("kafkaConsumer.pollTimeoutMs", "fetchOffset.numRetries", "fetchOffset.retryIntervalMs"),
        "settings of Spark's own consumer; ackstream's reads are bounded by the `kafka.*` "
        "client settings and ride out a broker outage of up to two minutes",
    ),
)

#: Columns of Spark's Kafka source that users sometimes give as options.
_COLUMNS = {
    "timestamptype": "no value: timestampType is a column of the source (0: create time, "
    "1: log append time), as in Spark's Kafka source, not an option",
    "headers": "no value: to get the headers column, set includeHeaders=true",
}

_GROUPS = {
    "": SourceConfig,
    "kafka": KafkaOptions,
    "admission": Admission,
    "generator": GeneratorOptions,
    "retry": RetryPolicy,
}
#: The config fields' own defaults, by the ``Option.field`` that names them.
DEFAULTS: dict[str, Any] = {
    f"{group}.{f.name}".lstrip("."): f.default
    for group, kind in _GROUPS.items()
    for f in fields(kind)
    if f.default is not MISSING
}
_BY_NAME = {option.name.lower(): option for option in OPTIONS if option.name != "kafka.*"}
_REFUSED = {name.lower(): name for names, _ in REFUSED for name in names}


def option_names() -> dict[str, tuple[str, ...]]:
    """The options :func:`parse` knows, as users write them: ``ackstream`` (its own),
    ``spark`` (options of Spark's Kafka source it takes) and ``refused`` (options of
    Spark's Kafka source it refuses by name)."""
    named = [option.name for option in _BY_NAME.values()]
    return {
        "ackstream": tuple(n for n in named if n.startswith("ackstream.")),
        "spark": tuple(n for n in named if not n.startswith("ackstream.")),
        "refused": tuple(_REFUSED.values()),
    }


def same_value(option: str, given: object, wanted: object) -> bool:
    """Whether ``given`` and ``wanted`` say the same value of ``option`` (named in any
    case), read as its row of :data:`OPTIONS` reads it: ``30s`` and ``30000`` are one
    message timeout, ``KAFKA`` and ``kafka`` one channel. An option outside the table
    compares as given.

    >>> same_value("ackstream.tracking", "TRUE", True), same_value("x.y", "a", "A")
    (True, False)
    """
    row = _BY_NAME.get(option.lower())
    return given == wanted if row is None else row.same(given, wanted)


def parse(options: Mapping[str, str]) -> SourceConfig:
    """Parse and validate the options of one ``readStream.format("ackstream")``."""
    for key, value in options.items():
        _check_name(str(key), str(value))
    seen = Seen({str(k).lower(): str(v) for k, v in options.items()}, DEFAULTS)
    for option in OPTIONS:
        seen.values[option.field] = option.value(seen)
    groups: dict[str, dict[str, Any]] = {group: {} for group in _GROUPS}
    for path, value in seen.values.items():
        group, _, name = path.rpartition(".")
        groups[group][name] = value
    try:
        retry = RetryPolicy(**groups.pop("retry"))
    except OptionError as problem:  # the value as the user wrote it
        raise OptionError(
            problem.option, seen.given.get(problem.option.lower()), problem.allowed
        ) from None
    return SourceConfig(
        **groups[""],
        retry=retry,
        kafka=KafkaOptions(**groups["kafka"]),
        admission=Admission(**groups["admission"]),
        generator=GeneratorOptions(**groups["generator"]),
    )


def _check_name(given: str, value: str) -> None:
    """Refuse an option ackstream does not take, named as the user wrote it, with the
    nearest name it does take."""
    key = given.lower()
    if key in _BY_NAME or key.startswith("kafka."):
        return
    if key in _REFUSED:
        raise OptionError(
            given,
            value,
            "no value: ackstream does not support this option of Spark's Kafka source yet "
            "(see the options page of the docs)",
        )
    if key in _COLUMNS:
        raise OptionError(given, value, _COLUMNS[key])
    raise OptionError(given, value, did_you_mean(given, [o.name for o in _BY_NAME.values()]))
