"""How fast the source applies outcomes that arrive one per root.

Failures, windows, joins, ``ack_mode="per_stage"`` and trees continued in other
processes report each root's outcome apart (a clean telescoped batch reports runs of
offsets instead). This puts ``--records`` roots of each of ``--partitions`` partitions
in flight in one :class:`~ackstream.sources.tracking.Tracker`, as one read of the
source does, and applies a completion per root for all but every ``--every``-th
offset, as the completion channel gives them (a ``root``, the record's coordinates,
``acked``); then the rest time out. No Spark, no Kafka: the driver's own work.

Each repeat starts from a fresh tracker and reports the CPU and wall seconds of
``complete`` and ``expire``; the figure is outcomes per CPU second (median, with the
spread). Checks every outcome was applied (acked and timed-out counts). Prints one
JSON line and writes it to ``benchmarks/results/outcomes-<date>.json`` (a new file a run).

    .venv/bin/python benchmarks/outcomes.py [--partitions N] [--records N]
        [--every N] [--repeats N] [--no-save]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from acker import machine  # noqa: E402
from e2e import save  # noqa: E402

from ackstream.config.source import RetryPolicy  # noqa: E402
from ackstream.sources.tracking import Tracker  # noqa: E402
from ackstream.vocabulary import ids  # noqa: E402
from ackstream.vocabulary.records import ACKED, COMPLETION_SCHEMA  # noqa: E402

SOURCE, TOPIC, TIMEOUT_MS = "bench", "events", 30_000


def completions(partitions: int, records: int, every: int) -> pa.Table:
    """An ``acked`` completion for each offset of each partition but every ``every``-th."""
    offsets = np.arange(records, dtype=np.int64)
    offsets = offsets[offsets % every != 0]
    n = len(offsets)
    tables = [
        pa.table(
            {
                "root": ids.root_ids(SOURCE, TOPIC, p, offsets, 0),
                "status": pa.array([ACKED] * n),
                "topic": pa.array([TOPIC] * n),
                "partition": pa.array(np.full(n, p, np.int32)),
                "offset": offsets,
                "attempt": pa.array(np.zeros(n, np.int32)),
                "latency_ms": np.zeros(n, np.int64),
                "completed_ms": np.zeros(n, np.int64),
                "reason": pa.nulls(n, pa.string()),
                "end_offset": pa.nulls(n, pa.int64()),
                "ids": pa.nulls(n, pa.string()),
            },
            schema=COMPLETION_SCHEMA,
        )
        for p in range(partitions)
    ]
    return pa.concat_tables(tables)


def run_once(partitions: int, records: int, done: pa.Table) -> dict:
    """One fresh tracker: put every record in flight, apply ``done``, expire the rest."""
    tracker = Tracker(SOURCE, RetryPolicy(500, 10_000, 5), TIMEOUT_MS)
    for p in range(partitions):
        tracker.add_partition((TOPIC, p), 0)
    tracker.emit_ranges([((TOPIC, p), 0, records) for p in range(partitions)], 0)
    cpu, wall = time.process_time(), time.perf_counter()
    tracker.complete(done, 1_000)
    complete_cpu, complete_wall = time.process_time() - cpu, time.perf_counter() - wall
    cpu = time.process_time()
    tracker.expire(TIMEOUT_MS + 10_000)
    expire_cpu = time.process_time() - cpu
    return {
        "complete_cpu_s": round(complete_cpu, 3),
        "complete_wall_s": round(complete_wall, 3),
        "expire_cpu_s": round(expire_cpu, 3),
        "outcomes_per_cpu_s": round(done.num_rows / complete_cpu),
        "acked": tracker.counts["acked"],
        "timed_out": tracker.counts["timed_out"],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--records", type=int, default=70_000, help="a partition")
    parser.add_argument("--every", type=int, default=7, help="this offset of each never acked")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    done = completions(args.partitions, args.records, args.every)
    total = args.partitions * args.records
    load_before = os.getloadavg()
    runs = []
    for repeat in range(args.repeats):
        run = run_once(args.partitions, args.records, done)
        if run["acked"] != done.num_rows or run["timed_out"] != total - done.num_rows:
            raise SystemExit(f"outcomes: run {repeat + 1} applied the wrong outcomes: {run}")
        print(f"outcomes: run {repeat + 1}: {run}", file=sys.stderr)
        runs.append(run)
    rates = [r["outcomes_per_cpu_s"] for r in runs]
    out = {
        "date": dt.date.today().isoformat(),
        "machine": {**machine(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "config": vars(args),
        "outcomes": done.num_rows,
        "outcomes_per_cpu_s": {
            "median": statistics.median(rates),
            "min": min(rates),
            "max": max(rates),
        },
        "complete_wall_s_median": statistics.median(r["complete_wall_s"] for r in runs),
        "runs": runs,
    }
    print(json.dumps(out))
    if not args.no_save:
        print(f"outcomes: written to {save(out, None, 'outcomes')}", file=sys.stderr)
    return out


if __name__ == "__main__":
    main()
