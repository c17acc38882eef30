"""The fault suite's driver: test_end_to_end's topology in a process of its own, run until killed.

    python tests/fault_driver.py BOOTSTRAP INPUT_TOPIC OUTPUT_TOPIC TOPOLOGY CHECKPOINT_DIR

Sentences -> words -> a pandas bolt that always fails the word "poison" (so one
record is dead-lettered after its retries) -> per-batch counts -> Kafka sink, with
the ack and completion channels on the same broker. The topology query and the
acker query both run here, so a SIGKILL of this process group is a crash of the
driver and of the acker at once; both resume from ``CHECKPOINT_DIR``. (Telescoped,
the topology settles its trees itself; the acker query then gets only ticks.)

With ``ACKSTREAM_FAULT_KILL_AFTER_SINK=N`` the driver SIGKILLs its own process
group right after the N-th sink write returns, before that batch's completions
are written: the window the topology's ordering guarantee is about.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from pyspark.sql import functions as F

import ackstream
from ackstream import KafkaSink, Topology
from ackstream.channels.kafka import KafkaChannel

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
):
    """The tracked input stream and the topology (the fault tests run it in-process too).
    ``ack_mode="per_stage"`` puts every tree on the acker query's path."""

    def refuse_poison(frame):
        """A pandas bolt that always fails on the poison word (defined here, so that it is
        pickled by value: Spark's Python workers cannot import this script)."""
        if (frame["word"] == "poison").any():
            raise ValueError("poison word")
        return frame[["word"]]

    topology = (
        Topology(
            name,
            spark,
            KafkaChannel(bootstrap, name),
            ack_mode=ack_mode,
            message_timeout_ms=message_timeout_ms,
        )
        .map(lambda df: df.withColumn("line", F.col("value").cast("string")))
        .explode(F.split("line", " "), "word")
        .pandas_bolt(refuse_poison, "word string", name="refuse_poison")
        .aggregate("word", F.count("*").cast("string").alias("n"))
        .map(lambda df: df.withColumn("key", F.col("word")).withColumn("value", F.col("n")))
        .sink(KafkaSink(bootstrap, outbox))
    )
    stream = topology.read_stream(
        {
            "kafka.bootstrap.servers": bootstrap,
            "subscribe": inbox,
            "startingOffsets": "earliest",
            "ackstream.sourceTimeout": source_timeout,
            "maxOffsetsPerTrigger": per_batch,  # spread the input over many batches
            "ackstream.retryInitialDelay": "200ms",
            "ackstream.maxRetries": "2",
        }
    )
    return stream, topology


class KillAfterSink:
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
    stream, topology = build(spark, bootstrap, inbox, outbox, name)
    kill_after = int(os.environ.get("ACKSTREAM_FAULT_KILL_AFTER_SINK", "0"))
    if kill_after:
        topology.sinks[0].sink = KillAfterSink(topology.sinks[0].sink, kill_after)
    return topology.start(stream, checkpoint, trigger_ms=300)


def main(bootstrap: str, inbox: str, outbox: str, name: str, checkpoint: str) -> None:
    spark = ackstream.local_session(f"fault-{name}", cores=2)
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
