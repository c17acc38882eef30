"""Every Kafka client ackstream makes takes the source's settings, security
included: the source's consumers, the channel (producer, consumer, admin, the acker's
source and the executors' reads), the dead-letter producer and the KafkaSink."""

import pickle

import pytest

from ackstream import OptionError
from ackstream.channels import KafkaChannel, open_channel
from ackstream.channels.ack_source import ChannelSource, MessageRange
from ackstream.channels.messages import fetch_messages
from ackstream.config.source import parse
from ackstream.kafka.settings import client_settings, consumer_settings
from ackstream.sinks.dead_letters import KafkaDeadLetters
from ackstream.sinks.kafka import KafkaSink

JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="alice" password="s3cret";'
)
SOURCE_OPTIONS = {
    "kafka.bootstrap.servers": "127.0.0.1:9",
    "subscribe": "in",
    "ackstream.topology": "secure",
    "ackstream.channel": "kafka",
    "kafka.security.protocol": "SASL_SSL",
    "kafka.sasl.mechanism": "PLAIN",
    "kafka.sasl.jaas.config": JAAS,
    "kafka.ssl.cafile": "/etc/ca.pem",
    "kafka.request.timeout.ms": "7000",
    "kafka.fetch.max.bytes": "1000",  # a consumer's own setting
}
SECURITY = {
    "security_protocol": "SASL_SSL",
    "sasl_mechanism": "PLAIN",
    "sasl_plain_username": "alice",
    "sasl_plain_password": "s3cret",
    "ssl_cafile": "/etc/ca.pem",
    "request_timeout_ms": 7000,
    # not an option given: every client waits out a broker restart (OUTAGE_LIMIT_S)
    "bootstrap_timeout_ms": 120_000,
}


def test_the_shared_settings_are_the_connection_and_security_ones():
    settings = client_settings({k: v for k, v in SOURCE_OPTIONS.items() if k != "subscribe"})
    assert settings == SECURITY  # no bootstrap, no consumer-only fetch.max.bytes


def test_every_client_waits_out_a_broker_restart_unless_told_otherwise():
    """kafka-python gives up on an unreachable broker after 30 s, less than a broker
    takes to restart from its log after a SIGKILL: a read task that began meanwhile
    ended the query (chaos seeds 1 and 2, 2026-11-23)."""
    source = SOURCE_OPTIONS | {"kafka.bootstrap.servers": "127.0.0.1:9"}
    assert consumer_settings(parse(source))["bootstrap_timeout_ms"] == 120_000
    told = client_settings({"kafka.bootstrap.timeout.ms": "5000"})
    assert told["bootstrap_timeout_ms"] == 5000
    told = consumer_settings(parse(source | {"kafka.bootstrap.timeout.ms": "5000"}))
    assert told["bootstrap_timeout_ms"] == 5000


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("kafka.ssl.truststore.location", "/x.jks", "kafka.ssl.cafile"),
        ("kafka.securty.protocol", "SSL", "kafka-python client setting"),
        ("kafka.request.timeout.ms", "soon", "whole number"),
    ],
)
def test_a_setting_no_client_can_use_is_refused_naming_it(option, value, says):
    with pytest.raises(OptionError, match=says) as refused:
        client_settings({option: value})
    assert refused.value.option == option


class Recorder:
    """Stands in for a kafka-python client class: records the settings it was made with."""

    made: list

    def __init__(self, *topics, **settings):
        type(self).made.append(settings)

    def __getattr__(self, name):  # send, flush, close, list_topics...: nothing to do
        return lambda *args, **kwargs: _Done()

    def topics(self):  # asked whether a topic was deleted: none was
        return _EveryTopic()


class _EveryTopic:
    def __contains__(self, topic):
        return True


class _Done:
    is_done, succeeded = True, staticmethod(lambda: True)

    def get(self, timeout=None):
        return None

    def __iter__(self):
        return iter(())


@pytest.fixture
def clients(monkeypatch):
    """Every kafka-python client made in the test, as (kind, settings)."""
    import kafka
    import kafka.admin

    made = []
    for module, name in (
        (kafka, "KafkaProducer"),
        (kafka, "KafkaConsumer"),
        (kafka.admin, "KafkaAdminClient"),
    ):
        real = getattr(module, name)
        recorder = type(name, (Recorder,), {"made": [], "DEFAULT_CONFIG": real.DEFAULT_CONFIG})
        monkeypatch.setattr(module, name, recorder)
        made.append((name, recorder.made))
    return lambda: [(name, s) for name, settings in made for s in settings]


def carries_security(settings: dict) -> bool:
    return all(settings.get(k) == v for k, v in SECURITY.items())


def test_the_sources_channel_takes_its_settings_and_topic_options_even_pickled(clients):
    config = parse(
        SOURCE_OPTIONS | {"ackstream.channelReplication": "3", "ackstream.channelRetention": "2 h"}
    )
    channel = open_channel(config)  # prepares its topics: an admin client
    assert (channel.replication_factor, channel.retention_ms) == (3, 7_200_000)
    executors = pickle.loads(pickle.dumps(channel))  # what a read task gets
    executors.write_completions(_one_completion())
    executors.completions_since(None)
    kinds = [kind for kind, _ in clients()]
    assert set(kinds) == {"KafkaAdminClient", "KafkaProducer", "KafkaConsumer"}
    assert all(carries_security(settings) for _, settings in clients()), clients()


def _one_completion():
    from ackstream.vocabulary.records import ACKED, completion_table

    return completion_table([1], [ACKED], topic="in", partition=0, offset=[0], attempt=[0])


def test_the_acker_source_and_its_read_tasks_take_the_channels_settings(clients):
    channel = KafkaChannel("127.0.0.1:9", "secure", kafka_options=SOURCE_OPTIONS)
    options = {**channel.kafka_options, "kafka.bootstrap.servers": "127.0.0.1:9", "topic": "t"}
    reader = ChannelSource(options).streamReader(None)
    reader.latestOffset({}, None)
    task = pickle.loads(pickle.dumps(reader))  # what an executor runs
    list(task.read(MessageRange(0, 1, 1)))  # an empty range: no consumer
    # a range with messages reads them so (the fake consumer could not read them)
    fetch_messages(task.bootstrap, task.topic, 0, 1, 1, settings=task.settings)
    assert [kind for kind, _ in clients()] == ["KafkaConsumer", "KafkaConsumer"]
    assert all(carries_security(settings) for _, settings in clients())


def test_dead_letters_and_the_sink_producers_take_the_settings(clients):
    KafkaDeadLetters("127.0.0.1:9", "dead", "secure", kafka_options=SOURCE_OPTIONS)
    sink = KafkaSink("127.0.0.1:9", "out", kafka_options=SOURCE_OPTIONS)
    # a sink's producers wait for brokers no longer than flush_timeout_s: past it the
    # batch pauses instead (ackstream.topology.outage)
    assert sink.producer_config["bootstrap_timeout_ms"] == 30_000
    assert carries_security({**sink.producer_config, "bootstrap_timeout_ms": 120_000})
    produce = pickle.loads(pickle.dumps(sink))  # the sink travels to the executors
    assert produce.producer_config == sink.producer_config
    assert [kind for kind, _ in clients()] == ["KafkaProducer"]
    assert carries_security(clients()[0][1])


def test_the_channel_creates_its_topics_with_the_brokers_defaults_unless_given(monkeypatch):
    import kafka.admin

    created = []

    class Admin(Recorder):
        made = []

        def list_topics(self):
            return []

        def create_topics(self, topics):
            created.extend(topics)

    monkeypatch.setattr(kafka.admin, "KafkaAdminClient", Admin)
    KafkaChannel("127.0.0.1:9", "a").prepare()
    KafkaChannel("127.0.0.1:9", "b", replication_factor=3, retention_ms=60_000).prepare()
    got = [(t.name, t.replication_factor, dict(t.topic_configs or {})) for t in created]
    assert got == [
        ("a.acks", -1, {}),
        ("a.done", -1, {}),
        ("b.acks", 3, {"retention.ms": "60000"}),
        ("b.done", 3, {"retention.ms": "60000"}),
    ]


def test_a_command_config_file_gives_kafka_options_as_kafkas_own_tools_read_it(tmp_path):
    from ackstream.kafka.settings import properties_file_options

    path = tmp_path / "client.properties"
    path.write_text(
        "# what kafka-console-consumer.sh --command-config takes\n"
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism : PLAIN\n"
        "! another comment\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule \\\n"
        '    required username="app" password="s3cret";\n'
        "request.timeout.ms 20000\n"
    )
    options = properties_file_options(str(path))
    assert options["kafka.sasl.mechanism"] == "PLAIN"
    assert options["kafka.request.timeout.ms"] == "20000"
    settings = client_settings(options)
    assert settings["security_protocol"] == "SASL_SSL"
    assert (settings["sasl_plain_username"], settings["sasl_plain_password"]) == ("app", "s3cret")
    assert settings["request_timeout_ms"] == 20000


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("ssl.truststore.location=/etc/kafka/truststore.jks\n", "kafka.ssl.cafile"),
        ("securty.protocol=SSL\n", "kafka.securty.protocol"),
    ],
)
def test_a_command_config_file_with_a_setting_no_client_takes_names_the_file_and_it(
    tmp_path, text, says
):
    from ackstream.kafka.settings import properties_file_options

    path = tmp_path / "client.properties"
    path.write_text(text)
    with pytest.raises(OptionError, match=says) as refused:
        properties_file_options(str(path))
    assert refused.value.option == "--command-config" and str(path) in str(refused.value)


def test_a_missing_command_config_file_is_named(tmp_path):
    from ackstream.kafka.settings import properties_file_options

    with pytest.raises(OptionError, match="a readable file") as refused:
        properties_file_options(str(tmp_path / "nowhere.properties"))
    assert "nowhere.properties" in str(refused.value)


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        # Spark's Kafka source refuses these outright: ackstream decides them
        ("kafka.auto.offset.reset", "bogus", "startingOffsets"),
        ("kafka.auto.offset.reset", "earliest", "startingOffsets"),
        ("kafka.enable.auto.commit", "true", "commits to the consumer group itself"),
        ("kafka.allow.auto.create.topics", "true", "never creates a topic"),
        # Kafka's own clients refuse these values
        ("kafka.max.poll.records", "-5", "a whole number >= 1"),
        ("kafka.max.poll.records", "0", "a whole number >= 1"),
        ("kafka.fetch.max.bytes", "-1", "a whole number >= 0"),
        ("kafka.request.timeout.ms", "-100", "a whole number >= 0"),
        ("kafka.isolation.level", "serializable", "read_uncommitted"),
        ("kafka.security.protocol", "TLS", "SASL_SSL"),
    ],
)
def test_a_setting_kafka_or_spark_would_refuse_is_refused_naming_it(option, value, says):
    with pytest.raises(OptionError, match=says) as refused:
        consumer_settings(parse(SOURCE_OPTIONS | {option: value}))
    assert (refused.value.option, refused.value.value) == (option, value)
    assert f"'{option}'?" not in str(refused.value)  # never "did you mean" itself


def test_a_settings_case_is_taken_as_kafkas_clients_take_it():
    settings = consumer_settings(parse(SOURCE_OPTIONS | {"kafka.security.protocol": "sasl_ssl"}))
    assert settings["security_protocol"] == "SASL_SSL"


def test_spark_s_java_clients_get_the_settings_in_their_own_names(tmp_path):
    """Spark's Kafka reader and writer are Java clients, which ignore kafka-python's
    names: given as they are, a TLS listener met no trusted certificate and every read
    and write of a telescoped topology failed."""
    from ackstream.kafka.settings import jvm_client_settings

    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    jvm = jvm_client_settings(
        {
            "security.protocol": "SASL_SSL",
            "ssl.cafile": str(ca),
            "ssl.check.hostname": "false",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.plain.username": "ann",
            "sasl.plain.password": 'p"w',
        }
    )
    assert jvm == {
        "security.protocol": "SASL_SSL",
        "ssl.truststore.type": "PEM",
        "ssl.truststore.certificates": ca.read_text(),
        "ssl.endpoint.identification.algorithm": "",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
        'required username="ann" password="p\\"w";',
    }
    jaas = "org.apache.kafka.common.security.plain.PlainLoginModule required a;"
    assert jvm_client_settings({"sasl.jaas.config": jaas, "ssl.check.hostname": "true"}) == {
        "sasl.jaas.config": jaas
    }
    with pytest.raises(OptionError, match="kafka.ssl.cafile"):
        jvm_client_settings({"ssl.cafile": str(tmp_path / "missing.pem")})
