"""Topology benchmark: the same pipeline with tracking on and off, in one run.

generator upstream -> explode words -> count per word -> memory sink, on the local
channel, at most ``--batch`` offsets per micro-batch (so a run is many batches, a
sustained rate, not one batch end to end). For each mode, records/s until every
generated offset is committed (tracking on: acked; off: processed), counted two
ways: *sustained*, from the start of the first batch (the throughput), and *from
start*, from ``start()`` (which adds the queries' start-up: with tracking, the
acker query's too). A third figure is the median time of a batch with input
(Spark's ``triggerExecution``: planning, with the source's polling, the batch and
its commit): a burst of the host's noise moves the median batch much less than
the run's total. ``--repeat`` off/on pairs run alternately; each overhead is the
median of the pairs' overheads (the machine drifts by more than the effect
between runs, much less within a pair), and the median runs are kept too. Then,
with tracking on, a rate-limited run at half the measured tracked rate for
complete-latency percentiles (from the completion channel).
Prints one JSON line and writes it to ``benchmarks/results/topology-<date>.json``
(``-batch<N>`` added for another ``--batch``).

    .venv/bin/python benchmarks/topology.py [--quick] [--records N] [--batch N]
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pyspark.sql import functions as F  # noqa: E402

from ackstream import LocalChannel, MemorySink, Topology, local_session  # noqa: E402
from ackstream.sources.generator import committed_count  # noqa: E402
from ackstream.vocabulary.records import ACKED  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def run(
    spark,
    tracking: bool,
    records: int,
    rate: float = 0.0,
    timeout_s: float = 900,
    batch: int | None = None,
) -> dict:
    """One run to the end; returns records/s and, with tracking, latency percentiles."""
    directory = tempfile.mkdtemp(prefix="ackstream-bench-")
    channel_dir = os.path.join(directory, "channel")
    name = f"bench{'on' if tracking else 'off'}{int(time.time() * 1000) % 100000}"
    topology = (
        Topology(
            name, spark, LocalChannel(channel_dir), tracking=tracking, message_timeout_ms=120_000
        )
        .map(lambda df: df.withColumn("line", F.col("value").cast("string")))
        .explode(F.split("line", " "), "word")
        .aggregate("word", F.count("*").alias("n"))
        .sink(MemorySink())
    )
    stream = topology.read_stream(
        {
            "ackstream.upstream": "generator",
            "ackstream.generator.count": records,
            "ackstream.generator.rate": rate,
            "ackstream.tracking": str(tracking).lower(),
            "maxOffsetsPerTrigger": batch or records,
        }
    )
    started = time.time()
    running = topology.start(stream, os.path.join(directory, "checkpoint"), trigger_ms=200)
    first_batch = None  # when the first batch with input started (its trigger time)
    try:
        while committed_count(channel_dir) < records:
            if running.exception() or time.time() - started > timeout_s:
                raise RuntimeError(f"run did not finish: {running.exception()}")
            first_batch = first_batch or _batch_start(running.query.lastProgress)
            time.sleep(0.02)
        ended = time.time()
        progress = running.query.recentProgress
        first_batch = first_batch or next(filter(None, map(_batch_start, progress)))
        batch_ms = [p["durationMs"]["triggerExecution"] for p in progress if p.get("numInputRows")]
    finally:
        running.stop()
    result = {
        "records": records,
        "seconds": ended - started,
        "records_per_s": records / (ended - first_batch),
        "records_per_s_from_start": records / (ended - started),
        "startup_s": first_batch - started,
        "batch_ms_median": float(np.median(batch_ms)),
        "batches": len(batch_ms),
    }
    if tracking:
        done = LocalChannel(channel_dir).completions_since(None)[0].to_pylist()
        latency = np.array([c["latency_ms"] for c in done if c["status"] == ACKED], float)
        result.update(
            acked=len(latency),
            p50_ms=float(np.percentile(latency, 50)),
            p99_ms=float(np.percentile(latency, 99)),
        )
    return result


def _batch_start(progress) -> float | None:
    """Epoch seconds at which the batch of ``progress`` started, if it read any input."""
    if not progress or not progress.get("numInputRows"):
        return None
    stamp = progress["timestamp"].replace("Z", "+00:00")
    return dt.datetime.fromisoformat(stamp).timestamp()


def _overhead(off: dict, on: dict, rate: str) -> float:
    if rate == "batch_ms_median":  # time per batch: the throughput is its inverse
        return 100 * (1 - off[rate] / on[rate])
    return 100 * (1 - on[rate] / off[rate])


def _median_overhead(pairs, rate: str) -> float:
    return float(np.median([_overhead(off, on, rate) for off, on in pairs]))


def _quartiles(pairs, rate: str) -> list[float]:
    """First and third quartile of the pairs' overheads: the spread the median sits in."""
    q1, q3 = np.percentile([_overhead(off, on, rate) for off, on in pairs], [25, 75])
    return [round(float(q1), 1), round(float(q3), 1)]


def _median(runs: list[dict]) -> dict:
    """The run with the median records/s (the machine's noise is the spread)."""
    return sorted(runs, key=lambda r: r["records_per_s"])[len(runs) // 2]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=40_000)
    parser.add_argument("--batch", type=int, default=2_500, help="max offsets per micro-batch")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, a smoke run")
    parser.add_argument(
        "--repeat",
        type=int,
        default=7,
        help="off/on pairs, run alternately; reports the median pair overhead",
    )
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    records = 2_000 if args.quick else args.records
    spark = local_session("ackstream-bench-topology")
    try:
        # a full pair, untimed: the JVM's JIT and the Python workers warm up over the
        # first runs (a first timed pair used to come out 10-180 % in favour of tracking)
        run(spark, False, records, batch=args.batch)
        run(spark, True, records, batch=args.batch)
        pairs = [
            (
                run(spark, False, records, batch=args.batch),
                run(spark, True, records, batch=args.batch),
            )
            for _ in range(1 if args.quick else args.repeat)
        ]
        off = _median([p[0] for p in pairs])
        on = _median([p[1] for p in pairs])
        rate = on["records_per_s"] / 2
        paced = run(
            spark, True, int(rate * (10 if args.quick else 30)), rate=rate, batch=args.batch
        )
    finally:
        spark.stop()
    from acker import machine  # the same machine description as the acker benchmark

    out = {
        "benchmark": "topology",
        "date": dt.datetime.now(dt.UTC).isoformat(),
        "tracking_off": off,
        "tracking_on": on,
        "runs_records_per_s": [[p[0]["records_per_s"], p[1]["records_per_s"]] for p in pairs],
        "overhead_pct": _median_overhead(pairs, "records_per_s"),
        "overhead_pct_from_start": _median_overhead(pairs, "records_per_s_from_start"),
        "overhead_pct_batch_median": _median_overhead(pairs, "batch_ms_median"),
        "pair_overheads_pct": [
            round(_overhead(off_run, on_run, "records_per_s"), 1) for off_run, on_run in pairs
        ],
        "pair_batch_overheads_pct": [
            round(_overhead(off_run, on_run, "batch_ms_median"), 1) for off_run, on_run in pairs
        ],
        "pair_overheads_quartiles_pct": _quartiles(pairs, "records_per_s"),
        "pair_batch_overheads_quartiles_pct": _quartiles(pairs, "batch_ms_median"),
        "half_rate": {"rate_records_per_s": rate, **paced},
        "trigger_ms": 200,
        "max_offsets_per_batch": args.batch,
        "machine": machine(),
    }
    print(json.dumps(out))
    if not args.no_save:
        os.makedirs(RESULTS, exist_ok=True)
        suffix = "" if args.batch == 2_500 else f"-batch{args.batch}"
        with open(os.path.join(RESULTS, f"topology-{dt.date.today()}{suffix}.json"), "w") as f:
            f.write(json.dumps(out) + "\n")
    return out


if __name__ == "__main__":
    main()
