"""Helpers shared by test modules: polling, the generator source, Kafka reads."""

from __future__ import annotations

import glob
import json
import os
import time

import pytest

WORDS = [
    "storm",
    "spark",
    "acker",
    "tuple",
    "bolt",
    "spout",
    "anchor",
    "ledger",
    "replay",
    "offset",
]


def spark_examples(max_examples: int):
    """Hypothesis settings for a property whose every example runs Spark batches: few
    examples, no deadline and no shrinking, each example taking seconds."""
    from hypothesis import HealthCheck, Phase, settings

    return settings(
        max_examples=max_examples,
        deadline=None,
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
        suppress_health_check=[HealthCheck.too_slow],
    )


def wait_for(condition, timeout: float = 60.0, interval: float = 0.1, what: str = "condition"):
    """Poll ``condition()`` until it returns a truthy value; fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def spark_kafka_jars() -> list[str]:
    """The jars of Spark's Kafka connector ``make spark-kafka`` resolved (the newest
    version there), or none: the suite then runs every topology on the Python reader."""
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache")
    for folder in sorted(glob.glob(os.path.join(root, "spark-kafka-*", "jars")), reverse=True):
        if os.path.exists(os.path.join(folder, ".resolved")):
            return sorted(glob.glob(os.path.join(folder, "*.jar")))
    return []


def spark_kafka_conf() -> dict[str, str]:
    """A session's setting that gives it Spark's Kafka connector, when resolved."""
    jars = spark_kafka_jars()
    return {"spark.jars": ",".join(jars)} if jars else {}


def commits(channel_dir):
    try:
        with open(os.path.join(channel_dir, "generator-commits.json")) as f:
            return {k: v[0] for k, v in json.load(f).items()}
    except FileNotFoundError:
        return {}


def group_commits(bootstrap: str, topology: str, topic: str) -> dict[int, int | None]:
    """The offsets of ``topic`` the source of ``topology`` committed (its consumer group
    ``ackstream-<topology>``), by partition; None for a partition it has not committed."""
    from kafka import KafkaConsumer, TopicPartition

    group = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=f"ackstream-{topology}", enable_auto_commit=False
    )
    try:
        partitions = sorted(group.partitions_for_topic(topic))
        return {p: group.committed(TopicPartition(topic, p)) for p in partitions}
    finally:
        group.close(autocommit=False)


def generator_stream(spark, channel_dir, **options):
    """The ``ackstream`` source over the generator, ``options`` as ``ackstream.<name>``."""
    reader = (
        spark.readStream.format("ackstream")
        .option("ackstream.upstream", "generator")
        .option("ackstream.channel", channel_dir)
    )
    for name, value in options.items():
        reader = reader.option(f"ackstream.{name}", value)
    return reader.load()


def sentences(n):
    return [
        " ".join(WORDS[(i * 7 + k) % len(WORDS)] + str(i % 4) for k in range(3 + i % 4))
        for i in range(n)
    ]


def consume(bootstrap, topic, quiet_s: float = 0.0, timeout_s: float = 60.0):
    """Every message of ``topic``, from the start of each partition up to its end when
    called (none if the topic does not exist): its partitions are assigned, not
    subscribed, and the read stops at the end offsets, so it waits neither for a group
    nor for a quiet spell. ``quiet_s``: then go on reading until no message came for
    that long, for a check that nothing more arrives (a write still in flight);
    a read that gets no message for ``timeout_s`` before the end fails the test."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        numbers = consumer.partitions_for_topic(topic) or ()
        parts = [TopicPartition(topic, p) for p in sorted(numbers)]
        if not parts:
            return []
        ends = consumer.end_offsets(parts)
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        messages, deadline = [], time.monotonic() + timeout_s
        quiet_since = None
        while True:
            if time.monotonic() > deadline:
                pytest.fail(f"no message of {topic} for {timeout_s}s before its end {ends}")
            if all(consumer.position(p) >= ends[p] for p in parts):
                if quiet_since is None:
                    quiet_since = time.monotonic()
                if time.monotonic() - quiet_since >= quiet_s:
                    return messages
            polled = [m for batch in consumer.poll(timeout_ms=100).values() for m in batch]
            if polled:
                messages += polled
                quiet_since, deadline = None, time.monotonic() + timeout_s
    finally:
        consumer.close()


def first_outcomes(bootstrap: str, topology: str):
    """The completions of ``topology`` (on the Kafka channel) and the messages of its
    dead-letter topic, with when each ``(partition, offset)`` was first acked and when
    first dead-lettered (ms): what the fault and chaos runs check their end state by."""
    from ackstream.channels.kafka import KafkaChannel

    rows = KafkaChannel(bootstrap, topology).completions_since(None)[0].to_pylist()
    first_ack: dict[tuple[int, int], int] = {}
    for r in rows:
        if r["status"] == "acked":
            key = (r["partition"], r["offset"])
            first_ack[key] = min(first_ack.get(key, r["completed_ms"]), r["completed_ms"])
    letters = consume(bootstrap, f"{topology}.dead")
    dead: dict[tuple[int, int], int] = {}
    for letter in letters:
        headers = {k: v.decode() for k, v in letter.headers}
        key = (int(headers["ackstream.partition"]), int(headers["ackstream.offset"]))
        dead[key] = min(dead.get(key, letter.timestamp), letter.timestamp)
    return rows, first_ack, letters, dead


def produce(
    bootstrap: str, topic: str, values, partition: int = 0, round_robin: int | None = None
) -> None:
    """Write ``values`` (strings) to one partition of ``topic``, in order, and wait for
    them; ``round_robin=N``: the i-th value to partition ``i % N`` instead."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        for i, value in enumerate(values):
            to = partition if round_robin is None else i % round_robin
            producer.send(topic, value=value.encode(), partition=to)
        producer.flush()
    finally:
        producer.close()


def start_two_shard_acker(
    spark, channel, checkpoint, message_timeout_ms: int, trigger_ms: int = 100
):
    """The acker query on ``channel`` with two shards, checkpointed at ``checkpoint``: the
    acker a test of the source or the channels runs beside what it checks."""
    from ackstream.acker.query import start_acker

    return start_acker(
        spark,
        channel,
        checkpoint=str(checkpoint),
        ackers=2,
        message_timeout_ms=message_timeout_ms,
        trigger_ms=trigger_ms,
    )


def start_foreach_batch(frame, handler, checkpoint):
    """A query that hands each micro-batch of ``frame`` to ``handler`` every 200 ms."""
    return (
        frame.writeStream.foreachBatch(handler)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def from_earliest(bootstrap: str, topic: str, **options) -> dict:
    """Source options that read ``topic`` on ``bootstrap`` from its earliest offsets,
    and ``options`` (by their full names)."""
    return {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topic,
        "startingOffsets": "earliest",
        **options,
    }


def tracked_kafka_stream(spark, bootstrap: str, topic: str, topology: str, channel, **options):
    """The ``ackstream`` source of ``topology`` on ``topic`` from its earliest offsets, its
    acks on ``channel`` (a directory, or ``kafka``); ``options`` by their full names."""
    tracked = {"ackstream.topology": topology, "ackstream.channel": str(channel), **options}
    return (
        spark.readStream.format("ackstream")
        .options(**from_earliest(bootstrap, topic, **tracked))
        .load()
    )


def start_on_generator(topology, checkpoint, count: int, **options):
    """Start ``topology`` on ``count`` records of the generator in one partition, a
    trigger every 200 ms; ``options``: more source options, by their full names."""
    stream = topology.read_stream(
        {
            "ackstream.upstream": "generator",
            "ackstream.generator.count": str(count),
            "ackstream.generator.partitions": "1",
            **options,
        }
    )
    return topology.start(stream, str(checkpoint), trigger_ms=200)


def producer_threads() -> set:
    """The threads of this process's open kafka-python producers (their sender)."""
    import threading

    return {t for t in threading.enumerate() if t.name.startswith("kafka-python-producer-")}


def stop_once_settled(running, records: int, timeout_s: float, still_active: bool = False):
    """Wait until ``records`` of the started topology ``running`` are settled, then stop
    it, also when the wait fails; the source's figures. ``still_active``: check too that
    the topology still runs once they are (a failure it survived did not stop it)."""
    from ackstream.testing import wait_until_settled

    try:
        figures = wait_until_settled(running, records=records, timeout_s=timeout_s)
        if still_active:
            assert running.is_active()
        return figures
    finally:
        running.stop()


def stop_once_held(running, name: str, channel_dir, checkpoint, stage: str, tuples: int):
    """Wait until stage ``stage`` of the started topology ``name`` holds ``tuples``
    tuples in ``checkpoint`` and the acker has read their open trees (as many roots
    pending on ``channel_dir``), then stop it, also when a wait fails."""
    from ackstream.ui.status_sources import held_in, local_status

    try:
        wait_for(
            lambda: (
                held_in(checkpoint).get(stage, {}).get("tuples") == tuples or running.exception()
            ),
            timeout=120,
            what=f"{tuples} tuples held",
        )
        assert running.exception() is None
        wait_for(
            lambda: local_status(channel_dir, name).pending == tuples,
            what=f"{tuples} roots pending",
        )
    finally:
        running.stop()


def new_inbox(broker, new_topic, prefix: str, values) -> tuple[str, str]:
    """A new one-partition topic holding ``values`` (strings, in order) and a new topology
    name starting with ``prefix``, to read it with."""
    import uuid

    inbox, name = new_topic(partitions=1), f"{prefix}-{uuid.uuid4().hex[:8]}"
    produce(broker.bootstrap, inbox, values)
    return inbox, name


def run_on_kafka(topology, bootstrap: str, topic: str, checkpoint, records: int, **options):
    """Start ``topology`` on ``topic`` from its earliest offset, two records a batch, wait
    until its ``records`` are settled (acked or dead-lettered and committed), and stop it;
    the offsets its group committed (:func:`group_commits`). ``options``: more source
    options (``ackstream.*``)."""
    stream = topology.read_stream(
        from_earliest(bootstrap, topic, **{"maxOffsetsPerTrigger": "2", **options})
    )
    stop_once_settled(topology.start(stream, str(checkpoint), trigger_ms=200), records, 300)
    return group_commits(bootstrap, topology.name, topic)


def through_ledger(batches, timeout_ms: int = 60_000):
    """Each batch's ack records (Arrow) through the acker's ledger in turn, as the acker
    query would: the outcome per root that completed, and the roots still pending."""
    from ackstream.acker.ledger import Pending, step

    pending, outcome = Pending.empty(0), {}
    for i, records in enumerate(batches):
        pending, done = step(pending, records.to_pandas(), i, timeout_ms)
        outcome.update(zip(done["root"], done["status"]))
    return outcome, set(pending.values())


def delete_topic(bootstrap: str, topic: str) -> None:
    """Delete ``topic`` and wait until the brokers no longer list it."""
    from kafka import KafkaConsumer
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_topics([topic])
    finally:
        admin.close()
    lister = KafkaConsumer(bootstrap_servers=bootstrap, allow_auto_create_topics=False)
    try:
        wait_for(lambda: topic not in lister.topics(), timeout=30, what=f"{topic} deleted")
    finally:
        lister.close()


def logged_offset(**fields):
    """A :class:`BatchOffset` read from the JSON fields ``fields``, as Spark logs them,
    those a test leaves out filled in: no partitions, and for a tracked offset (one
    that names ``source`` or ``ids``) the channel ``kafka`` and a 30 s timeout."""
    from ackstream.vocabulary.batch_offset import BatchOffset

    value = {"v": 1, "parts": {}, **fields}
    if "source" in value or "ids" in value:
        names = value.get("source", value.get("ids"))
        value = {"source": names, "ids": names, "channel": "kafka", "timeout": 30_000, **value}
    return BatchOffset.from_json(value)


def logged_parts(tracker):
    """``tracker``'s snapshot as a restart reads it back: through an offset's JSON."""
    from ackstream.vocabulary.batch_offset import BatchOffset

    return BatchOffset.from_json(json.dumps(BatchOffset(tracker.snapshot()).to_json())).parts


def scheduled(tracker):
    """``(attempt, due_ms)`` of each record ``tracker`` holds for a replay, by ``(tp, offset)``."""
    part, offset, attempt, due, _ = tracker.waiting.columns()
    tps = tracker.partitions
    return {
        (tps[p], o): (a, d)
        for p, o, a, d in zip(part.tolist(), offset.tolist(), attempt.tolist(), due.tolist())
    }


def suspects(tracker):
    """The group of each record waiting for a replay with its group, by ``(tp, offset)``."""
    from ackstream.sources.waiting import NO_GROUP

    part, offset, _, _, group = tracker.waiting.columns()
    grouped = group != NO_GROUP
    tps = tracker.partitions
    return {
        (tps[p], o): g for p, o, g in zip(*(c[grouped].tolist() for c in (part, offset, group)))
    }


def uncharged(tracker):
    """Attempts not charged to its retries, by ``(tp, offset)`` of each record with any."""
    kept = tracker.unfinished(flying=False)
    columns = (kept.uncharged.part, kept.uncharged.offset, kept.uncharged.attempts)
    return {(kept.tps[p], o): n for p, o, n in zip(*(c.tolist() for c in columns))}


def done_offsets(runs):
    """Every offset of done runs (a :class:`~ackstream.sources.done_runs.DoneRuns`), sorted."""
    return [o for a, b in zip(runs.starts.tolist(), runs.ends.tolist()) for o in range(a, b)]
