"""A topic deleted under a running query, the brokers up: the source's topic, the Kafka
channel's or the dead-letter topic. The call that needs it raises one error naming the
topic, within seconds (kafka-python itself waits 30 s to 120 s for the topic to come
back, as for brokers that are down, and then says only that it timed out)."""

from __future__ import annotations

import threading
import uuid

import pytest

from ackstream.channels.kafka import KafkaChannel
from ackstream.channels.local import LocalChannel
from ackstream.config.source import parse
from ackstream.errors import EnvironmentProblem
from ackstream.sinks.dead_letters import KafkaDeadLetters
from ackstream.sources.kafka import KafkaUpstream
from ackstream.sources.spout import open_spout
from ackstream.sources.starting import initial_offset
from ackstream.testing import FakeClock, ack, ack_records
from ackstream.vocabulary.dead_letter import DeadLetter
from ackstream.vocabulary.records import ACKED, completion_table

from helpers import delete_topic, wait_for

pytestmark = pytest.mark.broker

#: A generous poll bound on the error: well under kafka-python's own waits.
RAISED_WITHIN_S = 30


def raised_by(call):
    """What ``call()`` raises, polled for in a thread (a call that hangs fails the test)."""
    outcome: list = []

    def run():
        try:
            call()
            outcome.append(None)
        except Exception as error:  # noqa: BLE001 - the test judges it
            outcome.append(error)

    threading.Thread(target=run, daemon=True).start()
    wait_for(lambda: outcome, timeout=RAISED_WITHIN_S, interval=0.2, what="the call to end")
    assert outcome[0] is not None, "the call went on as if the topic were there"
    return outcome[0]


def test_the_sources_topic_deleted_stops_the_next_planning_round_naming_it(
    broker, new_topic, tmp_path
):
    """Spark's rounds: commit() of the batch that ran, then latestOffset() for the next."""
    topic = new_topic()
    config = parse(
        {
            "kafka.bootstrap.servers": broker.bootstrap,
            "subscribe": topic,
            "startingOffsets": "earliest",
            "ackstream.channel": str(tmp_path / "channel"),
        }
    )
    upstream, channel = KafkaUpstream(config), LocalChannel(config.channel)
    start = initial_offset(config, upstream, channel)
    spout = open_spout(config, upstream, channel, start, FakeClock())
    try:
        assert spout.next_offset() is None  # nothing to read yet: a round that commits
        delete_topic(broker.bootstrap, topic)
        error = raised_by(lambda: spout.on_spark_commit(start))
        assert isinstance(error, EnvironmentProblem), repr(error)
        assert f"topic {topic!r} (option subscribe) was deleted" in str(error)
        assert "new checkpoint" in str(error)
        assert isinstance(raised_by(spout.next_offset), EnvironmentProblem)
    finally:
        spout.close()


@pytest.mark.parametrize("deleted", ["done", "acks"])
def test_a_channel_topic_deleted_is_named_by_its_next_write_and_read(broker, deleted):
    channel = KafkaChannel(broker.bootstrap, f"gone-{uuid.uuid4().hex[:8]}")
    channel.prepare()
    completions = completion_table([1], ACKED)
    acks = ack_records([ack(1, 5)])
    try:
        channel.write_completions(completions)
        channel.write_acks(acks)
        position = channel.completions_since(None)[1]
        topic = {"done": channel.done_topic, "acks": channel.acks_topic}[deleted]
        delete_topic(broker.bootstrap, topic)
        write = {
            "done": lambda: channel.write_completions(completions),
            "acks": lambda: channel.write_acks(acks),
        }[deleted]
        read = {
            "done": lambda: channel.completions_since(position),
            "acks": channel.ack_records,
        }[deleted]
        for error in (raised_by(write), raised_by(read)):
            assert isinstance(error, EnvironmentProblem), repr(error)
            assert f"topic {topic!r} of the topology's Kafka channel was deleted" in str(error)
            assert "new checkpoints" in str(error)
    finally:
        closing = threading.Thread(target=channel.close, daemon=True)
        closing.start()
        closing.join(timeout=60)
    # a record the failed write left queued is dropped, not waited for until the
    # producer's 120 s delivery timeout
    assert not closing.is_alive(), "close() waits on the deleted topic's record"


def test_the_dead_letter_topic_deleted_is_named_by_the_next_letter(broker, new_topic):
    topic = new_topic()
    letters = KafkaDeadLetters(broker.bootstrap, topic, "topo")
    try:
        letters.write([DeadLetter("in", 0, 7, 1, "failed")], {})
        delete_topic(broker.bootstrap, topic)
        error = raised_by(lambda: letters.write([DeadLetter("in", 0, 8, 1, "failed")], {}))
    finally:
        letters.close()
    assert isinstance(error, EnvironmentProblem), repr(error)
    assert f"dead-letter topic {topic!r} (option ackstream.deadLetterTopic) was deleted" in str(
        error
    )


class StalledConsumer:
    """A consumer whose fetches bring nothing, on brokers that list ``topics``."""

    def __init__(self, topics):
        self.listed, self.asked = set(topics), 0

    def assign(self, parts):
        pass

    def seek(self, part, offset):
        self.at = offset

    def position(self, part):
        return self.at

    def poll(self, timeout_ms, max_records):
        return {}

    def topics(self):
        self.asked += 1
        return self.listed


def test_a_read_stalled_on_a_deleted_topic_names_it_without_waiting_out_the_stall():
    from ackstream.errors import EnvironmentProblem
    from ackstream.kafka.reading import read_records

    consumer = StalledConsumer({"other"})
    with pytest.raises(EnvironmentProblem, match="topic 'gone' was deleted while offsets 3..9"):
        list(read_records(consumer, ("gone", 0), [(3, 10)], deleted_check_s=0.0))
    assert consumer.asked == 1


def test_a_read_stalled_on_a_listed_topic_waits_out_the_stall_as_before():
    from ackstream.errors import AckstreamError, EnvironmentProblem
    from ackstream.kafka.reading import read_records

    consumer = StalledConsumer({"here"})
    with pytest.raises(AckstreamError, match="no progress reading here") as raised:
        list(
            read_records(consumer, ("here", 0), [(3, 10)], stall_timeout_s=1.2, deleted_check_s=0.5)
        )
    assert not isinstance(raised.value, EnvironmentProblem) and consumer.asked >= 1
