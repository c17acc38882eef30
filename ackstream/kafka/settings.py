"""``kafka.*`` options of the source as kafka-python client settings.

Spark's Kafka source passes ``kafka.*`` to the Java client; ackstream passes them to
kafka-python, whose names are the same with underscores for dots. Settings that
only the Java client has are translated where the meaning is the same (the JAAS
config of SASL PLAIN and SCRAM) and refused otherwise, naming what kafka-python
takes instead; a refused secret is never shown.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

import javaproperties

from ackstream.config.source import SourceConfig
from ackstream.errors import OptionError

__all__ = [
    "OUTAGE_LIMIT_S",
    "ClientOptions",
    "client_options",
    "client_settings",
    "consumer_settings",
    "jvm_client_settings",
    "kafka_options_of",
    "properties_file_options",
]

#: Seconds a query's Kafka clients wait for brokers they cannot reach before failing:
#: a broker restarted from its log, a stall or a leader election take less; a cluster
#: gone for good, more. Spark's Kafka source waits as long (``spark.network.timeout``).
#: Every client starts with it as ``bootstrap_timeout_ms`` (kafka-python's 30 s is
#: shorter than a broker's restart after a SIGKILL, which once ended a query's read
#: task); ``kafka.bootstrap.timeout.ms`` overrides it.
OUTAGE_LIMIT_S = 120.0
_RIDE_OUT = {"bootstrap_timeout_ms": int(OUTAGE_LIMIT_S * 1000)}

#: ``kafka.*`` options as a client's settings are made from: a mapping (a source's whole
#: options may be given) or ``(key, value)`` pairs; None, no options.
ClientOptions = Mapping[str, object] | Iterable[tuple[str, object]] | None

#: Java client settings with no kafka-python twin -> what to give instead.
_JAVA_ONLY = {
    "ssl.truststore.location": "kafka.ssl.cafile (kafka-python reads PEM files, not JKS)",
    "ssl.truststore.password": "nothing: kafka.ssl.cafile is a PEM file with no password",
    "ssl.truststore.type": "nothing: kafka.ssl.cafile is a PEM file",
    "ssl.keystore.location": "kafka.ssl.certfile and kafka.ssl.keyfile (PEM files)",
    "ssl.keystore.password": "kafka.ssl.password (the password of kafka.ssl.keyfile)",
    "ssl.keystore.type": "nothing: kafka.ssl.certfile and kafka.ssl.keyfile are PEM files",
    "ssl.key.password": "kafka.ssl.password",
    "ssl.endpoint.identification.algorithm": "kafka.ssl.check.hostname (true or false)",
    "key.deserializer": "nothing: keys and values are read as bytes",
    "value.deserializer": "nothing: keys and values are read as bytes",
}
#: Consumer settings ackstream decides itself -> why the option is refused.
_DECIDED = {
    "auto.offset.reset": "no value: a new query starts where startingOffsets says "
    "(earliest, latest, or committed: the group's offset, else earliest) and a "
    "restarted one where its checkpoint left off; Spark's Kafka source refuses this "
    "option too",
    "enable.auto.commit": "no value: ackstream commits to the consumer group itself, and "
    "only offsets whose records are acked or dead-lettered (Spark's Kafka source refuses "
    "this option and commits nothing; ackstream does commit)",
    "allow.auto.create.topics": "no value: the source never creates a topic (a subscribed "
    "topic deleted under a running query must stop it, not come back empty)",
}
#: Whole-number settings Kafka's clients take only from 1 up (the others: from 0 up).
_AT_LEAST_ONE = frozenset(
    {"max_poll_records", "max_poll_interval_ms", "max_in_flight_requests_per_connection"}
)
#: Settings Kafka's clients take from a list (case-insensitively, as the Java client).
_CHOICES = {
    "isolation_level": ("read_uncommitted", "read_committed"),
    "security_protocol": ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"),
}
_JAAS_LOGIN = re.compile(r"(Plain|Scram)LoginModule\s+required", re.IGNORECASE)
_JAAS_FIELD = re.compile(r'(username|password)\s*=\s*"([^"]*)"')


def consumer_settings(config: SourceConfig) -> dict[str, Any]:
    """kafka-python settings from the ``kafka.*`` options (``kafka.security.protocol`` ->
    ``security_protocol``); an unknown one is an :class:`OptionError` naming the
    nearest kafka-python setting."""
    from kafka import KafkaConsumer

    defaults = KafkaConsumer.DEFAULT_CONFIG
    if not config.kafka.bootstrap_servers:  # config.parse requires it of a Kafka upstream
        raise OptionError("kafka.bootstrap.servers", None, "host:port of the Kafka brokers")
    settings = {
        "bootstrap_servers": config.kafka.bootstrap_servers.split(","),
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "client_id": f"ackstream-{config.topology}",
        # reading must never create a topic: a subscribed topic deleted mid-run would
        # come back empty, its offsets reset, and the source wait on them silently
        # (kafka-python 3.0 needs kafka.topics.never_create_topics besides)
        "allow_auto_create_topics": False,
        **_RIDE_OUT,
    }
    for key, value in config.kafka.options:
        option = "kafka." + key
        if key == "sasl.jaas.config":
            settings.update(_from_jaas(option, value))
            continue
        if key in _JAVA_ONLY:
            raise OptionError(option, value, _JAVA_ONLY[key])
        if key in _DECIDED:
            raise OptionError(option, value, _DECIDED[key])
        name = key.replace(".", "_")
        if name not in defaults or name == "group_id":
            names = [n.replace("_", ".") for n in defaults if n != "group_id"]
            near = difflib.get_close_matches(key, names, n=1, cutoff=0.7)
            raise OptionError(
                option,
                value,
                "a kafka-python consumer setting (kafka.<setting with dots>, e.g. "
                "kafka.security.protocol)" + (f": did you mean 'kafka.{near[0]}'?" if near else ""),
            )
        settings[name] = _typed(option, name, value, defaults[name])
    return settings


def client_settings(kafka_options: ClientOptions) -> dict[str, Any]:
    """The settings every Kafka client ackstream makes shares, consumer, producer and
    admin alike: connection and security (``security_protocol``, ``ssl_*``,
    ``sasl_*``, timeouts), from ``kafka.*`` options given as a mapping or ``(key,
    value)`` pairs (other keys, e.g. the source's ``subscribe``, are left out; so may
    the source's whole options mapping be given). Settings only a consumer
    takes (``fetch_max_bytes``...) are left out; ``bootstrap.servers``, ``group.id``
    and ``client.id`` are each client's own. A setting no client knows is an
    :class:`OptionError`, as for the source. Clients wait :data:`OUTAGE_LIMIT_S` for
    an unreachable broker unless ``kafka.bootstrap.timeout.ms`` says otherwise."""
    shared, known, defaults = _client_names()
    pairs = kafka_options.items() if isinstance(kafka_options, Mapping) else kafka_options or ()
    settings: dict[str, Any] = dict(_RIDE_OUT)
    for key, value in pairs:
        if not str(key).startswith("kafka."):  # subscribe, ackstream.*: not a client's
            continue
        key = str(key).removeprefix("kafka.")
        option = "kafka." + key
        if key in ("bootstrap.servers", "group.id", "client.id"):
            continue
        if key == "sasl.jaas.config":
            settings.update(_from_jaas(option, str(value)))
            continue
        if key in _JAVA_ONLY:
            raise OptionError(option, value, _JAVA_ONLY[key])
        name = key.replace(".", "_")
        if name not in known:
            raise OptionError(option, value, "a kafka-python client setting (kafka.<setting>)")
        if name in shared:
            settings[name] = _typed(option, name, str(value), defaults[name])
    return settings


def client_options(options: Mapping[str, str]) -> dict[str, str]:
    """The ``kafka.*`` options of ``options`` that every client takes (connection and
    security, see :func:`client_settings`), as given: what a source's channel must share.

    >>> client_options({"kafka.security.protocol": "SSL", "kafka.max.poll.records": "9",
    ...                 "kafka.bootstrap.servers": "h:1", "subscribe": "t"})
    {'kafka.security.protocol': 'SSL'}
    """
    shared = _client_names()[0]
    return {
        key: value
        for key, value in options.items()
        if key.startswith("kafka.")
        and key not in ("kafka.bootstrap.servers", "kafka.group.id", "kafka.client.id")
        and (key == "kafka.sasl.jaas.config" or key[6:].replace(".", "_") in shared)
    }


@functools.cache
def _client_names() -> tuple[frozenset[str], frozenset[str], dict[str, Any]]:
    """(settings consumer, producer and admin client all take; settings either of the
    first two takes; the consumer's defaults)."""
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient

    consumer, producer = KafkaConsumer.DEFAULT_CONFIG, KafkaProducer.DEFAULT_CONFIG
    shared = frozenset(consumer) & frozenset(producer) & frozenset(KafkaAdminClient.DEFAULT_CONFIG)
    return shared, frozenset(consumer) | frozenset(producer), dict(consumer)


def kafka_options_of(config: SourceConfig) -> dict[str, str]:
    """The source's ``kafka.*`` options (but bootstrap servers and group id), prefixed:
    the form a :class:`~ackstream.channels.kafka.KafkaChannel` and a ``KafkaSink`` take."""
    return {f"kafka.{key}": value for key, value in config.kafka.options}


def jvm_client_settings(settings: Mapping[str, str]) -> dict[str, str]:
    """``settings`` (``kafka.*`` options without the prefix, as ackstream takes them) in
    the names Java's Kafka client reads, for Spark's own Kafka reader and writer: the
    same meaning where kafka-python's name differs, the rest as they are.

    ``ssl.cafile`` (a PEM file) becomes a PEM truststore given by its certificates, read
    here on the driver, so that executors on other machines need no copy of the file;
    ``ssl.check.hostname=false`` turns off the JVM's host name check; a SASL login given
    as ``sasl.plain.username`` and ``sasl.plain.password`` becomes the JAAS config of its
    mechanism (PLAIN or SCRAM). Java's client
    ignores a setting it does not know: untranslated, the reader and writer would meet
    a TLS listener with no trusted certificate (``PKIX path building failed``).

    >>> jvm_client_settings({"security.protocol": "SSL", "ssl.check.hostname": "false"})
    {'security.protocol': 'SSL', 'ssl.endpoint.identification.algorithm': ''}
    """
    translated: dict[str, str] = {}
    for key, value in settings.items():
        if key == "ssl.cafile":
            try:
                with open(value, encoding="ascii") as pem:
                    certificates = pem.read()
            except OSError as error:
                why = f"a readable PEM file ({error.strerror})"
                raise OptionError("kafka.ssl.cafile", value, why) from None
            translated["ssl.truststore.type"] = "PEM"
            translated["ssl.truststore.certificates"] = certificates
        elif key == "ssl.check.hostname":
            if str(value).strip().lower() == "false":
                translated["ssl.endpoint.identification.algorithm"] = ""
        elif key not in ("sasl.plain.username", "sasl.plain.password"):
            translated[key] = value
    user, password = settings.get("sasl.plain.username"), settings.get("sasl.plain.password")
    if user is not None and "sasl.jaas.config" not in settings:
        scram = str(settings.get("sasl.mechanism", "")).upper().startswith("SCRAM")
        module = "scram.ScramLoginModule" if scram else "plain.PlainLoginModule"
        quoted = [str(v).replace("\\", "\\\\").replace('"', '\\"') for v in (user, password or "")]
        translated["sasl.jaas.config"] = (
            f"org.apache.kafka.common.security.{module} required "
            f'username="{quoted[0]}" password="{quoted[1]}";'
        )
    return translated


def properties_file_options(path: str) -> dict[str, str]:
    """The client settings of a Java properties file, the ``--command-config`` file
    Kafka's own tools take (``security.protocol``, ``ssl.*``, ``sasl.jaas.config``...),
    as ``kafka.*`` options; checked with :func:`client_settings`, so that a setting no
    client knows fails here, naming it and the file."""
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except OSError as error:
        raise OptionError("--command-config", path, f"a readable file ({error.strerror})") from None
    options = {f"kafka.{key}": value for key, value in _properties(text)}
    try:
        client_settings(options)
    except OptionError as error:
        raise OptionError("--command-config", path, f"client settings only: {error}") from None
    return options


def _properties(text: str) -> list[tuple[str, str]]:
    r"""``(key, value)`` pairs of a Java properties text, as ``java.util.Properties``
    reads it (the ``javaproperties`` package): ``#`` and ``!`` comments, ``=``, ``:``
    or blanks between key and value, continued lines, escapes.

    >>> _properties("# client\nsecurity.protocol = SASL_SSL\nsasl.jaas.config: a \\\n    b;")
    [('security.protocol', 'SASL_SSL'), ('sasl.jaas.config', 'a b;')]
    """
    return list(javaproperties.loads(text, object_pairs_hook=list))


def _from_jaas(option: str, value: str) -> dict[str, str]:
    """``sasl.jaas.config`` of a PLAIN or SCRAM login as kafka-python's user and password."""
    fields = dict(_JAAS_FIELD.findall(value))
    if not _JAAS_LOGIN.search(value) or set(fields) != {"username", "password"}:
        raise OptionError(
            option,
            value,
            'a PlainLoginModule or ScramLoginModule config with username="..." and '
            'password="..." (or kafka.sasl.plain.username and kafka.sasl.plain.password)',
        )
    return {"sasl_plain_username": fields["username"], "sasl_plain_password": fields["password"]}


def _typed(option: str, name: str, value: str, default: object) -> bool | int | str:
    """``value`` as kafka-python's setting ``name`` takes it, checked as Kafka's clients
    check it (Java's ``ConfigDef`` bounds and lists)."""
    if isinstance(default, bool):
        if value.lower() not in ("true", "false"):
            raise OptionError(option, value, '"true" or "false"')
        return value.lower() == "true"
    if isinstance(default, int):
        minimum = 1 if name in _AT_LEAST_ONE else 0
        try:
            number = int(value)
        except ValueError:
            number = None
        if number is None or number < minimum:
            raise OptionError(option, value, f"a whole number >= {minimum}")
        return number
    if name in _CHOICES:
        chosen = [c for c in _CHOICES[name] if c.lower() == value.strip().lower()]
        if not chosen:
            raise OptionError(option, value, f"one of {', '.join(_CHOICES[name])}")
        return chosen[0]
    return value
