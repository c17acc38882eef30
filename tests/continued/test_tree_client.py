"""Trees continued in a plain Python consumer, end to end on the test broker: an
upstream topology writes to a topic with ``continue_trees``, a kafka-python consumer
acks or fails what it reads with ``TreeClient``, and the upstream offsets follow."""

import time
import uuid
from collections import Counter
from types import SimpleNamespace

import pytest
from pyspark.sql import functions as F

from ackstream import KafkaSink, Topology
from ackstream.channels.kafka import KafkaChannel
from ackstream.sinks.continued import TreeClient, lineage_headers
from ackstream.vocabulary.ids import root_ids
from ackstream.vocabulary.records import CAUGHT_UP

from helpers import consume, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.broker]

N = 20


class Pipeline:
    """``N`` records ``r0..r19`` upstream -> topology (upper-case) -> the middle topic,
    with open trees; :meth:`serve` is the plain consumer of the middle topic."""

    def __init__(self, spark, broker, new_topic, tmp_path, timeout_ms):
        from kafka import KafkaConsumer, KafkaProducer, TopicPartition

        self.bootstrap = broker.bootstrap
        self.inbox, self.middle = new_topic(), new_topic()
        self.name = f"xproc-{uuid.uuid4().hex[:8]}"
        producer = KafkaProducer(bootstrap_servers=self.bootstrap)
        for i in range(N):
            producer.send(self.inbox, value=f"r{i}".encode())
        producer.flush()
        producer.close()
        topology = (
            Topology(
                self.name,
                spark,
                KafkaChannel(self.bootstrap, self.name),
                message_timeout_ms=timeout_ms,
            )
            .map(lambda df: df.withColumn("value", F.upper(F.col("value").cast("string"))))
            .sink(KafkaSink(self.bootstrap, self.middle, continue_trees=True))
        )
        stream = topology.read_stream(
            {
                "kafka.bootstrap.servers": self.bootstrap,
                "subscribe": self.inbox,
                "startingOffsets": "earliest",
                "ackstream.retryInitialDelay": "200ms",
                "ackstream.maxRetries": "2",
            }
        )
        self.running = topology.start(stream, str(tmp_path / "checkpoint"), trigger_ms=300)
        self.group = KafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=f"ackstream-{self.name}",
            enable_auto_commit=False,
        )
        self.consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False)
        self.consumer.assign([TopicPartition(self.middle, 0)])
        self.consumer.seek_to_beginning()
        self.client = TreeClient(KafkaChannel(self.bootstrap, self.name))
        self.seen: Counter = Counter()  # middle-topic messages per value
        self.held: list = []  # messages neither acked nor failed yet

    def committed(self) -> int | None:
        from kafka import TopicPartition

        return self.group.committed(TopicPartition(self.inbox, 0))

    def serve(self, decide, until, what: str, timeout: float = 120):
        """Consume the middle topic, ``decide(value, times seen) -> "ack" | "fail" |
        None`` (hold) for each message, until ``until()``."""

        def step():
            assert self.running.exception() is None
            for records in self.consumer.poll(timeout_ms=200).values():
                for message in records:
                    value = message.value.decode()
                    self.seen[value] += 1
                    verdict = decide(value, self.seen[value])
                    if verdict == "ack":
                        assert self.client.ack(message) == 1
                    elif verdict == "fail":
                        assert self.client.fail(message, reason="refused by the consumer") == 1
                    else:
                        self.held.append(message)
            return until()

        wait_for(step, timeout=timeout, interval=0, what=what)

    def outcomes(self) -> Counter:
        """``(offset, attempt, status)`` of every upstream completion but the acker's
        ``caught_up`` echoes of ticks."""
        done, _ = KafkaChannel(self.bootstrap, self.name).completions_since(None)
        return Counter(
            (r["offset"], r["attempt"], r["status"])
            for r in done.to_pylist()
            if r["status"] != CAUGHT_UP
        )

    def close(self):
        self.running.stop()
        self.group.close(autocommit=False)
        self.consumer.close(autocommit=False)


@pytest.fixture
def pipeline(spark, broker, new_topic, tmp_path):
    made = []

    def make(timeout_ms=60_000):
        made.append(Pipeline(spark, broker, new_topic, tmp_path, timeout_ms))
        return made[0]

    yield make
    for p in made:
        p.close()


def acked_once_each(n=N):
    return Counter({(i, 0, "acked"): 1 for i in range(n)})


def test_upstream_offsets_are_committed_only_once_the_consumer_acked(pipeline):
    p = pipeline()
    first_half = {f"R{i}" for i in range(N // 2)}
    p.serve(
        lambda value, _: "ack" if value in first_half else None,
        until=lambda: (p.committed() or 0) >= N // 2,
        what="the first half committed",
    )
    # every message was written at once; only what the consumer acked is committed
    assert p.committed() == N // 2
    assert len(p.held) == N // 2
    p.client.ack(*p.held)
    p.serve(lambda *_: "ack", until=lambda: p.committed() == N, what="every offset committed")
    assert p.outcomes() == acked_once_each()
    assert p.seen == Counter({f"R{i}": 1 for i in range(N)})


def test_a_failed_message_replays_its_root_until_dead_lettered(pipeline):
    p = pipeline()
    p.serve(
        lambda value, _: "fail" if value == "R7" else "ack",
        until=lambda: p.committed() == N,
        what="every offset committed or dead-lettered",
    )
    outcomes = p.outcomes()
    assert {k: v for k, v in outcomes.items() if k[0] == 7} == {
        (7, a, "failed"): 1 for a in (0, 1, 2)
    }
    assert {k: v for k, v in outcomes.items() if k[0] != 7} == {
        k: v for k, v in acked_once_each().items() if k[0] != 7
    }
    assert p.seen == Counter({f"R{i}": 3 if i == 7 else 1 for i in range(N)})
    (letter,) = consume(p.bootstrap, f"{p.name}.dead")
    assert letter.value == b"r7"
    assert dict(letter.headers)["ackstream.reason"] == b"failed: refused by the consumer"


def test_a_fail_that_reaches_the_acker_before_its_tree_keeps_its_reason(pipeline):
    """The fails of R7's three attempts are written before the upstream topology reports
    those trees (attempts 1 and 2 are not even read yet): the acker holds each fail's
    reason until the tree's init comes, and the dead letter says it."""
    p = pipeline()
    attempts = root_ids(p.name, p.inbox, 0, [7, 7, 7], [0, 1, 2]).tolist()
    early = SimpleNamespace(headers=lineage_headers(attempts, edge=1))
    assert p.client.fail(early, reason="refused before the batch reported") == 1
    p.serve(
        lambda value, _: None if value == "R7" else "ack",
        until=lambda: p.committed() == N,
        what="every offset committed or dead-lettered",
    )
    outcomes = p.outcomes()
    assert {k: v for k, v in outcomes.items() if k[0] == 7} == {
        (7, a, "failed"): 1 for a in (0, 1, 2)
    }
    (letter,) = consume(p.bootstrap, f"{p.name}.dead")
    assert letter.value == b"r7"
    assert dict(letter.headers)["ackstream.reason"] == b"failed: refused before the batch reported"


def test_a_message_never_acked_times_out_and_is_replayed(pipeline):
    p = pipeline(timeout_ms=4_000)
    p.serve(
        lambda value, times: None if (value, times) == ("R5", 1) else "ack",
        until=lambda: p.committed() == N,
        what="every offset committed",
    )
    assert p.outcomes() == acked_once_each() - Counter({(5, 0, "acked"): 1}) + Counter(
        {(5, 0, "timed_out"): 1, (5, 1, "acked"): 1}
    )
    assert p.seen == Counter({f"R{i}": 2 if i == 5 else 1 for i in range(N)})


@pytest.mark.e2e  # waits out message timeouts
def test_a_consumer_resetting_the_timeout_keeps_a_slow_message_alive(pipeline):
    """Storm's resetTimeout from a plain consumer: R5's work takes 2.5 message timeouts,
    the consumer resets its tree's timeout every quarter of one, then acks: acked at its
    first attempt, never timed out, never replayed, and its offset committed only then."""
    timeout_s = 6
    p = pipeline(timeout_ms=timeout_s * 1000)
    p.serve(
        lambda value, _: None if value == "R5" else "ack",
        until=lambda: len(p.seen) == N and p.committed() == 5,
        what="every other message acked and the commit held at R5",
    )
    (slow,) = p.held
    began = time.monotonic()
    while time.monotonic() - began < 2.5 * timeout_s:  # the slow work itself
        assert p.client.reset_timeout(slow) == 1
        assert p.running.exception() is None
        time.sleep(timeout_s / 4)
    assert p.committed() == 5  # still held: alive, not acked
    p.client.ack(slow)
    wait_for(lambda: p.committed() == N, timeout=60, interval=0.2, what="R5 committed")
    outcomes = p.outcomes()
    # the acker's answers to the resets, naming R5's coordinates for the source
    alive = outcomes.pop((5, 0, "alive"), 0)
    assert outcomes == acked_once_each()
    assert alive >= 2  # resets past the first timeout reached the acker, which held R5
    assert p.seen == Counter({f"R{i}": 1 for i in range(N)})
