"""The main job on the embedded default: no broker, nothing to start by hand.

A local Spark session reads the built-in generator upstream (deterministic
sentences) with tracking on; a word-split topology counts words into a memory
sink, each batch settles the tuple trees it closed (the acker query beside it
gets only trees left open), and completions go through a local-directory
channel to the source, which commits, replays or dead-letters. A few tuples fail on their first attempt (they are replayed and
then acked) and every ``poison_every``-th record always fails (it is
dead-lettered after ``max_retries`` replays). The summary accounts for every
generated record: acked or dead-lettered, never both, never neither.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass

import numpy as np
from pyspark.sql import functions as F

from ackstream.records import ACKED
from ackstream.channels.local import LocalChannel
from ackstream.sinks.dead_letters import read_dead_letters
from ackstream.sinks.memory import MemorySink
from ackstream.topology import Topology

__all__ = ["DemoSummary", "run_demo"]


@dataclass(frozen=True)
class DemoSummary:
    records: int
    acked: int  #: distinct records whose tree completed
    dead_lettered: int
    replayed: int  #: failed or timed-out attempts, each replayed or dead-lettered
    lost: int  #: records neither acked nor dead-lettered (must be 0)
    both: int  #: records both acked and dead-lettered (must be 0)
    committed: int  #: offsets committed over all partitions
    p50_ms: float  #: complete latency of acked attempts
    p99_ms: float
    seconds: float

    @property
    def accounted_for(self) -> bool:
        return (self.lost, self.both) == (0, 0) and self.acked + self.dead_lettered == \
            self.records == self.committed


def run_demo(
    spark,
    records: int = 2_000,
    partitions: int = 2,
    fail_percent: int = 3,
    poison_every: int = 500,
    max_retries: int = 2,
    message_timeout_ms: int = 10_000,
    directory: str | None = None,
    progress=print,
    timeout_s: float = 600.0,
) -> DemoSummary:
    """Run the word-split topology over ``records`` generated sentences to the end."""
    directory = directory or tempfile.mkdtemp(prefix="ackstream-demo-")
    channel_dir = os.path.join(directory, "channel")
    channel = LocalChannel(channel_dir)
    flaky = (F.col("_attempt") == 0) & (
        F.pmod(F.xxhash64("word", "offset"), F.lit(100)) < fail_percent)
    topology = (
        Topology("demo", spark, channel, message_timeout_ms=message_timeout_ms)
        .map(lambda df: df.withColumn("line", F.col("value").cast("string")))
        .explode(F.split("line", " "), "word")
        .fail_where(flaky, name="flaky_first_attempt")
        .fail_where(F.col("offset") % poison_every == poison_every // 2, name="poison")
        .aggregate("word", F.count("*").alias("n"))
        .sink(MemorySink())
    )
    stream = topology.read_stream({
        "ackstream.upstream": "generator",
        "ackstream.generator.count": records,
        "ackstream.generator.partitions": partitions,
        "ackstream.sourceTimeout": f"{max(3 * message_timeout_ms, 60_000)}ms",
        "ackstream.retryInitialDelay": "200ms",
        "ackstream.maxRetries": max_retries,
    })
    started = time.monotonic()
    running = topology.start(stream, os.path.join(directory, "checkpoint"), trigger_ms=500)
    seen, position = [], None
    try:
        while time.monotonic() - started < timeout_s:
            if running.exception():
                raise RuntimeError(f"a query of the demo stopped: {running.exception()}")
            table, position = channel.completions_since(position)
            seen += table.to_pylist()
            committed = _committed(channel_dir)
            dead = read_dead_letters(os.path.join(channel_dir, "dead_letters")).num_rows
            progress(f"[{time.monotonic() - started:5.1f}s] committed {committed:>6}/{records}"
                     f"  acked {sum(c['status'] == ACKED for c in seen):>6}"
                     f"  replayed {sum(c['status'] != ACKED for c in seen):>4}"
                     f"  dead-lettered {dead:>3}")
            if committed >= records:
                break
            time.sleep(1.0)
    finally:
        running.stop()
    table, position = channel.completions_since(position)
    seen += table.to_pylist()
    return _summary(seen, channel_dir, records, partitions, time.monotonic() - started)


def _committed(channel_dir: str) -> int:
    """Offsets the generator's group commit covers, over all partitions."""
    try:
        with open(os.path.join(channel_dir, "generator-commits.json")) as f:
            return sum(entry[0] for entry in json.load(f).values())
    except (FileNotFoundError, ValueError):
        return 0


def _summary(seen, channel_dir, records, partitions, seconds) -> DemoSummary:
    per, extra = divmod(records, partitions)  # as the generator splits its count
    everything = {(p, o) for p in range(partitions) for o in range(per + (p < extra))}
    acked = {(c["partition"], c["offset"]) for c in seen if c["status"] == ACKED}
    letters = read_dead_letters(os.path.join(channel_dir, "dead_letters")).to_pylist()
    dead = {(d["partition"], d["offset"]) for d in letters}
    latency = np.array([c["latency_ms"] for c in seen if c["status"] == ACKED], dtype=float)
    return DemoSummary(
        records=records,
        acked=len(acked & everything),
        dead_lettered=len(dead),
        replayed=sum(c["status"] != ACKED for c in seen),
        lost=len(everything - acked - dead),
        both=len(acked & dead),
        committed=_committed(channel_dir),
        p50_ms=float(np.percentile(latency, 50)) if len(latency) else float("nan"),
        p99_ms=float(np.percentile(latency, 99)) if len(latency) else float("nan"),
        seconds=seconds,
    )
