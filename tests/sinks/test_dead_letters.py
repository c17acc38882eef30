"""Dead letters on a Kafka topic: every letter is written, whatever its record held."""

import pytest

from ackstream.sinks.dead_letters import KafkaDeadLetters
from ackstream.sources.tracking import DeadLetter

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
