"""The acker demo on the embedded default: no broker, a local Spark session, a
local-directory channel.

A writer thread plays the part of a topology: for each upstream record it writes
Storm-style ack records for a small tuple tree (a spout tuple, children, a
grandchild anchored to two children). A few trees are failed by a bolt and a
few lose an ack, so every outcome shows up. The acker query runs as a real
Spark stateful streaming query; the demo polls the completion channel, prints
progress, and ends with a summary in which every root must be accounted for.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from dataclasses import dataclass

import numpy as np

from ackstream.acker.query import start_acker
from ackstream.records import ACKED, FAILED, TIMED_OUT
from ackstream.sinks.channel import LocalChannel
from ackstream.testing import TupleGraph, ack_records

__all__ = ["AckerDemo", "DemoSummary", "run_acker_demo"]


@dataclass(frozen=True)
class DemoSummary:
    roots: int
    records: int
    acked: int
    failed: int
    timed_out: int
    expected: dict
    p50_ms: float
    p99_ms: float
    seconds: float

    @property
    def accounted_for(self) -> bool:
        """Every root finished, each with the outcome its tree was built for."""
        return (self.acked, self.failed, self.timed_out) == (
            self.expected[ACKED], self.expected[FAILED], self.expected[TIMED_OUT]
        )


class AckerDemo:
    """Writes tuple trees to a channel and follows their completions."""

    def __init__(self, roots: int, batches: int, fail_every: int, lose_every: int, seed: int = 1):
        self.roots, self.batches = roots, batches
        self.fail_every, self.lose_every = fail_every, lose_every
        self.graph = TupleGraph(seed)
        self.records_written = 0
        self.expected = {ACKED: 0, FAILED: 0, TIMED_OUT: 0}
        self.completions: list[dict] = []
        self.position = -1

    def tree(self, root: int, now_ms: int) -> list[dict]:
        g = self.graph
        spout = g.spout(root, topic="demo", partition=root % 4, offset=root)
        left, right = g.emit([spout]), g.emit([spout])
        leaf = g.emit([left, right])
        records = g.ack(spout) + g.ack(left) + g.ack(right)
        if root % self.fail_every == 0:
            self.expected[FAILED] += 1
            return records + g.fail(leaf, ts=now_ms)
        if root % self.lose_every == 0:
            self.expected[TIMED_OUT] += 1
            return records  # the leaf's ack is lost
        self.expected[ACKED] += 1
        return records + g.ack(leaf)

    def write(self, channel: LocalChannel, pause_s: float) -> None:
        per_batch = -(-self.roots // self.batches)
        for first in range(0, self.roots, per_batch):
            now_ms = int(time.time() * 1000)
            records = []
            for root in range(first, min(first + per_batch, self.roots)):
                records += self.tree(root, now_ms)
            records = self.graph.init_records(ts=now_ms) + records
            self.graph = TupleGraph(first + 1)  # a new graph per batch keeps inits per batch
            channel.write_acks(ack_records(records))
            self.records_written += len(records)
            time.sleep(pause_s)

    def poll(self, channel: LocalChannel) -> list[dict]:
        table, self.position = channel.completions_since(self.position)
        self.completions += table.to_pylist()
        return self.completions


def run_acker_demo(
    spark,
    roots: int = 5_000,
    batches: int = 10,
    fail_every: int = 50,
    lose_every: int = 97,
    message_timeout_ms: int = 3_000,
    directory: str | None = None,
    progress=print,
    timeout_s: float = 300.0,
) -> DemoSummary:
    """Run the demo to the end and return its summary."""
    directory = directory or tempfile.mkdtemp(prefix="ackstream-demo-")
    channel = LocalChannel(os.path.join(directory, "channel"))
    demo = AckerDemo(roots, batches, fail_every, lose_every)
    started = time.monotonic()
    query = start_acker(spark, channel, checkpoint=os.path.join(directory, "acker-checkpoint"),
                        ackers=2, message_timeout_ms=message_timeout_ms, trigger_ms=250)
    writer = threading.Thread(target=demo.write, args=(channel, 0.3), daemon=True)
    writer.start()
    try:
        while len(demo.poll(channel)) < roots and time.monotonic() - started < timeout_s:
            if not query.isActive:
                raise RuntimeError(f"the acker query stopped: {query.exception()}")
            done = demo.completions
            progress(
                f"[{time.monotonic() - started:5.1f}s] records written {demo.records_written:>7}  "
                f"acked {sum(c['status'] == ACKED for c in done):>6}  "
                f"failed {sum(c['status'] == FAILED for c in done):>4}  "
                f"timed out {sum(c['status'] == TIMED_OUT for c in done):>4}"
            )
            time.sleep(1.0)
    finally:
        query.stop()
        writer.join(timeout=10)
    done = demo.completions
    latency = np.array([c["latency_ms"] for c in done if c["status"] == ACKED], dtype=float)
    return DemoSummary(
        roots=roots,
        records=demo.records_written,
        acked=sum(c["status"] == ACKED for c in done),
        failed=sum(c["status"] == FAILED for c in done),
        timed_out=sum(c["status"] == TIMED_OUT for c in done),
        expected=dict(demo.expected),
        p50_ms=float(np.percentile(latency, 50)) if len(latency) else float("nan"),
        p99_ms=float(np.percentile(latency, 99)) if len(latency) else float("nan"),
        seconds=time.monotonic() - started,
    )
