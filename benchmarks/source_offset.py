"""Source offset benchmark: offset size and planning time against work in flight.

The spout alone (generator upstream, local channel, a hand-moved clock; no Spark):
``--records`` offsets are emitted on each of ``--partitions`` partitions and all but
every 7th are acked, so a seventh of them stays in flight with done offsets around
each. Then ``--batches`` steady batches of ``--batch`` new offsets per partition are
planned, each after the previous one's completions (again all but every 7th acked),
as Spark drives a source: ``next_offset`` applies the completions that came since
the last call, commits to the consumer group and plans a batch (writing its state
file); the batch's completions come; ``on_spark_commit`` starts the batch's source
timeouts. Both calls are timed. Prints one JSON line: the offset's size in
bytes (the Spark offset log holds it per batch), the bytes of state written per steady
batch (median and largest) and of the whole file they go against, and the median and
largest planning time (wall clock, and the median in CPU time, which a loaded machine
inflates less).

    .venv/bin/python benchmarks/source_offset.py [--partitions 100] [--records 10000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ackstream.channels.local import LocalChannel
from ackstream.config.source import parse
from ackstream.sources.generator import TOPIC
from ackstream.sources.spout import open_spout
from ackstream.sources.starting import initial_offset
from ackstream.sources.upstream import open_upstream
from ackstream.testing import FakeClock
from ackstream.vocabulary import ids
from ackstream.vocabulary.batch_offset import BatchOffset
from ackstream.vocabulary.records import ACKED, completion_table

SOURCE = "bench"


def ack_all_but_every_7th(channel: LocalChannel, offset: BatchOffset) -> None:
    """Ack every offset the offset's ``read`` names except multiples of 7."""
    roots, parts, offsets = [], [], []
    for (_, p), (lo, hi) in offset.read.items():
        offs = np.arange(lo, hi)
        offs = offs[offs % 7 != 0]
        roots.append(ids.root_ids(SOURCE, TOPIC, int(p), offs, 0))
        parts.append(np.full(len(offs), int(p)))
        offsets.append(offs)
    offsets = np.concatenate(offsets)
    channel.write_completions(
        completion_table(
            np.concatenate(roots),
            ACKED,
            topic=TOPIC,
            partition=np.concatenate(parts),
            offset=offsets,
            attempt=0,
        )
    )


def run(partitions: int, records: int, batch: int, batches: int, folder: str) -> dict:
    config = parse(
        {
            "ackstream.upstream": "generator",
            "ackstream.topology": SOURCE,
            "ackstream.channel": os.path.join(folder, "channel"),
            "ackstream.generator.partitions": str(partitions),
            # every offset the run plans, at once (unbounded, it offers a step at a time)
            "ackstream.generator.count": str(partitions * (records + batch * (batches + 1))),
            "ackstream.messageTimeout": "1 h",
        }
    )
    channel, clock = LocalChannel(config.channel), FakeClock()
    upstream = open_upstream(config)
    spout = open_spout(config, upstream, channel, initial_offset(config, upstream, channel), clock)
    try:
        offset = spout.next_offset(max_rows=partitions * records)
        ack_all_but_every_7th(channel, offset)
        spout.next_offset(max_rows=partitions * batch)  # the big completion applied
        times, cpu, commits, written = [], [], [], []
        for _ in range(batches):
            clock.advance(100)
            started, started_cpu = time.perf_counter(), time.process_time()
            offset = spout.next_offset(max_rows=partitions * batch)
            times.append(time.perf_counter() - started)
            cpu.append(time.process_time() - started_cpu)
            written.append(os.path.getsize(spout.state.path(offset.tracked.seq)))
            ack_all_but_every_7th(channel, offset)
            started = time.perf_counter()
            spout.on_spark_commit(offset)  # Spark ran the batch (its completions: next round)
            commits.append(time.perf_counter() - started)
        return {
            "benchmark": "source_offset",
            "partitions": partitions,
            "records_per_partition": records,
            "in_flight": spout.tracker.in_flight,
            "offset_bytes": len(json.dumps(offset.to_json()).encode()),
            "state_bytes_median": int(statistics.median(written)),
            "state_bytes_max": max(written),
            "state_whole_file_bytes": os.path.getsize(spout.state.path(spout.state.base)),
            "planning_ms_median": round(1000 * statistics.median(times), 1),
            "planning_ms_max": round(1000 * max(times), 1),
            "commit_ms_median": round(1000 * statistics.median(commits), 1),
            "commit_ms_max": round(1000 * max(commits), 1),
            "planning_and_commit_ms_median": round(
                1000 * statistics.median([a + b for a, b in zip(times, commits)]), 1
            ),
            "planning_cpu_ms_median": round(1000 * statistics.median(cpu), 1),
            "batch_per_partition": batch,
            "load_average": round(os.getloadavg()[0], 2),
        }
    finally:
        spout.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=10, help="new offsets per partition")
    parser.add_argument("--batches", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        print(json.dumps(run(args.partitions, args.records, args.batch, args.batches, folder)))


if __name__ == "__main__":
    main()
