"""Readers benchmark: ackstream's Python Kafka reader beside Spark's JVM Kafka
source, both giving rows with ackstream's root ids, in one Spark session and one run.

Would ackstream be faster if its records came through ``format("kafka")``? Only the
reading is compared, with the same ids, nothing else:

- ``python``: ``format("ackstream")`` with ``ackstream.tracking=false`` (the same read
  tasks as tracked: kafka-python in the executors' Python workers, roots by numpy);
- ``jvm``: ``format("kafka")`` (``make spark-kafka``) plus ``_root`` computed in the
  JVM by ``ackstream.vocabulary.ids.spark_root_id`` (Spark's ``xxhash64``, the same ids
  bit for bit).

Each batch runs one job over its rows: ``count``, ``bit_xor(_root)`` and the sum of
the values' lengths (so that neither the ids nor the values can be pruned away), and
the two readers must agree on all three over the whole topic. Records/s run from the
first batch's start to the end of the batch that read the last record (from the
query's progress); "after the first batch" leaves out the cold first batch. The
readers alternate over ``--repeats``; the median run of each is reported.

    .venv/bin/python benchmarks/readers.py [--records N] [--max-per-batch M] [--repeats R]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from e2e import create_topic, machine, produce, sentences, spark_kafka_jars  # noqa: E402

READERS = ("python", "jvm")
NAME = "readers"  # the topology name the ids are hashed with


def stream(spark, reader: str, bootstrap: str, topic: str, max_per_batch: int, group: str):
    from pyspark.sql import functions as F

    from ackstream.vocabulary.ids import spark_root_id

    kafka = {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topic,
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": max_per_batch,
    }
    if reader == "python":
        untracked = {
            "kafka.group.id": group,
            "ackstream.topology": NAME,
            "ackstream.tracking": "false",
        }
        return spark.readStream.format("ackstream").options(**kafka, **untracked).load()
    return (
        spark.readStream.format("kafka")
        .options(**kafka)
        .load()
        .withColumn("_root", spark_root_id(NAME, attempt=F.lit(0)))
    )


def run_reader(spark, reader: str, ctx: dict) -> dict:
    """One streaming query over the whole topic; its figures from the query's progress."""
    from pyspark.sql import functions as F

    totals = {"rows": 0, "xor": 0, "bytes": 0}

    def batch(df, batch_id):
        row = df.agg(
            F.count("*").alias("rows"),
            F.bit_xor("_root").alias("xor"),
            F.sum(F.length("value")).alias("bytes"),
        ).first()
        totals["rows"] += row["rows"]
        totals["xor"] ^= row["xor"] or 0
        totals["bytes"] += row["bytes"] or 0

    group = f"{NAME}-{reader}-{uuid.uuid4().hex[:6]}"
    query = (
        stream(spark, reader, ctx["bootstrap"], ctx["topic"], ctx["max_per_batch"], group)
        .writeStream.foreachBatch(batch)
        .option("checkpointLocation", os.path.join(ctx["workdir"], group))
        .trigger(processingTime=f"{ctx['trigger_ms']} milliseconds")
        .start()
    )
    deadline = time.monotonic() + ctx["timeout_s"]
    try:
        while totals["rows"] < ctx["records"]:
            if query.exception():
                raise RuntimeError(f"{reader}: query failed: {query.exception()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{reader}: read {totals['rows']} of {ctx['records']} in time")
            time.sleep(0.05)
        query.processAllAvailable()  # the last batch's progress is written
        progress = [p for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    return {**figures(progress, ctx["records"]), "totals": totals}


def figures(progress: list, records: int) -> dict:
    def start(p):
        return dt.datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()

    def end(p):
        return start(p) + p["durationMs"]["triggerExecution"] / 1000

    first, last = progress[0], progress[-1]
    rest = records - first["numInputRows"]
    return {
        "records_per_s": records / (end(last) - start(first)),
        "records_per_s_after_first_batch": (
            rest / (end(last) - end(first)) if len(progress) > 1 else None
        ),
        "first_batch_s": first["durationMs"]["triggerExecution"] / 1000,
        "batches": len(progress),
        "batch_ms_median": sorted(p["durationMs"]["triggerExecution"] for p in progress)[
            len(progress) // 2
        ],
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--max-per-batch", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trigger-ms", type=int, default=200)
    parser.add_argument("--bootstrap", help="an external Kafka (default: start Apache Kafka)")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    jars = spark_kafka_jars()
    if not jars:
        parser.error("Spark's Kafka connector is not resolved: run `make spark-kafka` first")

    from ackstream import local_session

    from broker import KafkaBroker, kafka_version

    broker = None if args.bootstrap else KafkaBroker().start()
    bootstrap = args.bootstrap or broker.bootstrap
    spark = None
    try:
        topic = create_topic(bootstrap, args.partitions, f"readers-{uuid.uuid4().hex[:6]}")
        produce(bootstrap, topic, sentences(args.records), args.partitions)
        spark = local_session(
            "readers",
            conf={
                "spark.jars": ",".join(jars),
                "spark.sql.streaming.numRecentProgressUpdates": 10_000,
            },
        )
        ctx = {
            "bootstrap": bootstrap,
            "topic": topic,
            "records": args.records,
            "max_per_batch": args.max_per_batch,
            "trigger_ms": args.trigger_ms,
            "workdir": tempfile.mkdtemp(prefix="ackstream-readers-"),
            "timeout_s": max(300.0, args.records / 200),
        }
        runs: dict[str, list[dict]] = {r: [] for r in READERS}
        for repeat in range(args.repeats):
            for reader in READERS if repeat % 2 == 0 else READERS[::-1]:
                result = run_reader(spark, reader, ctx)
                print(f"readers: {reader} run {repeat + 1}: {result}", file=sys.stderr)
                runs[reader].append(result)
        totals = {r: [run["totals"] for run in rs] for r, rs in runs.items()}
        agreed = all(t == totals["python"][0] for ts in totals.values() for t in ts)
        if not agreed:
            raise RuntimeError(f"the readers disagree on the rows, ids or values: {totals}")
        medians = {
            r: sorted(rs, key=lambda run: run["records_per_s"])[len(rs) // 2]
            for r, rs in runs.items()
        }
        out = {
            "benchmark": "readers",
            "date": dt.datetime.now(dt.UTC).isoformat(),
            "machine": machine(kafka_version() if broker else None),
            "config": {k: v for k, v in vars(args).items() if k != "no_save"},
            "readers": medians,
            "runs_records_per_s": {
                r: [run["records_per_s"] for run in rs] for r, rs in runs.items()
            },
            "jvm_over_python": medians["jvm"]["records_per_s"] / medians["python"]["records_per_s"],
            "jvm_over_python_after_first_batch": (
                medians["jvm"]["records_per_s_after_first_batch"]
                / medians["python"]["records_per_s_after_first_batch"]
            ),
        }
    finally:
        if spark is not None:
            spark.stop()
        if broker is not None:
            broker.stop()
    print(json.dumps(out))
    if not args.no_save:
        path = os.path.join(HERE, "results", f"readers-{dt.date.today().isoformat()}.json")
        with open(path, "w") as f:
            f.write(json.dumps(out) + "\n")
    return out


if __name__ == "__main__":
    main()
