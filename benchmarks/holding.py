"""What stages that hold rows across batches cost: the README pipeline's count per batch
beside the same count with a 2 s time window after it, and beside the count split in
two halves (even and odd offsets) joined on the word by a waiting join.

Each variant runs ``Topology.run_batch`` over the same static batches of the
end-to-end benchmark's sentences (tracked, telescoped acks, held rows saved in a
folder as a running query saves them beside its checkpoint, or with ``--held-in
memory`` kept as ``run_batch`` keeps them without one),
one batch after another with the batch time one second apart, so windows close and
held rows are released as in a running query. No channel, no acker, no Kafka: the
time of the stages alone. Variants alternate, each ``--repeats`` times; the figure per
run is the median batch after the first two (Spark's first jobs of a plan are slower).
Prints one JSON line and writes it to ``benchmarks/results/holding-<date>.json``.

    .venv/bin/python benchmarks/holding.py [--records N] [--batches N] [--repeats N]
        [--held-in files|memory] [--variants NAME...]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from e2e import save, sentences  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from ackstream import MemorySink, Topology, local_session  # noqa: E402
from ackstream.testing import tracked_frame  # noqa: E402

VARIANTS = ("count", "count + time window", "two counts + waiting join")
T = 1_000_000_000_000  # the first batch's time (ms): a multiple of the window


def topology(spark, variant: str) -> Topology:
    words = (
        Topology("holding", spark, None)
        .map(lambda df: df.withColumn("line", F.col("value")), name="lines")
        .explode(F.split("line", " "), "word", name="words")
    )
    if variant == "count":
        words = words.aggregate("word", F.count("*").alias("n"))
    elif variant == "count + time window":
        words = words.aggregate("word", F.count("*").alias("n")).window(
            "word", F.sum("n").alias("n"), duration="2s"
        )
    else:
        words = (
            words.filter("offset % 2 = 0", name="even")
            .aggregate("word", F.count("*").alias("n"), name="even_counts")
            .filter("offset % 2 = 1", name="odd", after="words")
            .aggregate("word", F.count("*").alias("m"), name="odd_counts")
            .join("even_counts", "odd_counts", on="word")
        )
    return words.sink(MemorySink())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000, help="sentences a batch")
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--held-in", choices=("files", "memory"), default="files")
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=VARIANTS,
        default=list(VARIANTS),
        help="(count always runs)",
    )
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="ackstream-holding-") if args.held_in == "files" else None
    spark = local_session("ackstream-holding-bench")
    lines = [s.decode() for s in sentences(args.records)]
    frames = [tracked_frame(spark, lines, partition=i).persist() for i in range(args.batches)]
    for frame in frames:
        frame.count()
    load_before = os.getloadavg()
    runs: dict[str, list] = {v: [] for v in VARIANTS if v == "count" or v in args.variants}
    for repeat in range(args.repeats):
        for variant in [v for v in VARIANTS if v == "count" or v in args.variants]:
            built = topology(spark, variant)
            if folder is not None:
                built.held_folder = os.path.join(folder, f"{repeat}-{VARIANTS.index(variant)}")
            seconds = []
            for i, frame in enumerate(frames):
                started = time.perf_counter()
                built.run_batch(frame, i, now_ms=T + 1000 * i)
                seconds.append(time.perf_counter() - started)
            median = statistics.median(seconds[2:])
            runs[variant].append({"batch_s": [round(s, 3) for s in seconds], "median_s": median})
            print(f"holding: {variant}, run {repeat + 1}: {median:.3f} s a batch", file=sys.stderr)
    base = [r["median_s"] for r in runs["count"]]
    summary = {
        v: {
            "median_batch_s": [round(r["median_s"], 3) for r in rs],
            "vs_count": [round(r["median_s"] / b, 2) for r, b in zip(rs, base)],
        }
        for v, rs in runs.items()
    }
    out = {
        "date": dt.date.today().isoformat(),
        "machine": {
            "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        "config": vars(args),
        "summary": summary,
        "runs": runs,
    }
    print(json.dumps(out))
    if not args.no_save:
        print(f"holding: written to {save(out, None, 'holding')}", file=sys.stderr)
    spark.stop()
    if folder is not None:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
