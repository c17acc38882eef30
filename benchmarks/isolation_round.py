"""What a round of isolation pays to write nothing when it fails: a sink's write of a
group's outputs as a round wrote it before (Spark's Kafka writer computing the stages
in its own job) beside the write it makes now (``ComputedFirst``: the outputs persisted
and counted, then written from the cache), alternated in one session.

The outputs are a Kafka read of ``--rows`` records (two partitions) through a SQL
stage of the shape that raises on a poison (``raise_error`` under a condition no row
meets), written to a topic by ``KafkaSink(writer="spark")``; the sizes are those of
the groups isolating one poison among 20,000 takes (2,500, 313, 40). Only the write
is timed: the rest of a round's batch (planning, the ack records) is the same
either way.

    .venv/bin/python benchmarks/isolation_round.py [--rows 2500,313,40] [--repeats 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="2500,313,40")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()

    from pyspark.sql import functions as F
    from test_failure_path import produce_many

    from ackstream import KafkaSink, local_session
    from ackstream.topology.isolation_round import ComputedFirst

    from broker import KafkaBroker, create_topic
    from helpers import spark_kafka_conf

    broker = KafkaBroker().start()
    spark = local_session("isolation-round", cores=2, conf=spark_kafka_conf())
    try:
        for rows in [int(r) for r in args.rows.split(",")]:
            inbox, out = create_topic(broker.bootstrap, 2), create_topic(broker.bootstrap, 2)
            produce_many(broker.bootstrap, inbox, rows, 2)
            read = (
                spark.read.format("kafka")
                .option("kafka.bootstrap.servers", broker.bootstrap)
                .option("subscribe", inbox)
                .load()
            )
            text = F.col("value").cast("string")
            outputs = read.withColumn(
                "value", F.when(text == "never", F.raise_error(F.lit("poison"))).otherwise(text)
            )
            sink = KafkaSink(broker.bootstrap, out, writer="spark")
            writers = {"one job": sink, "computed first": ComputedFirst(sink)}
            times: dict[str, list[float]] = {name: [] for name in writers}
            for repeat in range(args.repeats + 1):  # the first round warms up, not kept
                order = list(writers) if repeat % 2 == 0 else list(reversed(writers))
                for name in order:
                    started = time.perf_counter()
                    writers[name].write(outputs, repeat)
                    if repeat:
                        times[name].append(time.perf_counter() - started)
            medians = {name: statistics.median(t) for name, t in times.items()}
            with open("/proc/loadavg") as f:
                load = f.read().split()[:3]
            print(
                f"{rows} rows: "
                + ", ".join(
                    f"{name} {m * 1000:.0f} ms (spread {min(times[name]) * 1000:.0f}-"
                    f"{max(times[name]) * 1000:.0f})"
                    for name, m in medians.items()
                )
                + f", load {' '.join(load)}",
                flush=True,
            )
    finally:
        spark.stop()
        broker.stop()


if __name__ == "__main__":
    main()
