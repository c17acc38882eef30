"""Dead letters on a Kafka topic: every letter is written, whatever its record held, with
the record's headers, ours and Kafka Connect's; read back as a table."""

import pytest

from ackstream.sinks.dead_letters import CONNECT_ERRORS, KafkaDeadLetters, read_dead_letters
from ackstream.vocabulary.dead_letter import DeadLetter

from helpers import consume

pytestmark = pytest.mark.broker


def test_a_letter_without_key_or_value_is_written_with_its_headers(broker, new_topic):
    topic = new_topic()
    letters = KafkaDeadLetters(broker.bootstrap, topic, "topo")
    try:
        letters.write([DeadLetter("in", 0, 7, 1, "rejected: too big")], {})  # no record held
        letters.write([DeadLetter("in", 0, 8, 3, "failed")], {(("in", 0), 8): (b"k", b"v", 5)})
    finally:
        letters.close()
    got = consume(broker.bootstrap, topic)
    assert [(m.key, m.value) for m in got] == [(None, b""), (b"k", b"v")]
    headers = {k: v.decode() for k, v in got[0].headers}
    assert headers["ackstream.reason"] == "rejected: too big"
    assert (headers["ackstream.offset"], headers["ackstream.attempts"]) == ("7", "1")


def test_a_letter_carries_the_records_headers_ours_and_kafka_connects(broker, new_topic):
    topic = new_topic()
    letters = KafkaDeadLetters(broker.bootstrap, topic, "topo")
    record = (b"k", b"v", 1_700_000_000_123, [("trace", b"t1")])
    try:
        letters.write(
            [DeadLetter("in", 2, 9, 4, "failed: parse#1: boom")], {(("in", 2), 9): record}
        )
    finally:
        letters.close()
    (got,) = consume(broker.bootstrap, topic)
    headers = [(k, v.decode()) for k, v in got.headers]
    assert headers[0] == ("trace", "t1")  # the record's own first
    connect = {k: v for k, v in headers if k.startswith(CONNECT_ERRORS)}
    assert connect == {
        "__connect.errors.topic": "in",
        "__connect.errors.partition": "2",
        "__connect.errors.offset": "9",
        "__connect.errors.connector.name": "topo",
        "__connect.errors.exception.class.name": "ackstream.Failed",
        "__connect.errors.exception.message": "failed: parse#1: boom",
    }
    (back,) = read_dead_letters(bootstrap=broker.bootstrap, topic=topic).to_pylist()
    assert back.pop("written_ms") == got.timestamp  # the letter's time: the message's
    assert back == {
        "topology": "topo",
        "topic": "in",
        "partition": 2,
        "offset": 9,
        "attempts": 4,
        "reason": "failed: parse#1: boom",
        "key": b"k",
        "value": b"v",
        "timestamp_ms": 1_700_000_000_123,
        "headers": [{"key": "trace", "value": b"t1"}],  # ours and Connect's left out
    }
