"""Helpers for testing topologies and the ledger without a cluster.

- ``init``/``ack``/``fail``/``reset`` and ``ack_records`` build ack-record frames.
- ``FakeClock`` is a clock you move by hand.
- ``TupleGraph`` replays Storm's anchoring rules (``MessageId.anchorsToIds``) on
  an in-memory tuple DAG and yields the exact ack records a Storm bolt would
  send, so tests and benchmarks can feed realistic trees to the ledger.
- ``run_until_settled`` starts a topology, waits until its source says every record
  read is acked or dead-lettered, and stops it.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ackstream.acker import precombine as batch
from ackstream.ui.status import source_metrics
from ackstream.vocabulary import ids
from ackstream.vocabulary.clock import now_ms
from ackstream.vocabulary.lineage import ATTEMPT, EDGE, NO_RECORD, REASON, ROOT
from ackstream.vocabulary.records import ACK, ACK_RECORD_SCHEMA, FAIL, INIT, REJECT, RESET, as_table

__all__ = [
    "init",
    "ack",
    "fail",
    "reject",
    "reset",
    "ack_records",
    "FakeClock",
    "TupleGraph",
    "Tuple",
    "SpoutAcker",
    "with_lineage",
    "tracked_frame",
    "settle",
    "run_until_settled",
    "wait_until_settled",
]


def init(root: int, value: int, *, topic="t", partition=0, offset=0, attempt=0, ts=0) -> dict:
    """The spout's record for ``root``: ``value`` is the XOR of its spout tuples' edges."""
    return dict(
        root=root,
        value=value,
        kind=INIT,
        topic=topic,
        partition=partition,
        offset=offset,
        attempt=attempt,
        ts=ts,
    )


def ack(root: int, value: int, *, ts=0) -> dict:
    return dict(root=root, value=value, kind=ACK, ts=ts)


def fail(root: int, *, ts=0, reason=None) -> dict:
    return dict(root=root, value=0, kind=FAIL, ts=ts, reason=reason)


def reject(root: int, *, ts=0, reason=None) -> dict:
    return dict(root=root, value=0, kind=REJECT, ts=ts, reason=reason)


def reset(root: int, *, ts=0) -> dict:
    return dict(root=root, value=0, kind=RESET, ts=ts)


def ack_records(rows) -> pd.DataFrame:
    """A frame with exactly the ack-record columns, as the acker query receives it."""
    table = pd.DataFrame(list(rows), columns=ACK_RECORD_SCHEMA.names)
    table = table.astype({"root": np.int64, "value": np.int64, "kind": np.int8})
    return table.assign(ts=table["ts"].fillna(0).astype(np.int64))


class FakeClock:
    """A :data:`ackstream.vocabulary.clock.Clock` whose milliseconds move only when told to."""

    def __init__(self, start_ms: int = 1_000_000):
        self.now_ms = start_ms

    def advance(self, ms: int) -> int:
        self.now_ms += ms
        return self.now_ms

    def __call__(self) -> int:
        return self.now_ms


@dataclass(eq=False)
class Tuple:
    """A tuple in flight: per root, the XOR of the edge ids it was anchored with,
    and the XOR of the edge ids of the children it has emitted so far."""

    anchors: dict[int, int]
    children_xor: int = 0
    done: bool = field(default=False)


class TupleGraph:
    """Storm's anchoring, record for record.

    >>> g = TupleGraph()
    >>> s = g.spout(root=7)
    >>> c = g.emit([s])
    >>> records = g.init_records() + g.ack(s) + g.ack(c)
    >>> from functools import reduce
    >>> reduce(lambda a, b: a ^ b, (r["value"] for r in records))
    0
    """

    def __init__(self, seed: int = 0):
        self._counter = itertools.count()
        self._seed = seed
        self._init: dict[int, int] = {}
        self._coords: dict[int, dict] = {}

    def _edge(self) -> int:
        return int(ids.hash_longs(next(self._counter), seed=self._seed))

    def spout(self, root: int, **coords) -> Tuple:
        """A spout tuple of ``root``; its edge joins the root's init value."""
        edge = self._edge()
        self._init[root] = self._init.get(root, 0) ^ edge
        self._coords[root] = coords
        return Tuple({root: edge})

    def emit(self, parents: list[Tuple]) -> Tuple:
        """A child anchored to every parent; each (parent, child) pair gets its own edge."""
        anchors: dict[int, int] = {}
        for parent in parents:
            if parent.done:
                raise ValueError("cannot anchor to a tuple that was already acked or failed")
            edge = self._edge()
            parent.children_xor ^= edge
            for root in parent.anchors:
                anchors[root] = anchors.get(root, 0) ^ edge
        return Tuple(anchors)

    def init_records(self, ts: int = 0) -> list[dict]:
        return [init(r, v, ts=ts, **self._coords[r]) for r, v in self._init.items()]

    def ack(self, t: Tuple, ts: int = 0) -> list[dict]:
        """One ack record per root the tuple is anchored to."""
        t.done = True
        return [ack(r, v ^ t.children_xor, ts=ts) for r, v in t.anchors.items()]

    def fail(self, t: Tuple, ts: int = 0) -> list[dict]:
        t.done = True
        return [fail(r, ts=ts) for r in t.anchors]


class SpoutAcker:
    """A stand-in topology for source tests: a ``foreachBatch`` function that writes, per
    row of an ``ackstream`` source, the spout's init record and then an ack of its spout
    tuple (the tree completes), a fail (``fail(frame)`` is a row mask), or nothing more
    (``lose(frame)``: the tree times out). ``rows`` keeps every row seen, as dicts.

    ``fail`` and ``lose`` get a pandas frame with ``topic, partition, offset, _attempt``.
    Rows the source held back are settled as a topology settles them: an offset with
    no record is acked, any other is rejected with its ``_reason``.
    """

    COLUMNS = ("topic", "partition", "offset", ROOT, EDGE, ATTEMPT, REASON)

    def __init__(self, channel, fail=None, lose=None):
        self.channel, self.fail, self.lose = channel, fail, lose
        self.rows: list[dict] = []

    def __call__(self, batch, batch_id: int) -> None:
        frame = batch.select(*self.COLUMNS).toPandas()
        if not len(frame):
            return
        self.rows += frame.to_dict("records")
        now = now_ms()
        failing = self.fail(frame) if self.fail else np.zeros(len(frame), bool)
        losing = self.lose(frame) if self.lose else np.zeros(len(frame), bool)
        failing, losing = np.asarray(failing, bool), np.asarray(losing, bool) & ~failing
        inits = pd.DataFrame(
            {
                "root": frame[ROOT],
                "value": frame[EDGE],
                "kind": INIT,
                "topic": frame["topic"],
                "partition": frame["partition"],
                "offset": frame["offset"],
                "attempt": frame[ATTEMPT],
                "ts": now,
            }
        )
        rejected = (frame[REASON].notna() & (frame[REASON] != NO_RECORD)).to_numpy()
        failing, losing = failing & ~rejected, losing & ~rejected
        done = frame[~losing]
        kind = np.where(failing, FAIL, np.where(rejected, REJECT, ACK))[~losing]
        ends = pd.DataFrame(
            {
                "root": done[ROOT],
                "value": np.where(kind == ACK, done[EDGE], 0),
                "kind": kind,
                "ts": now,
                "reason": done[REASON].where(kind == REJECT, None),
            }
        )
        self.channel.write_acks(ack_records(inits.to_dict("records") + ends.to_dict("records")))


# --- topology helpers ----------------------------------------------------------------


def with_lineage(df, source: str = "test", attempt: int = 0):
    """``df`` (static or streaming, with ``topic``, ``partition``, ``offset``) plus the
    ``_root``, ``_edge`` and ``_attempt`` columns the ``ackstream`` source would give it,
    so topologies can be tested on any DataFrame."""
    from pyspark.sql import functions as F

    return (
        df.withColumn(ATTEMPT, F.lit(attempt).cast("long"))
        .withColumn(ROOT, ids.spark_root_id(source, attempt=ATTEMPT))
        .withColumn(EDGE, ids.spark_child_edge(ROOT, ids.SPOUT_STAGE, 0))
    )


def tracked_frame(spark, values, *, keys=None, topic="t", partition=0, source="test"):
    """A static tracked DataFrame of string ``values`` at offsets 0, 1, 2, ..."""
    keys = keys or [None] * len(values)
    rows = [(k, v, topic, partition, i) for i, (k, v) in enumerate(zip(keys, values))]
    df = spark.createDataFrame(
        rows, "key string, value string, topic string, partition int, offset long"
    )
    return with_lineage(df, source)


def settle(records, now_ms: int = 1_000_000) -> dict[int, str]:
    """What a topology batch settles of these ack records (Arrow, pandas or a list of
    dicts): per root ``acked``, ``failed``, ``rejected``, or ``pending`` for a root
    whose tree the batch leaves open (it would go to the acker)."""
    frame = ack_records(records) if isinstance(records, list) else records
    done, still_open = batch.settle(batch.precombine(as_table(frame, ACK_RECORD_SCHEMA)), now_ms)
    outcome = dict(zip(done.column("root").to_pylist(), done.column("status").to_pylist()))
    outcome.update({root: "pending" for root in still_open.column("root").to_pylist()})
    return outcome


def run_until_settled(
    topology,
    stream,
    checkpoint: str,
    *,
    records: int | None = None,
    timeout_s: float = 180.0,
    trigger_ms: int = 200,
) -> dict:
    """Start ``topology`` over ``stream``, wait until it settled (see
    :func:`wait_until_settled`), stop it, and return the source's figures."""
    running = topology.start(stream, checkpoint, trigger_ms=trigger_ms)
    try:
        return wait_until_settled(running, records=records, timeout_s=timeout_s)
    finally:
        running.stop()


def wait_until_settled(running, *, records: int | None = None, timeout_s: float = 180.0) -> dict:
    """Wait until the started topology's source says every record it read is settled
    (acked or dead-lettered: no root pending, no replay waiting, every partition's
    watermark at its end), and at least ``records`` of them when given; return its
    figures (:func:`ackstream.ui.status.source_metrics`). The source commits its
    watermark upstream as it moves, so the offsets are committed by then.

    The figures come with Spark's progress, which a trigger that runs no batch reports
    every ``spark.sql.streaming.noDataProgressEventInterval`` (10 s by default): set
    lower on the session before the start, the settled figures show sooner. A query
    that stopped raises its error; ``timeout_s`` passing raises :class:`TimeoutError`
    with the last figures."""
    deadline = time.monotonic() + timeout_s
    figures: dict | None = None
    while time.monotonic() < deadline:
        error = running.exception()
        if error is not None:
            raise error
        figures = source_metrics(running.query.lastProgress)
        if figures is not None and _settled(figures, records):
            return figures
        running.query.awaitTermination(0.1)
    raise TimeoutError(f"not settled within {timeout_s:g} s; the source's last figures: {figures}")


def _settled(figures: dict, records: int | None) -> bool:
    parts = [p for topic in figures["partitions"].values() for p in topic.values()]
    done = figures.get("acked", 0) + figures.get("dead_lettered", 0)
    return (
        figures["pending"] == 0
        and figures.get("waiting", 0) == 0
        and any(p["end"] > 0 for p in parts)
        and all(p["lag"] == 0 for p in parts)
        and (records is None or done >= records)
    )
