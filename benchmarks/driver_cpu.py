"""Driver CPU per batch of the README's tracked pipeline, at small and big batches.

The driver should plan per batch and handle exceptions, never touch every record:
so its CPU per batch should hardly grow with the batch. This runs the README's
pipeline (tracked, Kafka channel, ``KafkaSink``, Spark's Kafka connector when
resolved) on a local Apache Kafka at each ``--batch-sizes`` size, alternating the
order over ``--repeats`` rounds, and reads from /proc the user + system CPU of each
process of this one, by role, between the end of the warm-up batches and the end
of the timed ones:

- ``driver_python``: this process, where the topology's and the acker's
  ``foreachBatch`` run (planning, settling, reporting), but not its main thread:
  that thread only runs this harness, whose polls of the query's progress (a call
  into the JVM per progress kept) would count as the driver's and grow with each
  batch's wall time, not with its records;
- ``runners``: Python processes the JVM starts for the driver's side of the source
  (the stream reader's ``latestOffset``/``commit`` and partition planning);
- ``python_workers``: the executors' Python workers (``pyspark.daemon`` and its forks):
  per-record work when a stage or a read task is Python, not the driver's;
- ``jvm``: Spark's JVM, driver and executors in one (local mode).

    python benchmarks/driver_cpu.py [--batch-sizes 10000,100000] [--batches 6]

Prints a table and writes JSON to ``benchmarks/results/driver-cpu-<date>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import types
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from e2e import loadavg, machine, make_input  # noqa: E402
from e2e_systems import MESSAGE_TIMEOUT_MS, spark_session  # noqa: E402
from proc_cpu import descendants, process_table, thread_cpu  # noqa: E402

ROLES = ("driver_python", "runners", "python_workers", "jvm")


def process_cpu() -> dict[str, float]:
    """User + system CPU seconds of this process and its descendants, by role (see the
    module doc). Children already waited for count with their parent."""
    table, out = process_table(), dict.fromkeys(ROLES, 0.0)
    for pid in descendants(table, os.getpid()):
        _, seconds, cmdline = table[pid]
        out[role_of(pid, cmdline)] += seconds
    out["driver_python"] -= thread_cpu(os.getpid(), threading.main_thread().native_id)
    return out


def role_of(pid: int, cmdline: str) -> str:
    if pid == os.getpid():
        return "driver_python"
    if "java" in cmdline.split(" ", 1)[0]:
        return "jvm"
    if "pyspark.daemon" in cmdline or "pyspark/daemon" in cmdline:
        return "python_workers"
    return "runners"


def batches_run(query) -> int:
    return sum(1 for p in query.recentProgress if p["durationMs"].get("addBatch"))


def run_one(spark, ctx, size: int, warm: int, timed: int) -> dict:
    """One run of the tracked pipeline over a fresh topic at ``size`` records per batch."""
    from pyspark.sql import functions as F

    from ackstream import KafkaChannel, KafkaSink, LocalChannel, Topology

    name = f"cpu-{ctx.run}-{size}-{uuid.uuid4().hex[:4]}"
    inp = make_input(ctx, name, size, warm, timed)
    output = f"{name}-out"
    from broker import create_topic

    create_topic(ctx.bootstrap, ctx.partitions, name=output)
    topology = (
        Topology(
            name,
            spark,
            KafkaChannel(ctx.bootstrap, name)
            if ctx.channel == "kafka"
            else LocalChannel(os.path.join(ctx.workdir, name, "channel")),
            message_timeout_ms=MESSAGE_TIMEOUT_MS,
        )
        .map(lambda df: df.withColumn("line", F.col("value").cast("string")))
        .explode(F.split("line", " "), "word")
        .aggregate("word", F.count("*").alias("n"))
        .map(lambda df: df.selectExpr("*", "word AS key", "CAST(n AS STRING) AS value"))
        .sink(KafkaSink(ctx.bootstrap, output))
    )
    options = {
        "kafka.bootstrap.servers": ctx.bootstrap,
        "subscribe": inp.topic,
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": size,
        "kafka.group.id": name,
    }
    checkpoint = os.path.join(ctx.workdir, name)
    running = topology.start(topology.read_stream(options), checkpoint, trigger_ms=200)
    try:
        deadline = time.monotonic() + ctx.timeout_s
        while batches_run(running.query) < warm:
            wait(running, deadline)
        before, at_start, t0 = process_cpu(), batches_run(running.query), time.monotonic()
        while batches_run(running.query) < warm + timed:
            wait(running, deadline)
        after, at_end, t1 = process_cpu(), batches_run(running.query), time.monotonic()
        batches = at_end - at_start
        reader = topology.source_config.record_reader if topology.source_config else None
        return {
            "batch_size": size,
            "batches": batches,
            "record_reader": reader,
            "seconds_per_batch": (t1 - t0) / batches,
            "cpu_s_per_batch": {r: (after[r] - before[r]) / batches for r in ROLES},
            "loadavg_after": loadavg(),
        }
    finally:
        running.stop()


def wait(running, deadline: float) -> None:
    if running.exception():
        raise RuntimeError(f"query failed: {running.exception()}")
    if time.monotonic() > deadline:
        raise TimeoutError("the pipeline did not finish its batches in time")
    time.sleep(0.05)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="10000,100000")
    parser.add_argument("--batches", type=int, default=6, help="timed batches per run")
    parser.add_argument("--warmup-batches", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2, help="rounds, in alternating order")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=600, help="per run")
    parser.add_argument(
        "--channel", choices=("kafka", "local"), default="kafka", help="the ack channel"
    )
    parser.add_argument("--output", help="write the JSON here instead of benchmarks/results/")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.batch_sizes.split(",") if s.strip()]

    from broker import KafkaBroker, kafka_version

    broker = KafkaBroker().start()
    runs = []
    try:
        spark = spark_session()
        ctx = types.SimpleNamespace(
            bootstrap=broker.bootstrap,
            run=uuid.uuid4().hex[:6],
            partitions=args.partitions,
            workdir=tempfile.mkdtemp(prefix="ackstream-cpu-"),
            timeout_s=args.timeout_s,
            channel=args.channel,
        )
        for round_ in range(args.repeats):
            for size in sizes if round_ % 2 == 0 else list(reversed(sizes)):
                run = run_one(spark, ctx, size, args.warmup_batches, args.batches)
                runs.append(run)
                print(json.dumps(run), file=sys.stderr, flush=True)
        spark.stop()
        summary = summarize(runs, sizes)
        out = {
            "benchmark": "driver_cpu",
            "machine": machine(kafka_version()),
            "args": vars(args),
            "runs": runs,
            "summary": summary,
        }
    finally:
        broker.stop()
    print_table(summary, sizes)
    path = args.output or os.path.join(
        HERE, "results", f"driver-cpu-{datetime.date.today().isoformat()}.json"
    )
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"written to {path}")
    return out


def driver_s(run: dict) -> float:
    """The driver's CPU per batch: its Python and the runner processes."""
    cpu = run["cpu_s_per_batch"]
    return cpu["driver_python"] + cpu["runners"]


def summarize(runs: list[dict], sizes: list[int]) -> dict:
    per_size = {}
    for size in sizes:
        mine = [r for r in runs if r["batch_size"] == size]
        per_size[size] = {
            "driver_s_per_batch": [round(driver_s(r), 4) for r in mine],
            "driver_s_per_batch_mean": statistics.mean(driver_s(r) for r in mine),
            "by_role_mean": {
                role: statistics.mean(r["cpu_s_per_batch"][role] for r in mine) for role in ROLES
            },
            "seconds_per_batch_mean": statistics.mean(r["seconds_per_batch"] for r in mine),
        }
    small, big = min(sizes), max(sizes)
    ratio = per_size[big]["driver_s_per_batch_mean"] / per_size[small]["driver_s_per_batch_mean"]
    return {"per_size": per_size, f"driver_ratio_{big}_over_{small}": ratio}


def print_table(summary: dict, sizes: list[int]) -> None:
    print(
        f"{'records/batch':>14} {'driver s/batch (runs)':>28} "
        + " ".join(f"{r:>15}" for r in ROLES)
        + f" {'wall s/batch':>13}"
    )
    for size in sizes:
        s = summary["per_size"][size]
        runs = ", ".join(f"{v:.3f}" for v in s["driver_s_per_batch"])
        roles = " ".join(f"{s['by_role_mean'][r]:15.3f}" for r in ROLES)
        print(f"{size:14,} {runs:>28} {roles} {s['seconds_per_batch_mean']:13.3f}")
    for key, value in summary.items():
        if key.startswith("driver_ratio"):
            print(f"{key}: {value:.2f}")


if __name__ == "__main__":
    main()
