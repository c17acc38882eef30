"""The chaos suite's driver: test_end_to_end's topology in a process of its own, run until killed.

    python tests/fault_driver.py BOOTSTRAP INPUT_TOPIC OUTPUT_TOPIC TOPOLOGY CHECKPOINT_DIR

Sentences -> words -> (optionally) a flaky bolt failing a fraction of first attempts
-> a pandas bolt that always fails the word "poison" (so one record is dead-lettered
after its retries) -> per-batch counts per (word, record) -> Kafka sink, keyed by the
word, valued ``partition:offset``, so that a duplicate in the output can be counted.
The ack and completion channels are on the same broker. Unless told otherwise the
acker query runs here too, so a SIGKILL of this process group is a crash of the
driver and of the acker at once; both resume from ``CHECKPOINT_DIR``.

``ACKSTREAM_FAULT_SETTINGS``, a JSON object, changes the run: ``build``'s keyword
arguments (``fail_rate``, ``per_batch``, ``ack_mode``, ...), ``"acker": false`` (an
``ackstream acker`` process runs it), and ``"kill_after_sink": N``: the driver
SIGKILLs its own process group right after the N-th sink write returns, before that
batch's completions are written, the window the topology's ordering guarantee is about.
``ACKSTREAM_FAULT_MASTER`` (a ``spark://`` URL) runs the application on that standalone
cluster instead of ``local[2]``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from pyspark.sql import functions as F

import ackstream
from ackstream import KafkaSink, Topology
from ackstream.channels.kafka import KafkaChannel
from ackstream.sinks.base import Sink

from helpers import spark_kafka_conf

#: Timeouts kept short so that a killed run's lost roots replay within seconds.
MESSAGE_TIMEOUT_MS = 5_000
SOURCE_TIMEOUT = "20s"


def build(
    spark,
    bootstrap: str,
    inbox: str,
    outbox: str,
    name: str,
    message_timeout_ms: int = MESSAGE_TIMEOUT_MS,
    source_timeout: str = SOURCE_TIMEOUT,
    per_batch: int = 10,
    ack_mode: str = "telescoped",
    fail_rate: float = 0.0,
    kafka_options: dict | None = None,
    stage_counts: bool = False,
    window: str | None = None,
):
    """The tracked input stream and the topology (tests run it in-process too).
    ``ack_mode="per_stage"`` puts every tree on the acker query's path; ``fail_rate``
    is the fraction of words whose first attempt fails (reason ``flaky``);
    ``kafka_options`` (``kafka.*`` client settings) go to the source, the channel and
    the sink alike; ``window`` (a duration) counts the words in processing-time
    windows across batches instead of per batch and record (valued by the count)."""
    kafka_options = kafka_options or {}

    def refuse_poison(frame):
        """A pandas bolt that always fails on the poison word (defined here, so that it is
        pickled by value: Spark's Python workers cannot import this script)."""
        if (frame["word"] == "poison").any():
            raise ValueError("poison word")
        return frame[["word", "record"]]

    record = F.concat_ws(":", F.col("partition").cast("string"), F.col("offset").cast("string"))
    topology = (
        Topology(
            name,
            spark,
            KafkaChannel(bootstrap, name, kafka_options=kafka_options),
            ack_mode=ack_mode,
            message_timeout_ms=message_timeout_ms,
            stage_counts=stage_counts,
        )
        .map(lambda df: df.withColumn("line", F.col("value").cast("string")))
        .explode(F.split("line", " "), "word")
        .map(lambda df: df.withColumn("record", record))
    )
    if fail_rate:
        topology = topology.fail_where(
            (F.col("_attempt") == 0) & (F.rand() < fail_rate), "flaky", name="flaky"
        )
    topology = topology.pandas_bolt(
        refuse_poison, "word string, record string", name="refuse_poison"
    )
    if window is None:
        topology = topology.aggregate(["word", "record"], F.count("*").alias("n"))
        value = F.col("record")
    else:
        topology = topology.window("word", F.count("*").alias("n"), duration=window)
        value = F.col("n").cast("string")
    topology = topology.map(
        lambda df: df.withColumn("key", F.col("word")).withColumn("value", value)
    ).sink(KafkaSink(bootstrap, outbox, kafka_options=kafka_options))
    stream = topology.read_stream(
        {
            **kafka_options,
            "kafka.bootstrap.servers": bootstrap,
            "subscribe": inbox,
            "startingOffsets": "earliest",
            "ackstream.sourceTimeout": source_timeout,
            "maxOffsetsPerTrigger": per_batch,  # spread the input over many batches
            "ackstream.retryInitialDelay": "200ms",
            "ackstream.maxRetries": "2",
            **kafka_options,
        }
    )
    return stream, topology


class KillAfterSink(Sink):
    """A sink that SIGKILLs this process group after its ``n``-th write returned."""

    def __init__(self, sink, n: int):
        self.sink, self.n, self.writes = sink, n, 0

    def write(self, outputs, batch_id):
        unwritten = self.sink.write(outputs, batch_id)
        self.writes += 1
        if self.writes == self.n:
            print(f"fault_driver: killing itself after sink write {self.n}", flush=True)
            os.killpg(os.getpgrp(), signal.SIGKILL)
        return unwritten


def start(spark, bootstrap: str, inbox: str, outbox: str, name: str, checkpoint: str):
    settings = json.loads(os.environ.get("ACKSTREAM_FAULT_SETTINGS") or "{}")
    kill_after, acker = settings.pop("kill_after_sink", 0), settings.pop("acker", True)
    stream, topology = build(spark, bootstrap, inbox, outbox, name, **settings)
    if kill_after:
        topology.sinks[0].sink = KillAfterSink(topology.sinks[0].sink, kill_after)
    return topology.start(stream, checkpoint, trigger_ms=300, acker=acker)


def main(bootstrap: str, inbox: str, outbox: str, name: str, checkpoint: str) -> None:
    master = os.environ.get("ACKSTREAM_FAULT_MASTER")
    if master:
        from spark_cluster import APPLICATION_CONF

        conf = {**APPLICATION_CONF, **spark_kafka_conf()}
        spark = ackstream.local_session(f"fault-{name}", master=master, conf=conf)
    else:
        spark = ackstream.local_session(f"fault-{name}", cores=2, conf=spark_kafka_conf())
    running = start(spark, bootstrap, inbox, outbox, name, checkpoint)
    print("fault_driver: started", flush=True)
    while running.is_active():
        time.sleep(0.5)
    error = running.exception()
    print(f"fault_driver: a query stopped: {error}", flush=True)
    running.stop()
    sys.exit(1)


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    main(*sys.argv[1:])
