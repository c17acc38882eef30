"""Options of the ``ackstream`` source, parsed once into a frozen :class:`SourceConfig`.

Spark hands a data source its options as case-insensitive strings. They are parsed
here on the driver when the DataFrame is created (``load()``), so a bad value fails
before the query starts, with an :class:`~ackstream.errors.OptionError` naming the
option, the value and what is allowed. Unknown ``ackstream.*`` keys are rejected;
nothing falls back silently to a default. Kafka options mirror Spark's Kafka source.

>>> cfg = parse({"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "a,b",
...              "ackstream.messageTimeout": "2 min"})
>>> cfg.kafka.topics, cfg.message_timeout_ms
(('a', 'b'), 120000)
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, fields

import numpy as np

from ackstream.errors import OptionError

__all__ = [
    "RECORD_READERS",
    "RetryPolicy",
    "SourceConfig",
    "default_channel_dir",
    "default_tick_ms",
    "option_names",
    "parse",
    "parse_duration_ms",
]

_UNITS_MS = {
    "ms": 1,
    "s": 1000,
    "sec": 1000,
    "second": 1000,
    "seconds": 1000,
    "secs": 1000,
    "m": 60_000,
    "min": 60_000,
    "mins": 60_000,
    "minute": 60_000,
    "minutes": 60_000,
    "h": 3_600_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$")
_DURATION_ALLOWED = 'a duration such as "500ms", "30s", "2 min" or plain milliseconds'

# Our own options, lower-cased (Spark lower-cases keys) -> the name users write.
_OURS = {
    k.lower(): k
    for k in (
        "ackstream.topology",
        "ackstream.upstream",
        "ackstream.channel",
        "ackstream.channelShared",
        "ackstream.channelReplication",
        "ackstream.channelRetention",
        "ackstream.stateDir",
        "ackstream.messageTimeout",
        "ackstream.sourceTimeout",
        "ackstream.idleBatchInterval",
        "ackstream.maxPending",
        "ackstream.retryInitialDelay",
        "ackstream.retryMaxDelay",
        "ackstream.retryDelayPeriod",
        "ackstream.maxRetries",
        "ackstream.deadLetterTopic",
        "ackstream.tracking",
        "ackstream.maxValueBytes",
        "ackstream.recordReader",
        "ackstream.generator.count",
        "ackstream.generator.rate",
        "ackstream.generator.partitions",
    )
}
_NAMED_STARTS = ("earliest", "latest", "committed")
#: Values of ``ackstream.recordReader``.
RECORD_READERS = ("python", "spark")
#: Options of Spark's Kafka source that ackstream takes (besides ``kafka.*``).
_SPARK_KAFKA = {
    k.lower(): k
    for k in (
        "subscribe",
        "assign",
        "subscribePattern",
        "startingOffsets",
        "startingOffsetsByTimestamp",
        "startingTimestamp",
        "startingOffsetsByTimestampStrategy",
        "maxOffsetsPerTrigger",
        "minPartitions",
        "maxRecordsPerPartition",
        "includeHeaders",
        "failOnDataLoss",
    )
}
#: Of those, the ones that only mean something to a Kafka upstream.
_KAFKA_ONLY = (
    "assign",
    "subscribePattern",
    "startingTimestamp",
    "startingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
)
#: Options of Spark's Kafka source that ackstream does not take yet (the ending ones
#: bound a batch query; ackstream's source is a stream only).
_NOT_YET = {
    k.lower(): k
    for k in (
        "endingOffsets",
        "endingOffsetsByTimestamp",
        "endingTimestamp",
        "minOffsetsPerTrigger",
        "maxTriggerDelay",
        "groupIdPrefix",
        "kafkaConsumer.pollTimeoutMs",
        "fetchOffset.numRetries",
        "fetchOffset.retryIntervalMs",
    )
}

#: Columns of Spark's Kafka source that users sometimes give as options.
_COLUMNS = {
    "timestamptype": "no value: timestampType is a column of the source (0: create time, "
    "1: log append time), as in Spark's Kafka source, not an option",
    "headers": "no value: to get the headers column, set includeHeaders=true",
}


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

    def __post_init__(self):
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

    def delays_ms(self, attempts) -> np.ndarray:
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
    starting_timestamp_strategy: str = "error"
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
    max_pending: int | None = None  #: roots in flight at most (None: no limit)
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

    upstream: str = "kafka"  #: "kafka" or "generator"
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
    record_reader: str = "python"

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


def option_names() -> dict[str, tuple[str, ...]]:
    """The options :func:`parse` knows, as users write them: ``ackstream`` (its own),
    ``spark`` (options of Spark's Kafka source it takes, besides ``kafka.*``) and
    ``refused`` (options of Spark's Kafka source it refuses by name). The options page
    of the docs lists each of them; a test holds the two together."""
    return {
        "ackstream": tuple(_OURS.values()),
        "spark": tuple(_SPARK_KAFKA.values()),
        "refused": tuple(_NOT_YET.values()),
    }


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


def parse_duration_ms(option: str, value: str) -> int:
    """``"30s"``, ``"500ms"``, ``"2 min"`` or ``"1500"`` (ms) -> milliseconds."""
    match = _DURATION.match(str(value).lower())
    if not match or match.group(2) not in ("", *_UNITS_MS):
        raise OptionError(option, value, _DURATION_ALLOWED)
    ms = float(match.group(1)) * _UNITS_MS.get(match.group(2), 1)
    if ms != int(ms):
        raise OptionError(option, value, _DURATION_ALLOWED + " (whole milliseconds)")
    return int(ms)


def parse(options: Mapping[str, str]) -> SourceConfig:
    """Parse and validate the options of one ``readStream.format("ackstream")``."""
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    for key, value in options.items():
        _check_name(str(key), str(value))

    def ours(name):
        return opts.get(name.lower())

    kw: dict = {}
    topology = ours("ackstream.topology") or "ackstream"
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", topology) or topology in (".", ".."):
        raise OptionError(
            "ackstream.topology",
            topology,
            "1 to 200 letters, digits, '.', '_' or '-', but not '.' or '..' (it names the "
            "channel's folder and Kafka topics)",
        )
    kw["topology"] = topology
    upstream = (ours("ackstream.upstream") or "kafka").lower()
    if upstream not in ("kafka", "generator"):
        raise OptionError("ackstream.upstream", upstream, '"kafka" or "generator"')
    kw["upstream"] = upstream

    channel = ours("ackstream.channel") or default_channel_dir(topology)
    if channel.lower() == "kafka":
        if upstream != "kafka":
            raise OptionError(
                "ackstream.channel",
                channel,
                "a local directory path with ackstream.upstream=generator "
                "(the Kafka channel lives on the upstream's brokers)",
            )
        channel = "kafka"
    kw["channel"] = channel
    shared = ours("ackstream.channelShared")
    kw["channel_shared"] = _bool("ackstream.channelShared", shared, False)
    if kw["channel_shared"] and channel == "kafka":
        raise OptionError(
            "ackstream.channelShared",
            shared,
            "no value with ackstream.channel=kafka (it declares a local channel folder "
            "shared between hosts)",
        )
    for name, field in (
        ("ackstream.channelReplication", "channel_replication"),
        ("ackstream.channelRetention", "channel_retention_ms"),
    ):
        if ours(name) is None:
            continue
        if channel != "kafka":
            raise OptionError(name, ours(name), "no value without ackstream.channel=kafka")
        kw[field] = (
            _int(name, ours(name), 1)
            if field == "channel_replication"
            else parse_duration_ms(name, ours(name))
        )
        if kw[field] < 1:
            raise OptionError(name, ours(name), "a positive value")
    kw["state_dir_option"] = ours("ackstream.stateDir") or ""
    kw["tracking"] = _bool("ackstream.tracking", ours("ackstream.tracking"), True)

    if ours("ackstream.messageTimeout") is not None:
        kw["message_timeout_ms"] = parse_duration_ms(
            "ackstream.messageTimeout", ours("ackstream.messageTimeout")
        )
    if kw.get("message_timeout_ms", 1) <= 0:
        raise OptionError(
            "ackstream.messageTimeout", ours("ackstream.messageTimeout"), "a positive duration"
        )
    timeout = kw.get("message_timeout_ms", SourceConfig.message_timeout_ms)
    kw["source_timeout_ms"] = 2 * timeout
    if ours("ackstream.sourceTimeout") is not None:
        kw["source_timeout_ms"] = parse_duration_ms(
            "ackstream.sourceTimeout", ours("ackstream.sourceTimeout")
        )
        if kw["source_timeout_ms"] <= timeout:
            raise OptionError(
                "ackstream.sourceTimeout",
                ours("ackstream.sourceTimeout"),
                f"a duration longer than ackstream.messageTimeout ({timeout} ms)",
            )
    idle = ours("ackstream.idleBatchInterval")
    if idle is not None:
        kw["idle_batch_ms"] = parse_duration_ms("ackstream.idleBatchInterval", idle)
        if kw["idle_batch_ms"] <= 0:
            raise OptionError("ackstream.idleBatchInterval", idle, "a positive duration")
    retry = {}
    for name, field in (
        ("ackstream.retryInitialDelay", "initial_delay_ms"),
        ("ackstream.retryMaxDelay", "max_delay_ms"),
        ("ackstream.retryDelayPeriod", "delay_period_ms"),
    ):
        if ours(name) is not None:
            retry[field] = parse_duration_ms(name, ours(name))

    kw["max_pending"] = _int("ackstream.maxPending", ours("ackstream.maxPending"), 1)
    if ours("ackstream.maxValueBytes") is not None:
        kw["max_value_bytes"] = _max_value_bytes(ours("ackstream.maxValueBytes"))
    retries = _int("ackstream.maxRetries", ours("ackstream.maxRetries"), 0)
    if retries is not None:
        retry["max_retries"] = retries
    try:
        kw["retry"] = RetryPolicy(**retry)
    except OptionError as problem:  # the value as the user wrote it
        raise OptionError(problem.option, ours(problem.option), problem.allowed) from None
    kw["max_offsets_per_trigger"] = _int(
        "maxOffsetsPerTrigger", opts.get("maxoffsetspertrigger"), 1
    )
    kw["fail_on_data_loss"] = _bool("failOnDataLoss", opts.get("failondataloss"), True)
    kw["min_partitions"] = _int("minPartitions", opts.get("minpartitions"), 1)
    kw["max_records_per_partition"] = _int(
        "maxRecordsPerPartition", opts.get("maxrecordsperpartition"), 1
    )
    kw["include_headers"] = _bool("includeHeaders", opts.get("includeheaders"), False)
    reader = (ours("ackstream.recordReader") or "python").strip().lower()
    if reader not in RECORD_READERS or (reader == "spark" and upstream != "kafka"):
        raise OptionError(
            "ackstream.recordReader",
            ours("ackstream.recordReader"),
            '"python" or "spark" (Spark\'s Kafka source; a Kafka upstream only; '
            "topology.read_stream(...) chooses it when the connector is there)",
        )
    kw["record_reader"] = reader
    kw["dead_letter_topic"] = ours("ackstream.deadLetterTopic") or (
        f"{topology}.dead" if channel == "kafka" else None
    )

    if upstream == "generator":
        kw["generator_count"] = _int(
            "ackstream.generator.count", ours("ackstream.generator.count"), 0
        )
        parts = _int("ackstream.generator.partitions", ours("ackstream.generator.partitions"), 1)
        kw["generator_partitions"] = parts or GeneratorOptions.partitions
        rate = ours("ackstream.generator.rate")
        if rate is not None:
            try:
                kw["generator_rate"] = float(rate)
            except ValueError:
                kw["generator_rate"] = -1.0
            if not kw["generator_rate"] >= 0:
                raise OptionError(
                    "ackstream.generator.rate",
                    rate,
                    "records per second, a number >= 0 (0: as fast as possible)",
                )
        kw["topics"] = ("generator",)
        for name in _KAFKA_ONLY:
            if name.lower() in opts:
                raise OptionError(
                    name, opts[name.lower()], "no value with ackstream.upstream=generator"
                )
        if kw["dead_letter_topic"]:
            raise OptionError(
                "ackstream.deadLetterTopic",
                kw["dead_letter_topic"],
                "no value with ackstream.upstream=generator (its dead letters go "
                "to <channel>/dead_letters as Parquet)",
            )
    else:
        bootstrap = opts.get("kafka.bootstrap.servers")
        if not bootstrap:
            raise OptionError(
                "kafka.bootstrap.servers",
                bootstrap,
                "host:port[,host:port...] of the Kafka brokers (required)",
            )
        kw["bootstrap_servers"] = bootstrap
        kw.update(_what_to_read(opts))
        named = set(kw.get("topics", ())) | {t for t, _ in kw.get("assign", ())}
        kw["starting_offsets"] = _starting(opts.get("startingoffsets"), named, kw)
        kw.update(_starting_by_time(opts, named, kw))
        kw["group_id"] = _group_id(opts.get("kafka.group.id"), topology)
        kw["kafka_options"] = tuple(
            sorted(
                (k[len("kafka.") :], v)
                for k, v in opts.items()
                if k.startswith("kafka.") and k not in ("kafka.bootstrap.servers", "kafka.group.id")
            )
        )
    return _grouped(kw)


def _grouped(kw: dict) -> SourceConfig:
    """The options :func:`parse` gathered by name, in their groups."""
    kafka = {f.name: kw.pop(f.name) for f in fields(KafkaOptions) if f.name in kw}
    if "kafka_options" in kw:
        kafka["options"] = kw.pop("kafka_options")
    admission = {f.name: kw.pop(f.name) for f in fields(Admission) if f.name in kw}
    generator = {
        f.name: kw.pop(f"generator_{f.name}")
        for f in fields(GeneratorOptions)
        if f"generator_{f.name}" in kw
    }
    return SourceConfig(
        **kw,
        kafka=KafkaOptions(**kafka),
        admission=Admission(**admission),
        generator=GeneratorOptions(**generator),
    )


def _check_name(given: str, value: str) -> None:
    """Refuse an option ackstream does not take, named as the user wrote it, with the
    nearest name it does take."""
    key = given.lower()
    if key in _OURS or key in _SPARK_KAFKA or key.startswith("kafka."):
        return
    if key in _NOT_YET:
        raise OptionError(
            given,
            value,
            "no value: ackstream does not support this option of Spark's Kafka source yet "
            "(see the options page of the docs)",
        )
    if key in _COLUMNS:
        raise OptionError(given, value, _COLUMNS[key])
    known = {k.lower(): k for k in (*_OURS.values(), *_SPARK_KAFKA.values())}
    near = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    allowed = (
        f"a known option: did you mean {known[near[0]]!r}?"
        if near
        else f"a known option: one of {', '.join(sorted(known.values()))}, or kafka.*"
    )
    raise OptionError(given, value, allowed)


def _group_id(value: str | None, topology: str) -> str:
    """The consumer group acked offsets are committed to (Spark's source commits none)."""
    if value is None:
        return f"ackstream-{topology}"
    if not value.strip():
        raise OptionError(
            "kafka.group.id",
            value,
            f"a consumer group id, not empty (leave the option out for ackstream-{topology})",
        )
    return value


def _int(option: str, value: str | None, minimum: int) -> int | None:
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        number = None
    if number is None or number < minimum:
        raise OptionError(option, value, f"a whole number >= {minimum}")
    return number


def _max_value_bytes(value: str) -> int | None:
    if value.strip().lower() == "none":
        return None
    try:
        return _int("ackstream.maxValueBytes", value, 1)
    except OptionError:
        raise OptionError(
            "ackstream.maxValueBytes", value, 'a whole number >= 1, or "none" for no limit'
        ) from None


def _bool(option: str, value: str | None, default: bool) -> bool:
    if value is None:
        return default
    if value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise OptionError(option, value, '"true" or "false"')


def _what_to_read(opts: dict) -> dict:
    """``subscribe``, ``assign`` or ``subscribePattern``: exactly one, as Spark's."""
    given = [name for name in ("subscribe", "assign", "subscribePattern") if name.lower() in opts]
    one_of = (
        'subscribe (topics), assign (JSON {"topic": [0, 1]}) or subscribePattern '
        "(a regex of topic names)"
    )
    if not given:
        raise OptionError("subscribe", None, f"one of {one_of} (required)")
    if len(given) > 1:
        raise OptionError(
            given[1], opts[given[1].lower()], f"no value beside {given[0]}: exactly one of {one_of}"
        )
    value = opts[given[0].lower()]
    if given[0] == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise OptionError("subscribe", value, "a comma-separated list of one or more topics")
        twice = sorted({t for t in topics if topics.count(t) > 1})
        if twice:
            raise OptionError(
                "subscribe",
                value,
                f"a comma-separated list of distinct topics ({', '.join(map(repr, twice))} twice)",
            )
        return {"topics": topics}
    if given[0] == "assign":
        allowed = 'JSON {"topic": [partition, ...]} naming one or more partitions'
        try:
            raw = json.loads(value)
            pairs = sorted({(str(t), int(p)) for t, parts in raw.items() for p in parts})
        except (ValueError, AttributeError, TypeError):
            raise OptionError("assign", value, allowed) from None
        if not pairs or any(p < 0 for _, p in pairs):
            raise OptionError("assign", value, allowed)
        return {"assign": tuple(pairs), "topics": tuple(sorted({t for t, _ in pairs}))}
    try:
        re.compile(value)
    except re.error as problem:
        raise OptionError(
            "subscribePattern", value, f"a Python regular expression ({problem})"
        ) from None
    if not value:
        raise OptionError("subscribePattern", value, "a regular expression of topic names")
    return {"subscribe_pattern": value}


def _starting(value: str | None, topics: set, kw: dict) -> str:
    allowed = (
        '"earliest", "latest", "committed", or JSON {"topic": {"0": offset}} '
        "with -2 = earliest and -1 = latest"
    )
    if value is None:
        return "committed"
    if value.strip().lower() in _NAMED_STARTS:
        return value.strip().lower()
    try:
        raw = json.loads(value)
        parsed = {t: {int(p): int(o) for p, o in parts.items()} for t, parts in raw.items()}
    except (ValueError, AttributeError, TypeError):
        raise OptionError("startingOffsets", value, allowed) from None
    if any(o < -2 for parts in parsed.values() for o in parts.values()) or (
        not kw.get("subscribe_pattern") and set(parsed) - topics
    ):
        raise OptionError(
            "startingOffsets", value, allowed + f", naming only topics read {sorted(topics)}"
        )
    return json.dumps(raw, sort_keys=True)


def _starting_by_time(opts: dict, topics: set, kw: dict) -> dict:
    """``startingTimestamp``, ``startingOffsetsByTimestamp`` and their strategy."""
    out: dict = {}
    single = opts.get("startingtimestamp")
    if single is not None:
        out["starting_timestamp"] = _int("startingTimestamp", single, 0)
    by_partition = opts.get("startingoffsetsbytimestamp")
    if by_partition is not None:
        allowed = 'JSON {"topic": {"0": epoch ms}} naming only topics read'
        try:
            raw = json.loads(by_partition)
            parsed = {t: {int(p): int(ms) for p, ms in parts.items()} for t, parts in raw.items()}
        except (ValueError, AttributeError, TypeError):
            raise OptionError("startingOffsetsByTimestamp", by_partition, allowed) from None
        if any(ms < 0 for parts in parsed.values() for ms in parts.values()) or (
            not kw.get("subscribe_pattern") and set(parsed) - topics
        ):
            raise OptionError("startingOffsetsByTimestamp", by_partition, allowed)
        out["starting_timestamps"] = json.dumps(
            {t: {str(p): ms for p, ms in parts.items()} for t, parts in parsed.items()},
            sort_keys=True,
        )
    strategy = opts.get("startingoffsetsbytimestampstrategy")
    if strategy is not None:
        if strategy.strip().lower() not in ("error", "latest"):
            raise OptionError(
                "startingOffsetsByTimestampStrategy",
                strategy,
                '"error" (fail when a partition has no record that late) or "latest"',
            )
        out["starting_timestamp_strategy"] = strategy.strip().lower()
    return out
