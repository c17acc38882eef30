"""The systems of the end-to-end benchmark (``e2e.py``), each doing the same work in its
natural form, and the worker process that runs them on the benchmark's command.

The work: read the input topic with the job's consumer group in batches of at most
``max_per_batch`` records, split each sentence into words, count the words of the
batch, write the counts (key = word, value = the count as a string) to the output
topic, then commit the batch's input offsets to the group.

A worker reads jobs as JSON lines on its stdin (a job, then ``{"stop": true}``), runs
one at a time and writes ``started`` and ``finished`` events as JSON lines on its
stdout; it ends when its stdin closes. The Spark systems share the worker's one Spark
session, made at the first of them.

    python benchmarks/e2e_systems.py   (started by e2e.py)
"""

from __future__ import annotations

import collections
import functools
import glob
import json
import os
import queue
import statistics
import sys
import threading
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

SYSTEMS = (
    "ackstream_kafka",
    "ackstream_kafka_python_reader",
    "ackstream_kafka_window",
    "ackstream_local",
    "ackstream_untracked",
    "spark_kafka",
    "quix",
    "kafka_python_loop",
)
SPARK_SYSTEMS = SYSTEMS[:6]
TRACKED, UNTRACKED = "ackstream_kafka", "ackstream_untracked"
#: the tracked pipeline with a time window after the count: what holding costs
WINDOWED = "ackstream_kafka_window"
#: the window's length: its rows' records stay pending this long
WINDOW_DURATION = "2s"
#: the tracked pipeline with every record read by the source's Python read tasks
PYTHON_READER = "ackstream_kafka_python_reader"
MARK = "e2e"  # the key of the worker's event lines on its stdout (Spark's JVM shares it)
MESSAGE_TIMEOUT_MS = 120_000  # nothing may time out in a run: a replay would be a bug here
SPARK_KAFKA_PREFIX = os.path.join(ROOT, ".cache", "spark-kafka-")
SPARK_CONF = {"spark.sql.streaming.numRecentProgressUpdates": 10_000}


def spark_kafka_jars() -> list[str]:
    """The jars ``make spark-kafka`` resolved (the newest version present), or []."""
    for folder in sorted(glob.glob(SPARK_KAFKA_PREFIX + "*/jars"), reverse=True):
        if os.path.exists(os.path.join(folder, ".resolved")):
            return sorted(glob.glob(os.path.join(folder, "*.jar")))
    return []


def main() -> None:
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr  # whatever else prints goes to the log
    jobs: queue.Queue = queue.Queue()
    stop = threading.Event()

    def read_stdin() -> None:
        for line in sys.stdin:
            job = json.loads(line)
            if job.get("stop"):
                stop.set()
            else:
                jobs.put(job)
        stop.set()
        jobs.put(None)

    def emit(name: str, **fields) -> None:
        out.write(json.dumps({MARK: name, "t": time.time(), **fields}) + "\n")
        out.flush()

    threading.Thread(target=read_stdin, daemon=True).start()
    spark = None
    while (job := jobs.get()) is not None:
        stop.clear()
        a = types.SimpleNamespace(**job)
        started = functools.partial(emit, "started")
        print(f"e2e worker: {a.system} over {a.input}", flush=True)
        if a.system in SPARK_SYSTEMS:
            spark = spark or spark_session()
            work = work_spark_kafka if a.system == "spark_kafka" else work_ackstream
            summary = work(spark, a, stop, started)
        elif a.system == "quix":
            summary = work_quix(a, stop, started)
        else:
            summary = work_kafka_python(a, stop, started)
        emit("finished", **summary)
    if spark is not None:
        spark.stop()


def spark_session():
    """The worker's session: ackstream's local session, with Spark's Kafka connector
    when ``make spark-kafka`` resolved it (the same session for every Spark system)."""
    from ackstream import local_session

    jars = ",".join(spark_kafka_jars())
    return local_session("e2e", conf={**SPARK_CONF, **({"spark.jars": jars} if jars else {})})


def compilations(spark) -> int:
    """How many classes Spark's code generation has compiled in this JVM so far: a plan
    whose generated code differs from every earlier one (a long literal is written into
    the code) costs a compile and a new class that the JIT has to warm up again."""
    jvm = spark._jvm  # noqa: SLF001 - Spark's metrics have no Python API
    return jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME().getCount()


def spark_summary(spark, query, warmup_batches: int, compiled_before: int) -> dict:
    """Batches, the median of each of Spark's phases (``addBatch``: the batch's work)
    over the batches after the warm-up, from the query's progress, and the classes
    compiled per batch since the run began."""
    # a batch that ran (Spark's reader leaves numInputRows to the replays alone)
    batches = [p for p in query.recentProgress if p["durationMs"].get("addBatch")]
    timed = batches[warmup_batches:] or batches
    compiled = compilations(spark) - compiled_before
    return {
        "batches": len(batches),
        "compilations_per_batch": round(compiled / max(len(batches), 1), 1),
        "phase_ms_median": {
            phase: statistics.median(p["durationMs"].get(phase, 0) for p in timed)
            for phase in (timed[0]["durationMs"] if timed else ())
        },
        "progress": [{"timestamp": p["timestamp"], **p["durationMs"]} for p in batches],
    }


def run_until_stopped(query, stop: threading.Event) -> None:
    while not stop.wait(0.1):
        if query.exception():
            raise RuntimeError(f"query failed: {query.exception()}")


def work_ackstream(spark, a, stop, started) -> dict:
    """The README's pipeline: tracked with the Kafka or the local channel, or untracked;
    the records read by Spark's Kafka source (``read_stream`` chooses it: the session
    has the connector), or by the source's Python read tasks."""
    from pyspark.sql import functions as F

    from ackstream import KafkaChannel, KafkaSink, LocalChannel, Topology

    tracking = a.system != UNTRACKED
    if a.system in (TRACKED, PYTHON_READER, WINDOWED):
        channel = KafkaChannel(a.bootstrap, a.name)
    else:
        channel = LocalChannel(os.path.join(a.workdir, "channel"))
    topology = (
        Topology(a.name, spark, channel, message_timeout_ms=MESSAGE_TIMEOUT_MS, tracking=tracking)
        .map(lambda df: df.withColumn("line", F.col("value").cast("string")))
        .explode(F.split("line", " "), "word")
        .aggregate("word", F.count("*").alias("n"))
    )
    if a.system == WINDOWED:  # the batch's counts summed per word over 2 s windows
        topology = topology.window("word", F.sum("n").alias("n"), duration=WINDOW_DURATION)
    topology = topology.map(
        lambda df: df.selectExpr("*", "word AS key", "CAST(n AS STRING) AS value")
    ).sink(KafkaSink(a.bootstrap, a.output))
    options = {
        "kafka.bootstrap.servers": a.bootstrap,
        "subscribe": a.input,
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": a.max_per_batch,
        "kafka.group.id": a.group,
        **({"ackstream.recordReader": "python"} if a.system == PYTHON_READER else {}),
        **a.ackstream_options,
    }  # the topology adds its name, channel and tracking
    checkpoint = os.path.join(a.workdir, "checkpoint")
    compiled_before = compilations(spark)
    running = topology.start(topology.read_stream(options), checkpoint, trigger_ms=a.trigger_ms)
    try:
        started()
        run_until_stopped(running, stop)
        reader = topology.source_config.record_reader if topology.source_config else None
        summary = spark_summary(spark, running.query, a.warmup_batches, compiled_before)
        return {**summary, "record_reader": reader}
    finally:
        running.stop()


def work_spark_kafka(spark, a, stop, started) -> dict:
    """Spark's own source and sink: one job per batch, then the batch's end offsets, as
    Spark logged them before running it, committed to the group."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata
    from pyspark.sql import functions as F

    from ackstream.offset_log import source_offsets
    from ackstream.sources.kafka_ranges import EXECUTOR_DEFAULTS

    checkpoint = os.path.join(a.workdir, "checkpoint")
    committer = KafkaConsumer(
        bootstrap_servers=a.bootstrap, group_id=a.group, enable_auto_commit=False
    )
    parts = committer.partitions_for_topic(a.input) or ()
    committer.assign([TopicPartition(a.input, p) for p in parts])

    def write_then_commit(df, batch_id):
        words = df.select(F.explode(F.split(F.col("value").cast("string"), " ")).alias("word"))
        (
            words.groupBy("word")
            .count()
            .selectExpr("word AS key", "CAST(count AS STRING) AS value")
            .write.format("kafka")
            .option("kafka.bootstrap.servers", a.bootstrap)
            .option("topic", a.output)
            .save()
        )
        (ends,) = source_offsets(df.sparkSession, checkpoint, batch_id)  # {topic: {p: next}}
        committer.commit(
            {
                TopicPartition(topic, int(p)): OffsetAndMetadata(offset, "", -1)
                for topic, offsets in ends.items()
                for p, offset in offsets.items()
            }
        )

    compiled_before = compilations(spark)
    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", a.bootstrap)
        # the records a poll may hand over, as ackstream's reader sets it: at Kafka's
        # default of 500 the connector asks for offsets around every poll
        .option("kafka.max.poll.records", EXECUTOR_DEFAULTS["max.poll.records"])
        .option("subscribe", a.input)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", a.max_per_batch)
        .load()
        .writeStream.foreachBatch(write_then_commit)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{a.trigger_ms} milliseconds")
        .start()
    )
    try:
        started()
        run_until_stopped(query, stop)
        return spark_summary(spark, query, a.warmup_batches, compiled_before)
    finally:
        query.stop()
        committer.close()


def work_kafka_python(a, stop, started) -> dict:
    """Poll until ``max_per_batch`` records (or a poll brings none), count, produce,
    flush, commit."""
    from kafka import KafkaConsumer, KafkaProducer

    consumer = KafkaConsumer(
        a.input,
        bootstrap_servers=a.bootstrap,
        group_id=a.group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=a.max_per_batch,
    )
    producer = KafkaProducer(bootstrap_servers=a.bootstrap, acks="all", linger_ms=5)
    batches = 0
    started()
    try:
        while not stop.is_set():
            records: list = []
            while len(records) < a.max_per_batch and not stop.is_set():
                polled = consumer.poll(timeout_ms=50, max_records=a.max_per_batch - len(records))
                if not polled:
                    break
                records.extend(r for part in polled.values() for r in part)
            if not records:
                continue
            counts: collections.Counter = collections.Counter()
            for record in records:
                counts.update(record.value.decode().split(" "))
            futures = [
                producer.send(a.output, key=word.encode(), value=str(n).encode())
                for word, n in counts.items()
            ]
            producer.flush()
            for future in futures:
                future.get(timeout=30)  # raises if the broker did not take it: no commit then
            consumer.commit()
            batches += 1
    finally:
        consumer.close()
        producer.close()
    return {"batches": batches}


def work_quix(a, stop, started) -> dict:
    """Quix Streams at least once, its checkpoint every ``max_per_batch`` records: a
    sink counts the words of a checkpoint and writes the counts when Quix flushes the
    sink, which it does before committing the checkpoint's offsets."""
    from confluent_kafka import Producer
    from quixstreams import Application
    from quixstreams.sinks import BaseSink

    class WordCounts(BaseSink):
        def __init__(self):
            super().__init__()
            self.counts: collections.Counter = collections.Counter()
            self.producer = Producer(
                {"bootstrap.servers": a.bootstrap, "acks": "all", "linger.ms": 5}
            )
            self.checkpoints = 0

        def add(self, value, key, timestamp, headers, topic, partition, offset):
            self.counts.update(value.split(" "))

        def flush(self):
            failed = []
            for word, n in self.counts.items():
                self.producer.produce(
                    a.output,
                    key=word.encode(),
                    value=str(n).encode(),
                    on_delivery=lambda error, _m: error and failed.append(error),
                )
            if self.producer.flush(30) or failed:
                raise RuntimeError(f"counts not written: {failed[:3]}")
            self.checkpoints += bool(self.counts)
            self.counts.clear()

    app = Application(
        broker_address=a.bootstrap,
        consumer_group=a.group,
        auto_offset_reset="earliest",
        commit_every=a.max_per_batch,
        state_dir=os.path.join(a.workdir, "state"),
        use_changelog_topics=False,
        loglevel="WARNING",
    )
    sink = WordCounts()
    app.dataframe(app.topic(a.input, value_deserializer="str")).sink(sink)

    def stop_when_told() -> None:
        stop.wait()
        app.stop()

    threading.Thread(target=stop_when_told, daemon=True).start()
    started()
    app.run()
    return {"batches": sink.checkpoints}


if __name__ == "__main__":
    main()
