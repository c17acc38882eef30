"""Scale-out benchmark: the same tracked work on 1 and on 2 executors.

A Spark standalone cluster from the pyspark package (a Master and two Workers of one
core each, on 127.0.0.1; tests/spark_cluster.py) runs, once with ``spark.cores.max=1``
(one executor) and once with 2, the same topology: generator upstream (2 partitions)
-> explode words -> a pandas bolt doing ``--work`` rounds of SHA-256 per word (the
per-record work a real bolt does, on the executors) -> count per word -> memory sink,
tracking on, a shared local channel (one host). Records/s run from the start of the
first batch with input until every generated offset is committed (acked), so the
executors' start-up is left out. ``--repeat`` 1/2 pairs run alternately (the median of
each is reported) after an untimed warm-up pair. The load average is recorded beside
each run: on a machine whose cores other work shares, the ratio says how much of the
machine two executors got, not how ackstream scales.

Prints one JSON line and writes it to ``benchmarks/results/scale-<date>.json``.

    .venv/bin/python benchmarks/scale.py [--records N] [--batch N] [--work N] [--repeat N]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

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


def run(master: str, executors: int, records: int, batch: int, rounds: int) -> dict:
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
        first_batch = None
        try:
            while committed_count(channel_dir) < records:
                if running.exception() or time.time() - started > 1800:
                    raise RuntimeError(f"run did not finish: {running.exception()}")
                first_batch = first_batch or _batch_start(running.query.lastProgress)
                time.sleep(0.05)
            ended = time.time()
            progress = running.query.recentProgress
            first_batch = first_batch or next(filter(None, map(_batch_start, progress)))
            batch_ms = [
                p["durationMs"]["triggerExecution"] for p in progress if p.get("numInputRows")
            ]
            seen = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1  # noqa: SLF001
        finally:
            running.stop()
    finally:
        spark.stop()
    return {
        "executors": executors,
        "executors_seen": seen,
        "records_per_s": records / (ended - first_batch),
        "seconds": ended - started,
        "startup_s": first_batch - started,
        "batch_ms_median": float(np.median(batch_ms)),
        "batches": len(batch_ms),
        "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def _batch_start(progress) -> float | None:
    """Epoch seconds at which the batch of ``progress`` started, if it read any input."""
    if not progress or not progress.get("numInputRows"):
        return None
    return dt.datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()


def _median(runs: list[dict]) -> dict:
    return sorted(runs, key=lambda r: r["records_per_s"])[len(runs) // 2]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=5_000, help="max offsets per micro-batch")
    parser.add_argument("--work", type=int, default=200, help="SHA-256 rounds per word")
    parser.add_argument("--repeat", type=int, default=2, help="1/2-executor pairs, alternately")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    cluster = StandaloneCluster(workers=2, cores=1, memory="1g").start()
    try:
        sizes = (args.records, args.batch, args.work)
        for executors in (1, 2):  # untimed: JIT, Python workers, page cache
            run(cluster.url, executors, args.batch, args.batch, args.work)
        pairs = [
            (run(cluster.url, 1, *sizes), run(cluster.url, 2, *sizes)) for _ in range(args.repeat)
        ]
    finally:
        cluster.stop()
    one, two = _median([p[0] for p in pairs]), _median([p[1] for p in pairs])
    from acker import machine  # the same machine description as the other benchmarks

    out = {
        "benchmark": "scale",
        "date": dt.datetime.now(dt.UTC).isoformat(),
        "records": args.records,
        "max_offsets_per_batch": args.batch,
        "sha256_rounds_per_word": args.work,
        "one_executor": one,
        "two_executors": two,
        "speedup": two["records_per_s"] / one["records_per_s"],
        "pair_speedups": [round(b["records_per_s"] / a["records_per_s"], 2) for a, b in pairs],
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
