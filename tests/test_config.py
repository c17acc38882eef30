"""Option parsing of the ackstream source: no Spark, no broker."""

import pytest

from ackstream import OptionError
from ackstream.config.source import parse, parse_duration_ms

KAFKA = {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "events"}


def test_defaults_mirror_spark_and_storm():
    cfg = parse(KAFKA)
    assert cfg.kafka.topics == ("events",)
    assert cfg.kafka.starting_offsets == "committed"
    assert cfg.message_timeout_ms == 30_000 and cfg.source_timeout_ms == 60_000
    assert cfg.kafka.group_id == "ackstream-ackstream" and cfg.tracking
    assert cfg.admission.max_pending is None and cfg.admission.max_offsets_per_trigger is None
    assert cfg.channel.endswith("ackstream/ackstream/channel")


def test_keys_are_case_insensitive_and_everything_parses():
    cfg = parse(
        {
            **KAFKA,
            "SUBSCRIBE": "a, b",
            "ackstream.MAXPENDING": "10",
            "maxoffsetspertrigger": "100",
            "ackstream.retryInitialDelay": "2 s",
            "ackstream.retryMaxDelay": "1 min",
            "ackstream.maxRetries": "0",
            "kafka.group.id": "g",
            "failOnDataLoss": "FALSE",
            "ackstream.topology": "wc",
            "ackstream.deadLetterTopic": "dlq",
            "startingOffsets": '{"a": {"0": 5, "1": -2}}',
            "kafka.request.timeout.ms": "5000",
        }
    )
    assert cfg.kafka.topics == ("a", "b") and cfg.admission.max_pending == 10
    assert cfg.admission.max_offsets_per_trigger == 100 and cfg.retry.max_retries == 0
    assert (cfg.retry.initial_delay_ms, cfg.retry.max_delay_ms) == (2000, 60_000)
    assert cfg.kafka.group_id == "g" and not cfg.kafka.fail_on_data_loss
    assert cfg.dead_letter_topic == "dlq" and cfg.topology == "wc"
    assert cfg.kafka.starting_map() == {"a": {0: 5, 1: -2}}
    assert cfg.kafka.options == (("request.timeout.ms", "5000"),)


@pytest.mark.parametrize(
    "text, ms",
    [
        ("500ms", 500),
        ("30s", 30_000),
        ("2 min", 120_000),
        ("1500", 1500),
        ("1.5s", 1500),
        ("1 hour", 3_600_000),
    ],
)
def test_durations(text, ms):
    assert parse_duration_ms("x", text) == ms


@pytest.mark.parametrize(
    "options, option",
    [
        ({"ackstream.maxPending": "0"}, "ackstream.maxPending"),
        ({"ackstream.maxPending": "ten"}, "ackstream.maxPending"),
        ({"ackstream.messageTimeout": "30 parsecs"}, "ackstream.messageTimeout"),
        ({"ackstream.messageTimeout": "0"}, "ackstream.messageTimeout"),
        ({"ackstream.maxRetries": "-1"}, "ackstream.maxRetries"),
        (
            {"ackstream.retryInitialDelay": "5s", "ackstream.retryMaxDelay": "1s"},
            "ackstream.retryMaxDelay",
        ),
        ({"ackstream.sourceTimeout": "1s"}, "ackstream.sourceTimeout"),
        ({"ackstream.tracking": "yes"}, "ackstream.tracking"),
        ({"ackstream.maxpendng": "5"}, "ackstream.maxpendng"),
        ({"ackstream.upstream": "pulsar"}, "ackstream.upstream"),
        ({"ackstream.channel": "kafka", "ackstream.upstream": "generator"}, "ackstream.channel"),
        ({"ackstream.topology": "word count"}, "ackstream.topology"),
        ({"startingOffsets": "yesterday"}, "startingOffsets"),
        ({"startingOffsets": '{"other": {"0": 1}}'}, "startingOffsets"),
        ({"maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger"),
        ({"failOnDataLoss": "maybe"}, "failOnDataLoss"),
        ({"subscribe": ""}, "subscribe"),
        ({"subscribePattern": "t.*"}, "subscribePattern"),
        ({"kafka.bootstrap.servers": ""}, "kafka.bootstrap.servers"),
        # Spark's Kafka source's own options (None: KAFKA's option left out)
        ({"assign": '{"a": [0]}'}, "assign"),  # beside KAFKA's subscribe
        ({"subscribe": None, "assign": "[0, 1]"}, "assign"),
        ({"subscribe": None, "assign": '{"a": [-1]}'}, "assign"),
        ({"subscribe": None, "subscribePattern": "orders-("}, "subscribePattern"),
        ({"minPartitions": "0"}, "minPartitions"),
        ({"includeHeaders": "yes"}, "includeHeaders"),
        ({"startingTimestamp": "yesterday"}, "startingTimestamp"),
        ({"startingOffsetsByTimestamp": '{"other": {"0": 5}}'}, "startingOffsetsByTimestamp"),
        ({"startingOffsetsByTimestampStrategy": "closest"}, "startingOffsetsByTimestampStrategy"),
    ],
)
def test_bad_options_name_option_value_and_what_is_allowed(options, option):
    given = {k: v for k, v in {**KAFKA, **options}.items() if v is not None}
    with pytest.raises(OptionError) as err:
        parse(given)
    assert err.value.option == option
    assert err.value.value == {k.lower(): v for k, v in options.items()}[option.lower()]
    assert err.value.allowed


def test_kafka_channel_defaults_the_dead_letter_topic_to_the_topology_name():
    cfg = parse(
        {
            "kafka.bootstrap.servers": "127.0.0.1:9",
            "subscribe": "in",
            "ackstream.topology": "words",
            "ackstream.channel": "KAFKA",
        }
    )
    assert (cfg.channel, cfg.dead_letter_topic) == ("kafka", "words.dead")


def test_generator_needs_no_broker_and_rejects_a_dead_letter_topic():
    cfg = parse(
        {
            "ackstream.upstream": "generator",
            "ackstream.generator.count": "100",
            "ackstream.generator.rate": "50",
            "ackstream.generator.partitions": "4",
        }
    )
    assert (cfg.generator.count, cfg.generator.rate, cfg.generator.partitions) == (100, 50.0, 4)
    with pytest.raises(OptionError) as err:
        parse({"ackstream.upstream": "generator", "ackstream.deadLetterTopic": "dlq"})
    assert err.value.option == "ackstream.deadLetterTopic"
    with pytest.raises(OptionError) as err:
        parse({"ackstream.upstream": "generator", "ackstream.generator.rate": "-3"})
    assert err.value.option == "ackstream.generator.rate"


def test_unknown_kafka_setting_is_rejected_by_the_kafka_module():
    from ackstream.sources.kafka import consumer_settings

    with pytest.raises(OptionError) as err:
        consumer_settings(parse({**KAFKA, "kafka.no.such.setting": "1"}))
    assert err.value.option == "kafka.no.such.setting"
    settings = consumer_settings(parse({**KAFKA, "kafka.request.timeout.ms": "5000"}))
    assert settings["request_timeout_ms"] == 5000


@pytest.mark.parametrize(
    "option, meant",
    [
        ("maxOffsetPerTrigger", "maxOffsetsPerTrigger"),
        ("failOnDatLoss", "failOnDataLoss"),
        ("ackstream.maxRetrys", "ackstream.maxRetries"),
        ("startingOffset", "startingOffsets"),
    ],
)
def test_a_misspelt_option_is_refused_with_the_name_it_resembles(option, meant):
    with pytest.raises(OptionError, match=f"did you mean '{meant}'") as refused:
        parse({**KAFKA, option: "1"})
    assert refused.value.option == option  # named as the user wrote it, not lower-cased


@pytest.mark.parametrize(
    "option", ["endingOffsets", "minOffsetsPerTrigger", "groupIdPrefix", "path"]
)
def test_options_ackstream_does_not_take_are_refused_not_ignored(option):
    with pytest.raises(OptionError):
        parse({**KAFKA, option: "true"})


def test_timestamp_type_is_a_column_not_an_option():
    with pytest.raises(OptionError, match="column") as err:
        parse({**KAFKA, "timestampType": "1"})
    assert err.value.option == "timestampType"  # named as the user wrote it


def test_spark_kafka_options_parse_as_sparks_do():
    by_time = '{"events": {"0": 1700000000000}}'
    cfg = parse(
        {
            **KAFKA,
            "includeHeaders": "true",
            "minPartitions": "8",
            "startingTimestamp": "1600000000000",
            "startingOffsetsByTimestamp": by_time,
            "startingOffsetsByTimestampStrategy": "LATEST",
        }
    )
    assert cfg.kafka.include_headers and cfg.admission.min_partitions == 8
    assert cfg.kafka.starting_timestamp == 1_600_000_000_000
    assert cfg.kafka.timestamp_map() == {"events": {0: 1_700_000_000_000}}
    assert cfg.kafka.starting_timestamp_strategy == "latest"
    assigned = parse({"kafka.bootstrap.servers": "h:1", "assign": '{"a": [1, 0], "b": [2]}'})
    assert assigned.kafka.assign == (("a", 0), ("a", 1), ("b", 2))
    assert assigned.kafka.topics == ("a", "b")
    pattern = parse({"kafka.bootstrap.servers": "h:1", "subscribePattern": "orders-.*"})
    assert pattern.kafka.subscribe_pattern == "orders-.*" and pattern.kafka.topics == ()


def test_java_client_settings_are_translated_or_refused_without_showing_secrets():
    from ackstream.kafka.settings import consumer_settings

    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="alice" password="hunter2";'
    )
    settings = consumer_settings(parse({**KAFKA, "kafka.sasl.jaas.config": jaas}))
    assert (settings["sasl_plain_username"], settings["sasl_plain_password"]) == (
        "alice",
        "hunter2",
    )
    for option, value, instead in [
        ("kafka.sasl.jaas.config", 'password="hunter2"', "username"),
        ("kafka.ssl.truststore.location", "/etc/kafka.jks", "kafka.ssl.cafile"),
        ("kafka.ssl.keystore.password", "hunter2", "kafka.ssl.password"),
        ("kafka.securty.protocol", "SSL", "did you mean 'kafka.security.protocol'"),
    ]:
        with pytest.raises(OptionError, match=instead) as err:
            consumer_settings(parse({**KAFKA, option: value}))
        assert "hunter2" not in str(err.value)


def test_the_retry_schedule_has_a_first_delay_and_a_period_as_storms_kafka_spout():
    cfg = parse(
        {
            **KAFKA,
            "ackstream.retryInitialDelay": "0",
            "ackstream.retryDelayPeriod": "1s",
            "ackstream.retryMaxDelay": "5s",
        }
    )
    assert [cfg.retry.delay_ms(n) for n in (1, 2, 3, 4)] == [0, 2000, 4000, 5000]
    with pytest.raises(OptionError, match="ackstream.retryDelayPeriod"):
        parse({**KAFKA, "ackstream.retryDelayPeriod": "0"})


@pytest.mark.parametrize(
    "options, option, says",
    [
        ({"ackstream.topology": ".."}, "ackstream.topology", "not '.' or '..'"),
        ({"ackstream.topology": "."}, "ackstream.topology", "not '.' or '..'"),
        ({"kafka.group.id": ""}, "kafka.group.id", "not empty"),
        ({"kafka.group.id": "  "}, "kafka.group.id", "not empty"),
        ({"subscribe": "t,t"}, "subscribe", "'t' twice"),
        ({"subscribe": "a, b ,a"}, "subscribe", "'a' twice"),
        ({"maxRecordsPerPartition": "0"}, "maxRecordsPerPartition", ">= 1"),
        ({"ackstream.maxValueBytes": "0"}, "ackstream.maxValueBytes", '"none" for no limit'),
    ],
)
def test_values_spark_or_kafka_would_refuse_are_refused_before_start(options, option, says):
    with pytest.raises(OptionError, match=says) as err:
        parse({**KAFKA, **options})
    assert err.value.option == option
    assert err.value.value == options[option]


def test_max_value_bytes_takes_none_for_no_limit():
    assert parse(KAFKA).admission.max_value_bytes == 16 << 20
    assert parse({**KAFKA, "ackstream.maxValueBytes": "4096"}).admission.max_value_bytes == 4096
    assert parse({**KAFKA, "ackstream.maxValueBytes": " None "}).admission.max_value_bytes is None


def test_the_value_limit_holds_only_when_tracking():
    """Untracked nothing can be dead-lettered, so no value is refused for its size."""
    assert parse({**KAFKA, "ackstream.maxValueBytes": "4096"}).value_limit == 4096
    untracked = {**KAFKA, "ackstream.maxValueBytes": "4096", "ackstream.tracking": "false"}
    assert parse(untracked).value_limit is None
    assert parse({**KAFKA, "ackstream.maxValueBytes": "none"}).value_limit is None


def test_max_records_per_partition_is_sparks_option():
    assert (
        parse({**KAFKA, "maxRecordsPerPartition": "5000"}).admission.max_records_per_partition
        == 5000
    )
    assert parse(KAFKA).admission.max_records_per_partition is None


def test_each_option_row_sets_a_config_field_of_its_readers_type():
    """The table's rows name real fields, once each, read as the field's type."""
    from dataclasses import fields
    from typing import get_args, get_type_hints

    from ackstream.config import source as config

    declared = {}
    for group, kind in [
        ("", config.SourceConfig),
        ("kafka", config.KafkaOptions),
        ("admission", config.Admission),
        ("generator", config.GeneratorOptions),
        ("retry", config.RetryPolicy),
    ]:
        hints = get_type_hints(kind, vars(config))
        declared.update({f"{group}.{f.name}".lstrip("."): hints[f.name] for f in fields(kind)})
    named = [option.field for option in config.OPTIONS]
    assert len(named) == len(set(named))
    for option in config.OPTIONS:
        hint = declared[option.field]
        assert option.reader.type == hint or option.reader.type in get_args(hint), option.name


def test_two_spellings_of_one_value_are_the_same_term_as_the_options_table_reads_them(tmp_path):
    """A stream's options and its topology's are compared as values: a duration in two
    units, a flag in two cases, a channel folder by two paths, Kafka in two cases."""
    import os

    from ackstream.config.source import same_value

    assert same_value("ackstream.messageTimeout", "30s", "30000ms")
    assert same_value("ackstream.messageTimeout", "30000", 30_000)
    assert not same_value("ackstream.messageTimeout", "31s", 30_000)
    assert not same_value("ackstream.messageTimeout", "soon", 30_000)  # unreadable: not the same
    assert same_value("ACKSTREAM.TRACKING", "TRUE", "true")
    assert same_value("includeHeaders", "False", False)
    assert same_value("ackstream.idleBatchInterval", "1s", "1000ms")
    folder = tmp_path / "channel"
    assert same_value("ackstream.channel", str(folder), os.path.relpath(folder))
    assert same_value("ackstream.channel", "KAFKA", "kafka")
    assert not same_value("ackstream.channel", "kafka", str(folder))
    assert not same_value("ackstream.topology", "words", "Words")
