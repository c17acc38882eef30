"""What isolating one raising record writes, on the fast path (Spark's Kafka connector
reads and writes, the Kafka channel): every other record's output, each at most twice.

A SQL stage raising on one record fails its batch's Spark job; the job's tasks wrote
their rows up to the failure (the rows before the poison in its task, the other tasks'
in full), and the rounds of isolation write them again as their groups go through. A
round's group that fails writes nothing (``ackstream.topology.isolation_round``), so
no output is written a third time. Duplicates are output messages beyond one per
acked record.
"""

from __future__ import annotations

import statistics
import uuid
from collections import Counter

import pytest
from pyspark.sql import functions as F
from test_failure_path import dead_letters, produce_many, settle, start

from ackstream import KafkaChannel, KafkaSink, Topology
from ackstream.spark.session import has_kafka_connector
from ackstream.vocabulary.batch_offset import BatchOffset

from helpers import consume

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def round_times(progress: list[dict]) -> list[float]:
    """The seconds each batch that replayed records took (its ``addBatch``)."""
    times = []
    for p in progress:
        end = p["sources"][0].get("endOffset") if p.get("sources") else None
        if end and BatchOffset.from_json(end).replays:
            times.append(p["durationMs"].get("addBatch", 0) / 1000)
    return times


def isolate_one_poison(spark, broker, new_topic, tmp_path, records, partitions, poison):
    """``records`` in one batch over ``partitions`` (record ``i`` in partition ``i %
    partitions``, at offset ``i // partitions``), record ``poison`` failing a SQL
    stage: the figures of the run once every record is acked or dead-lettered."""
    if not has_kafka_connector(spark):
        pytest.skip("Spark's Kafka connector is not resolved (make spark-kafka)")
    inbox, out = new_topic(partitions=partitions), new_topic(partitions=2)
    name = f"poison-{uuid.uuid4().hex[:8]}"
    produce_many(broker.bootstrap, inbox, records, partitions)
    bad = f"v{poison}"

    def checked(df):
        text = F.col("value").cast("string")
        return df.withColumn(
            "value", F.when(text == bad, F.raise_error(F.lit("poison in SQL"))).otherwise(text)
        )

    topology = (
        Topology(name, spark, KafkaChannel(broker.bootstrap, name))
        .map(checked, name="check")
        .sink(KafkaSink(broker.bootstrap, out, writer="spark"))
    )
    options = {"ackstream.maxRetries": 1}
    running = start(topology, broker, inbox, tmp_path / "ck", records, **options)
    try:
        figures = settle(running, records, timeout_s=900)
        assert running.is_active()
        times = round_times(running.query.recentProgress)
    finally:
        running.stop()
    written = Counter(m.value.decode() for m in consume(broker.bootstrap, out))
    letters = dead_letters(broker.bootstrap, f"{name}.dead")
    assert figures["acked"] == records - 1 and figures["dead_lettered"] == 1
    assert len(letters) == 1 and "poison in SQL" in next(iter(letters.values()))
    assert set(written) == {f"v{i}" for i in range(records)} - {bad}  # nothing lost
    messages = sum(written.values())
    found = {
        "messages": messages,
        "acked": figures["acked"],
        "duplicates": messages - figures["acked"],
        "most_copies": max(written.values()),
        "replaying_batches": len(times),
        "replaying_s_median": round(statistics.median(times), 3) if times else None,
        "replaying_s_total": round(sum(times), 2),
    }
    print(f"one poison among {records} over {partitions} partition(s): {found}")
    return found


@pytest.mark.e2e
def test_isolating_one_poison_writes_nothing_a_third_time(spark, broker, new_topic, tmp_path):
    """One partition, the poison at offset 240: the failed batch's job wrote the 240
    rows before it; the rounds' groups that held it (of 250, then 32, ...) fail too,
    and write none of their rows again, so the only duplicates are those 240."""
    figures = isolate_one_poison(spark, broker, new_topic, tmp_path, 2_000, 1, poison=240)
    assert figures["most_copies"] <= 2, figures
    assert figures["duplicates"] <= 240, figures


@pytest.mark.long
def test_isolating_one_poison_among_20000(spark, broker, new_topic, tmp_path):
    """At the benchmarks' size, two partitions, the poison at offset 3,700 of partition
    0: the failed job can write partition 1's 10,000 rows and the 3,700 before the
    poison; the rounds write none of them a third time."""
    figures = isolate_one_poison(spark, broker, new_topic, tmp_path, 20_000, 2, poison=7_400)
    assert figures["most_copies"] <= 2, figures
    assert figures["duplicates"] <= 10_000 + 3_700, figures
