"""Scale-out benchmark: the same tracked work on 1 and on 2 executors.

A Spark standalone cluster from the pyspark package (a Master and two Workers of one
core each, on 127.0.0.1; tests/spark_cluster.py) runs, once with ``spark.cores.max=1``
(one executor) and once with 2, the same topology: generator upstream (2 partitions)
-> explode words -> a pandas bolt doing ``--work`` rounds of SHA-256 per word (the
per-record work a real bolt does, on the executors) -> count per word -> memory sink,
tracking on, a shared local channel (one host).

A run is timed from the end of its first ``--warmup-batches`` batches (the executors'
start-up and their Python workers' first imports are left out) to the commit of
every generated offset, over the records committed in between. ``--repeat`` pairs
run in alternating order (1 then 2, then 2 then 1) after an untimed warm-up pair;
each pair's ratio is printed, and their spread. Beside the wall clock, the CPU of
each role over the timed part, per batch, from /proc: the executors (their JVMs and
Python workers), the driver (this process, its JVM and the source's runners) and the
cluster's daemons. Two one-core executors cannot give more than 2x, and only on a
machine with a core to spare for the driver and another for the rest: with fewer
free cores than executors + 2 (cores minus the load average) before a pair, the
pair's ratio is not reported, only its figures.

Prints one JSON line and writes it to ``benchmarks/results/scale-<date>.json``.

    .venv/bin/python benchmarks/scale.py [--records N] [--batch N] [--work N] [--repeat N]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from proc_cpu import descendants, process_table  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from ackstream import LocalChannel, MemorySink, Topology, local_session  # noqa: E402
from ackstream.sources.generator import committed_count  # noqa: E402

from spark_cluster import StandaloneCluster  # noqa: E402

RESULTS = os.path.join(HERE, "results")


def hashing_bolt(rounds: int):
    """A pandas bolt that hashes each word ``rounds`` times: CPU work per record."""

    def work(frame):
        import hashlib

        def digest(word: str) -> str:
            value = word.encode()
            for _ in range(rounds):
                value = hashlib.sha256(value).digest()
            return value.hex()[:4]

        return frame.assign(digest=frame["word"].map(digest))[["word", "digest"]]

    return work


def run(
    master: str, executors: int, records: int, batch: int, rounds: int, warmup_batches: int
) -> dict:
    """One run on ``executors`` executors of one core, to the last committed offset."""
    spark = local_session(
        f"scale-{executors}",
        cores=2,
        master=master,
        conf={
            "spark.driver.host": "127.0.0.1",
            "spark.cores.max": executors,
            "spark.executor.cores": 1,
            "spark.executor.memory": "768m",
        },
    )
    directory = tempfile.mkdtemp(prefix="ackstream-scale-")
    channel_dir = os.path.join(directory, "channel")
    try:
        topology = (
            Topology(
                f"scale{executors}x{int(time.time() * 1000) % 100000}",
                spark,
                LocalChannel(channel_dir, shared=True),  # every executor is on this host
                message_timeout_ms=300_000,
            )
            .map(lambda df: df.withColumn("line", F.col("value").cast("string")))
            .explode(F.split("line", " "), "word")
            .pandas_bolt(hashing_bolt(rounds), "word string, digest string", name="hash")
            .aggregate("word", F.count("*").alias("n"))
            .sink(MemorySink())
        )
        stream = topology.read_stream(
            {
                "ackstream.upstream": "generator",
                "ackstream.generator.count": records,
                "ackstream.generator.partitions": 2,
                "maxOffsetsPerTrigger": batch,
            }
        )
        load_before = os.getloadavg()[0]
        started = time.time()
        running = topology.start(stream, os.path.join(directory, "checkpoint"), trigger_ms=200)
        try:
            while _batches(running.query) < warmup_batches:
                _check(running, started)
            warm_records, cpu_before, warm_at = (
                committed_count(channel_dir),
                process_cpu(),
                time.time(),
            )
            warm_batches = _batches(running.query)
            while committed_count(channel_dir) < records:
                _check(running, started)
            ended, cpu_after = time.time(), process_cpu()
            batches = _batches(running.query) - warm_batches
            batch_ms = [
                p["durationMs"]["triggerExecution"]
                for p in running.query.recentProgress[warm_batches:]
                if p["durationMs"].get("addBatch")
            ]
            seen = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1  # noqa: SLF001
        finally:
            running.stop()
    finally:
        spark.stop()
    timed = records - warm_records
    return {
        "executors": executors,
        "executors_seen": seen,
        "records_per_s": timed / (ended - warm_at),
        "timed_records": timed,
        "seconds": ended - started,
        "startup_s": warm_at - started,
        "batch_ms_median": float(np.median(batch_ms)) if batch_ms else None,
        "batches": batches,
        "cpu_s_per_batch": {
            role: (cpu_after[role] - cpu_before[role]) / max(batches, 1) for role in ROLES
        },
        "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def _batches(query) -> int:
    """Batches of the query that ran (read input or not)."""
    return sum(1 for p in query.recentProgress if p["durationMs"].get("addBatch"))


def _check(running, started: float) -> None:
    if running.exception() or time.time() - started > 1800:
        raise RuntimeError(f"run did not finish: {running.exception()}")
    time.sleep(0.05)


ROLES = ("executors", "driver", "cluster")


def process_cpu() -> dict[str, float]:
    """User + system CPU seconds of this process and its descendants by role: under an
    executor's JVM (``CoarseGrainedExecutorBackend``), a Master or Worker daemon (the
    cluster), or else the driver's (this process, its JVM, the source's runners)."""
    table, out = process_table(), dict.fromkeys(ROLES, 0.0)
    for pid in descendants(table, os.getpid()):
        role, at = "driver", pid
        while at in table and at != os.getpid():
            parent, _, cmdline = table[at]
            if "CoarseGrainedExecutorBackend" in cmdline:
                role = "executors"
                break
            if "deploy.master.Master" in cmdline or "deploy.worker.Worker" in cmdline:
                role = "cluster"
                break
            at = parent
        out[role] += table[pid][1]
    return out


def free_cores() -> float:
    """Cores minus the 1-minute load average: what a run can count on now."""
    return len(os.sched_getaffinity(0)) - os.getloadavg()[0]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=2_500, help="max offsets per micro-batch")
    parser.add_argument("--work", type=int, default=200, help="SHA-256 rounds per word")
    parser.add_argument("--warmup-batches", type=int, default=2, help="dropped before timing")
    parser.add_argument("--repeat", type=int, default=2, help="1/2-executor pairs, alternately")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    cluster = StandaloneCluster(workers=2, cores=1, memory="1g").start()
    pairs = []
    try:
        sizes = (args.records, args.batch, args.work, args.warmup_batches)
        for executors in (1, 2):  # untimed: JIT, Python workers, page cache
            run(cluster.url, executors, args.batch * 3, args.batch, args.work, 1)
        for i in range(args.repeat):
            free = free_cores()
            order = (1, 2) if i % 2 == 0 else (2, 1)
            runs = {n: run(cluster.url, n, *sizes) for n in order}
            sound = free >= 2 + 2
            ratio = runs[2]["records_per_s"] / runs[1]["records_per_s"]
            pairs.append(
                {
                    "order": list(order),
                    "free_cores_before": round(free, 2),
                    "one_executor": runs[1],
                    "two_executors": runs[2],
                    "speedup": round(ratio, 3) if sound else None,
                    "why_no_speedup": None
                    if sound
                    else f"{free:.1f} free cores before the pair, fewer than 2 executors + 2",
                }
            )
            print(json.dumps(pairs[-1]), file=sys.stderr, flush=True)
    finally:
        cluster.stop()
    from acker import machine  # the same machine description as the other benchmarks

    speedups = [p["speedup"] for p in pairs if p["speedup"] is not None]
    out = {
        "benchmark": "scale",
        "date": dt.datetime.now(dt.UTC).isoformat(),
        "records": args.records,
        "max_offsets_per_batch": args.batch,
        "sha256_rounds_per_word": args.work,
        "warmup_batches": args.warmup_batches,
        "pairs": pairs,
        "speedup_median": statistics.median(speedups) if speedups else None,
        "speedup_spread": [min(speedups), max(speedups)] if speedups else None,
        "machine": machine(),
    }
    print(json.dumps(out))
    if not args.no_save:
        os.makedirs(RESULTS, exist_ok=True)
        with open(os.path.join(RESULTS, f"scale-{dt.date.today()}.json"), "w") as f:
            f.write(json.dumps(out) + "\n")
    return out


if __name__ == "__main__":
    main()
