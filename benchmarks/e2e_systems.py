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
    "ackstream_kafka_window_event",
    "ackstream_kafka_window_guide",
    "ackstream_kafka_join",
    "ackstream_kafka_per_stage",
    "ackstream_local",
    "ackstream_untracked",
    "ackstream_untracked_window_guide",
    "spark_kafka",
    "spark_kafka_window",
    "spark_kafka_join",
    "quix",
    "kafka_python_loop",
)
#: the systems the warm worker runs, in its one Spark session
SPARK_SYSTEMS = tuple(s for s in SYSTEMS if s.startswith(("ackstream_", "spark_")))
TRACKED, UNTRACKED = "ackstream_kafka", "ackstream_untracked"
#: the tracked pipeline with a processing-time window after the count: what holding costs
WINDOWED = "ackstream_kafka_window"
#: the same window by event time (the records' Kafka timestamps) with a watermark
WINDOWED_EVENT = "ackstream_kafka_window_event"
#: the window as the guide teaches it, straight over the exploded words (no aggregate
#: first): what a new user writes
WINDOWED_GUIDE = "ackstream_kafka_window_guide"
#: the same, untracked: its source commits each batch before the window's output
UNTRACKED_GUIDE = "ackstream_untracked_window_guide"
#: Spark's own windowed count: ``withWatermark`` + ``groupBy(window, word).count()``
SPARK_WINDOW = "spark_kafka_window"
#: a waiting join of each record with its neighbour, then the count of both's words
JOINED = "ackstream_kafka_join"
#: Spark's own stream-stream inner join with watermarks, then the same count
SPARK_JOIN = "spark_kafka_join"
#: the tracked pipeline with every stage's acks sent to the acker, as Storm sends them
PER_STAGE = "ackstream_kafka_per_stage"
#: the window's length by default (``--window-seconds``): its records stay pending this long
WINDOW_SECONDS = 2
#: how far behind the newest event time the watermark of the event-time systems is
WATERMARK_DELAY = "2 seconds"
#: the bound of Spark's join on the pair's event times, each side's watermark delay
JOIN_BOUND = "10 seconds"
#: what input each system reads (``e2e.make_input``): plain sentences; sentences with
#: event times and a tick closing every window at the end; sentences in pairs
INPUT_KIND = {
    WINDOWED: "event",
    WINDOWED_EVENT: "event",
    WINDOWED_GUIDE: "event",
    UNTRACKED_GUIDE: "event",
    SPARK_WINDOW: "event",
    JOINED: "pairs",
    SPARK_JOIN: "pairs",
}
#: the word of the ticks an event input ends with, counted in windows that never close
TICK = "~"
#: the tracked pipeline with every record read by the source's Python read tasks
PYTHON_READER = "ackstream_kafka_python_reader"
MARK = "e2e"  # the key of the worker's event lines on its stdout (Spark's JVM shares it)
MESSAGE_TIMEOUT_MS = 120_000  # nothing may time out in a run: a replay would be a bug here
SPARK_KAFKA_PREFIX = os.path.join(ROOT, ".cache", "spark-kafka-")
#: the shared worker runs every system of a size one after another in one local JVM,
#: whose heap is its executors' too: with Spark's 1 GB default, a run of record at
#: 100,000 a batch ran out of heap after some systems (Spark's stream-stream join
#: stopped committing, ackstream's join failed a task with OutOfMemoryError)
SPARK_CONF = {"spark.sql.streaming.numRecentProgressUpdates": 10_000, "spark.driver.memory": "4g"}


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
            work = SPARK_WORK.get(a.system, work_ackstream)
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


def job_ms_by_part(spark, jobs, batches: int) -> dict:
    """Per part of a batch that starts jobs (the last line of a job's description:
    ackstream names its stages, sinks and ack collect; any other job is the query's
    own), the jobs a batch and their summed milliseconds a batch, from Spark's status
    store: with the batch's ``addBatch``, what the driver spends outside jobs."""
    store = spark.sparkContext._jsc.sc().statusStore()  # noqa: SLF001 - no Python API
    parts: dict = {}
    for job in jobs:
        data = store.job(job)
        described = data.description()
        said = described.get().splitlines()[-1] if described.isDefined() else ""
        name = said if said.startswith("ackstream ") else "the query's own"
        done, began = data.completionTime(), data.submissionTime()
        ms = done.get().getTime() - began.get().getTime() if done.isDefined() else 0
        jobs_ms = parts.setdefault(name, [0, 0])
        jobs_ms[0] += 1
        jobs_ms[1] += ms
    per = max(batches, 1)
    return {k: {"jobs": round(n / per, 2), "ms": round(ms / per)} for k, (n, ms) in parts.items()}


def spark_summary(spark, query, warmup_batches: int, compiled_before: int) -> dict:
    """Batches, the median of each of Spark's phases (``addBatch``: the batch's work)
    over the batches after the warm-up, from the query's progress, and the classes
    compiled per batch since the run began."""
    # a batch that ran (Spark's reader leaves numInputRows to the replays alone)
    batches = [p for p in query.recentProgress if p["durationMs"].get("addBatch")]
    timed = batches[warmup_batches:] or batches
    compiled = compilations(spark) - compiled_before
    # Spark runs a streaming query's jobs in a job group named by its run id (the
    # tracker keeps the newest spark.ui.retainedJobs of them: enough for a run)
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup(str(query.runId))
    return {
        "batches": len(batches),
        "jobs_per_batch": round(len(jobs) / max(len(batches), 1), 1),
        "job_ms_by_part": job_ms_by_part(spark, jobs, len(batches)),
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
    has the connector), or by the source's Python read tasks. The holding systems
    add a window after the count, or join each record with its neighbour first."""
    from pyspark.sql import functions as F

    from ackstream import KafkaChannel, KafkaSink, LocalChannel, Topology

    tracking = a.system not in (UNTRACKED, UNTRACKED_GUIDE)
    if a.system in (UNTRACKED, UNTRACKED_GUIDE, "ackstream_local"):
        channel = LocalChannel(os.path.join(a.workdir, "channel"))
    else:
        channel = KafkaChannel(a.bootstrap, a.name)
    mode = "per_stage" if a.system == PER_STAGE else "telescoped"
    topology = Topology(
        a.name,
        spark,
        channel,
        message_timeout_ms=MESSAGE_TIMEOUT_MS,
        tracking=tracking,
        ack_mode=mode,
    )
    if a.system == JOINED:  # records 2k and 2k + 1 of a partition meet, then their words
        topology = (
            topology.map(
                lambda df: df.selectExpr("*", "CAST(value AS STRING) AS line", "offset div 2 AS k"),
                name="lines",
            )
            .filter("offset % 2 = 0", name="even")
            .filter("offset % 2 = 1", name="odd", after="lines")
            .join("even", "odd", on=["partition", "k"])
            .explode(F.split(F.concat_ws(" ", "line", "line_right"), " "), "word")
        )
    else:
        topology = topology.map(lambda df: df.withColumn("line", F.col("value").cast("string")))
        topology = topology.explode(F.split("line", " "), "word")
    if a.system == WINDOWED_EVENT:  # per batch, per word and window; then over batches
        ms = a.window_seconds * 1000
        start = F.expr(f"timestamp_millis(unix_millis(timestamp) - unix_millis(timestamp) % {ms})")
        topology = topology.aggregate(
            ["word", start.alias("start")], F.count("*").alias("n"), F.max("timestamp").alias("t")
        ).window(
            "word",
            F.sum("n").alias("n"),
            duration=f"{a.window_seconds}s",
            time="t",
            delay=WATERMARK_DELAY,
        )
    elif a.system in (WINDOWED_GUIDE, UNTRACKED_GUIDE):  # the words counted per window
        window = f"{a.window_seconds}s"
        topology = topology.window("word", F.count("*").alias("n"), duration=window)
    else:
        topology = topology.aggregate("word", F.count("*").alias("n"))
    if a.system == WINDOWED:  # the batch's counts summed per word over 2 s windows
        topology = topology.window("word", F.sum("n").alias("n"), duration=f"{a.window_seconds}s")
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


def spark_committer(a):
    """A consumer of ``a.group`` assigned the input's partitions, to commit with."""
    from kafka import KafkaConsumer, TopicPartition

    committer = KafkaConsumer(
        bootstrap_servers=a.bootstrap, group_id=a.group, enable_auto_commit=False
    )
    parts = committer.partitions_for_topic(a.input) or ()
    committer.assign([TopicPartition(a.input, p) for p in parts])
    return committer


def commit_logged(committer, spark, checkpoint: str, batch_id: int) -> None:
    """Commit to the group the end offsets Spark logged for ``batch_id`` (of every
    Kafka source of the query: a self-join may read the topic as two)."""
    from kafka import TopicPartition
    from kafka.structs import OffsetAndMetadata

    from ackstream.storage.offset_log import source_offsets

    ends: dict = {}
    for source in source_offsets(spark, checkpoint, batch_id):  # {topic: {p: next}}
        for topic, offsets in (source or {}).items():
            for p, offset in offsets.items():
                tp = TopicPartition(topic, int(p))
                ends[tp] = max(ends.get(tp, 0), offset)
    committer.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in ends.items()})


def spark_kafka_stream(spark, a):
    """Spark's own Kafka source over the job's input."""
    from ackstream.sources.kafka_ranges import EXECUTOR_DEFAULTS

    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", a.bootstrap)
        # the records a poll may hand over, as ackstream's reader sets it: at Kafka's
        # default of 500 the connector asks for offsets around every poll
        .option("kafka.max.poll.records", EXECUTOR_DEFAULTS["max.poll.records"])
        .option("subscribe", a.input)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", a.max_per_batch)
        .load()
    )


def write_counts(counts, a) -> None:
    """Counts (``word``, ``count``) to the output topic with Spark's Kafka writer."""
    (
        counts.selectExpr("word AS key", "CAST(count AS STRING) AS value")
        .write.format("kafka")
        .option("kafka.bootstrap.servers", a.bootstrap)
        .option("topic", a.output)
        .save()
    )


def run_spark_query(spark, a, stop, started, stream, batch_fn, drain=False, **write) -> dict:
    """Start ``stream`` with ``batch_fn(df, batch_id)`` in ``foreachBatch``, which then
    commits the batch's offsets; run until told to stop. ``drain``: then first process
    what is available, and the batches with no data that Spark runs when a batch moved
    the watermark (where a window's counts are written)."""
    checkpoint = os.path.join(a.workdir, "checkpoint")
    committer = spark_committer(a)

    def write_then_commit(df, batch_id):
        batch_fn(df)
        commit_logged(committer, df.sparkSession, checkpoint, batch_id)

    compiled_before = compilations(spark)
    writer = stream.writeStream.foreachBatch(write_then_commit)
    for key, value in write.items():
        writer = getattr(writer, key)(value)
    query = (
        writer.option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{a.trigger_ms} milliseconds")
        .start()
    )
    try:
        started()
        run_until_stopped(query, stop)
        if drain:
            query.processAllAvailable()
        return spark_summary(spark, query, a.warmup_batches, compiled_before)
    finally:
        query.stop()
        committer.close()


def work_spark_kafka(spark, a, stop, started) -> dict:
    """Spark's own source and sink: one job per batch, then the batch's end offsets, as
    Spark logged them before running it, committed to the group."""
    from pyspark.sql import functions as F

    def count_words(df) -> None:
        words = df.select(F.explode(F.split(F.col("value").cast("string"), " ")).alias("word"))
        write_counts(words.groupBy("word").count(), a)

    return run_spark_query(spark, a, stop, started, spark_kafka_stream(spark, a), count_words)


def work_spark_window(spark, a, stop, started) -> dict:
    """Spark's own windowed count by the records' event time: ``withWatermark`` and
    ``groupBy(window, word).count()`` in its state store, appending each window once
    the watermark passed it; the batch's windows are written, then its offsets
    committed (they are in the state store by then). A window is written in the batch
    after the one whose watermark passed it: the input's last windows, once the ticks'
    batch ran, after the commits cover the input (drained when told to stop)."""
    from pyspark.sql import functions as F

    words = spark_kafka_stream(spark, a).select(
        F.explode(F.split(F.col("value").cast("string"), " ")).alias("word"), "timestamp"
    )
    counts = (
        words.withWatermark("timestamp", WATERMARK_DELAY)
        .groupBy(F.window("timestamp", f"{a.window_seconds} seconds"), "word")
        .count()
    )
    return run_spark_query(
        spark,
        a,
        stop,
        started,
        counts,
        lambda df: write_counts(df, a),
        drain=True,
        outputMode="append",
    )


def work_spark_join(spark, a, stop, started) -> dict:
    """Spark's own stream-stream inner join: record 2k and 2k + 1 of each partition, each
    side with a watermark and the join bounded by their event times (so its state is
    dropped); each batch's pairs' words counted and written, then its offsets committed."""
    from pyspark.sql import functions as F

    base = spark_kafka_stream(spark, a).selectExpr(
        "partition", "offset", "CAST(value AS STRING) AS line", "timestamp"
    )
    even = (
        base.where("offset % 2 = 0")
        .selectExpr("partition AS ep", "offset div 2 AS ek", "line AS el", "timestamp AS et")
        .withWatermark("et", JOIN_BOUND)
    )
    odd = (
        base.where("offset % 2 = 1")
        .selectExpr("partition AS op", "offset div 2 AS ok", "line AS ol", "timestamp AS ot")
        .withWatermark("ot", JOIN_BOUND)
    )
    bound = f"INTERVAL {JOIN_BOUND}"
    pairs = even.join(
        odd, F.expr(f"ep = op AND ek = ok AND ot BETWEEN et - {bound} AND et + {bound}")
    )

    def count_words(df) -> None:
        words = df.select(F.explode(F.split(F.concat_ws(" ", "el", "ol"), " ")).alias("word"))
        write_counts(words.groupBy("word").count(), a)

    return run_spark_query(spark, a, stop, started, pairs, count_words)


SPARK_WORK = {
    "spark_kafka": work_spark_kafka,
    SPARK_WINDOW: work_spark_window,
    SPARK_JOIN: work_spark_join,
}


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
