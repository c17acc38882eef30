"""The source's driver-side Kafka calls survive a broker error with a new consumer, and
fail, naming the brokers and what to check, only when the brokers failed for longer
than OUTAGE_LIMIT_S. A fake consumer stands in for kafka-python's (no broker) and a
fake clock for time: the lost-leader and stall tests on the three-broker cluster
(tests/kafka/test_broker_failures.py) run the real thing."""

from __future__ import annotations

import pytest
from kafka import TopicPartition
from kafka.errors import KafkaTimeoutError

from ackstream.config.source import parse
from ackstream.errors import EnvironmentProblem
from ackstream.kafka.outage import RETRY_PAUSE_S
from ackstream.kafka.settings import OUTAGE_LIMIT_S
from ackstream.sources import kafka as upstream_module
from ackstream.sources.kafka import KafkaUpstream


class FlakyConsumer:
    """Answers ``beginning_offsets`` and ``commit`` unless it is one of the first
    ``failures`` consumers made, which time out as a consumer stuck on a lost broker."""

    made: list[FlakyConsumer] = []
    failures = 0
    listed = {"words"}  # the topics the brokers list

    def __init__(self, **settings):
        self.broken = len(FlakyConsumer.made) < FlakyConsumer.failures
        self.closed = False
        self.commits: list[dict] = []
        FlakyConsumer.made.append(self)

    def _answer(self):
        if self.broken:
            raise KafkaTimeoutError("Failed to get offsets by timestamps in 30000 ms")

    def beginning_offsets(self, parts):
        self._answer()
        return {part: 7 for part in parts}

    def topics(self):  # asked when an offset request fails: was a topic deleted?
        self._answer()
        return FlakyConsumer.listed

    def commit(self, offsets):
        self._answer()
        self.commits.append(offsets)

    def timed_out(self, offsets):
        raise KafkaTimeoutError()

    def close(self, autocommit=True):
        self.closed = True


class FakeTime:
    """``time`` for the module under test: ``sleep`` moves ``monotonic`` on at once."""

    now = 0.0

    @classmethod
    def monotonic(cls) -> float:
        return cls.now

    @classmethod
    def sleep(cls, seconds: float) -> None:
        cls.now += seconds


#: Failed attempts, one per RETRY_PAUSE_S, that still fit in the outage limit.
ATTEMPTS_IN_AN_OUTAGE = int(OUTAGE_LIMIT_S / RETRY_PAUSE_S) + 1


@pytest.fixture
def upstream(monkeypatch):
    FlakyConsumer.made, FlakyConsumer.listed = [], {"words"}
    monkeypatch.setattr(upstream_module, "KafkaConsumer", FlakyConsumer)
    monkeypatch.setattr(upstream_module, "time", FakeTime)
    config = parse({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "words"})
    return KafkaUpstream(config)


def test_a_call_that_fails_is_made_again_with_a_new_consumer(upstream):
    FlakyConsumer.failures = 15  # a 15 s stall: longer than Spark's three attempts
    assert upstream.earliest([("words", 0)]) == {("words", 0): 7}
    assert len(FlakyConsumer.made) == 16
    assert all(c.closed for c in FlakyConsumer.made[:-1]) and not FlakyConsumer.made[-1].closed

    upstream.commit({("words", 0): (5, "meta")})  # the working consumer is kept
    assert len(FlakyConsumer.made) == 16
    (commit,) = FlakyConsumer.made[-1].commits
    assert commit[TopicPartition("words", 0)].offset == 5


def test_a_call_that_fails_past_the_outage_limit_names_the_brokers_and_what_to_check(
    upstream,
):
    FlakyConsumer.failures = ATTEMPTS_IN_AN_OUTAGE + 10
    began = FakeTime.now
    with pytest.raises(EnvironmentProblem) as raised:
        upstream.commit({("words", 0): (5, "")})
    message = str(raised.value)
    assert "127.0.0.1:1" in message and "a commit" in message
    assert "kafka.request.timeout.ms" in message
    assert OUTAGE_LIMIT_S < FakeTime.now - began <= OUTAGE_LIMIT_S + RETRY_PAUSE_S
    assert len(FlakyConsumer.made) == ATTEMPTS_IN_AN_OUTAGE + 1
    assert all(c.closed for c in FlakyConsumer.made)


def test_a_broker_back_just_inside_the_outage_limit_is_waited_for(upstream):
    FlakyConsumer.failures = ATTEMPTS_IN_AN_OUTAGE - 1
    upstream.commit({("words", 0): (5, "")})
    assert len(FlakyConsumer.made) == ATTEMPTS_IN_AN_OUTAGE


def test_a_commit_for_a_topic_the_brokers_no_longer_list_names_it_at_once(upstream, monkeypatch):
    """The brokers answer the listing, without the topic, while the commit times out (as
    kafka-python's does for a deleted topic): no outage to wait out, one attempt."""
    FlakyConsumer.failures, FlakyConsumer.listed = 0, {"other"}
    monkeypatch.setattr(FlakyConsumer, "commit", FlakyConsumer.timed_out)
    began = FakeTime.now
    with pytest.raises(EnvironmentProblem, match=r"topic 'words' \(option subscribe\) was deleted"):
        upstream.commit({("words", 0): (5, "")})
    assert len(FlakyConsumer.made) == 1 and FakeTime.now == began
