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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Required, TypedDict, Unpack

import numpy as np
import numpy.typing as npt
import pandas as pd

from ackstream.acker import precombine as batch
from ackstream.ui.status import source_metrics
from ackstream.vocabulary import ids
from ackstream.vocabulary.clock import now_ms
from ackstream.vocabulary.lineage import ATTEMPT, EDGE, NO_RECORD, REASON, ROOT
from ackstream.vocabulary.records import ACK, ACK_RECORD_SCHEMA, FAIL, INIT, REJECT, RESET, as_table

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from ackstream.channels.base import Channel
    from ackstream.topology import Topology
    from ackstream.topology.running import RunningTopology

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


class Coordinates(TypedDict, total=False):
    """Where a root's record is: what a spout's init record carries of it."""

    topic: str
    partition: int
    offset: int
    attempt: int


class AckRecordRow(Coordinates, total=False):
    """One ack record as a dict (a row of ``ACK_RECORD_SCHEMA``; the coordinates only on
    an init, the reason only on a fail or reject)."""

    root: Required[int]
    value: Required[int]
    kind: Required[int]
    ts: Required[int]
    reason: str | None


def init(
    root: int,
    value: int,
    *,
    topic: str = "t",
    partition: int = 0,
    offset: int = 0,
    attempt: int = 0,
    ts: int = 0,
) -> AckRecordRow:
    """The spout's record for ``root``: ``value`` is the XOR of its spout tuples' edges."""
    return AckRecordRow(
        root=root,
        value=value,
        kind=INIT,
        topic=topic,
        partition=partition,
        offset=offset,
        attempt=attempt,
        ts=ts,
    )


def ack(root: int, value: int, *, ts: int = 0) -> AckRecordRow:
    return AckRecordRow(root=root, value=value, kind=ACK, ts=ts)


def fail(root: int, *, ts: int = 0, reason: str | None = None) -> AckRecordRow:
    return AckRecordRow(root=root, value=0, kind=FAIL, ts=ts, reason=reason)


def reject(root: int, *, ts: int = 0, reason: str | None = None) -> AckRecordRow:
    return AckRecordRow(root=root, value=0, kind=REJECT, ts=ts, reason=reason)


def reset(root: int, *, ts: int = 0) -> AckRecordRow:
    return AckRecordRow(root=root, value=0, kind=RESET, ts=ts)


def ack_records(rows: Iterable[AckRecordRow]) -> pd.DataFrame:
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
        self._coords: dict[int, Coordinates] = {}

    def _edge(self) -> int:
        return int(ids.hash_longs(next(self._counter), seed=self._seed))

    def spout(self, root: int, **coords: Unpack[Coordinates]) -> Tuple:
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

    def init_records(self, ts: int = 0) -> list[AckRecordRow]:
        return [init(r, v, ts=ts, **self._coords[r]) for r, v in self._init.items()]

    def ack(self, t: Tuple, ts: int = 0) -> list[AckRecordRow]:
        """One ack record per root the tuple is anchored to."""
        t.done = True
        return [ack(r, v ^ t.children_xor, ts=ts) for r, v in t.anchors.items()]

    def fail(self, t: Tuple, ts: int = 0) -> list[AckRecordRow]:
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

    def __init__(
        self,
        channel: Channel,
        fail: Callable[[pd.DataFrame], npt.ArrayLike] | None = None,
        lose: Callable[[pd.DataFrame], npt.ArrayLike] | None = None,
    ):
        self.channel, self.fail, self.lose = channel, fail, lose
        self.rows: list[dict[str, Any]] = []  # pandas' records: any column's values

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        frame: pd.DataFrame = batch.select(*self.COLUMNS).toPandas()
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


def with_lineage(df: DataFrame, source: str = "test", attempt: int = 0) -> DataFrame:
    """``df`` (static or streaming, with ``topic``, ``partition``, ``offset``) plus the
    ``_root``, ``_edge`` and ``_attempt`` columns the ``ackstream`` source would give it,
    so topologies can be tested on any DataFrame."""
    from pyspark.sql import functions as F

    return (
        df.withColumn(ATTEMPT, F.lit(attempt).cast("long"))
        .withColumn(ROOT, ids.spark_root_id(source, attempt=ATTEMPT))
        .withColumn(EDGE, ids.spark_child_edge(ROOT, ids.SPOUT_STAGE, 0))
    )


def tracked_frame(
    spark: SparkSession,
    values: Sequence[str | None],
    *,
    keys: Sequence[str | None] | None = None,
    topic: str = "t",
    partition: int = 0,
    source: str = "test",
) -> DataFrame:
    """A static tracked DataFrame of string ``values`` at offsets 0, 1, 2, ..."""
    keys = keys or [None] * len(values)
    rows = [(k, v, topic, partition, i) for i, (k, v) in enumerate(zip(keys, values))]
    df = spark.createDataFrame(
        rows, "key string, value string, topic string, partition int, offset long"
    )
    return with_lineage(df, source)


def settle(
    records: pa.Table | pd.DataFrame | list[AckRecordRow], now_ms: int = 1_000_000
) -> dict[int, str]:
    """What a topology batch settles of these ack records (Arrow, pandas or a list of
    dicts): per root ``acked``, ``failed``, ``rejected``, or ``pending`` for a root
    whose tree the batch leaves open (it would go to the acker)."""
    frame = ack_records(records) if isinstance(records, list) else records
    done, still_open = batch.settle(batch.precombine(as_table(frame, ACK_RECORD_SCHEMA)), now_ms)
    outcome = dict(zip(done.column("root").to_pylist(), done.column("status").to_pylist()))
    outcome.update({root: "pending" for root in still_open.column("root").to_pylist()})
    return outcome


def run_until_settled(
    topology: Topology,
    stream: DataFrame,
    checkpoint: str,
    *,
    records: int | None = None,
    timeout_s: float = 180.0,
    trigger_ms: int = 200,
) -> dict[str, Any]:
    """Start ``topology`` over ``stream``, wait until it settled (see
    :func:`wait_until_settled`), stop it, and return the source's figures."""
    running = topology.start(stream, checkpoint, trigger_ms=trigger_ms)
    try:
        return wait_until_settled(running, records=records, timeout_s=timeout_s)
    finally:
        running.stop()


def wait_until_settled(
    running: RunningTopology, *, records: int | None = None, timeout_s: float = 180.0
) -> dict[str, Any]:
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
    figures: dict[str, Any] | None = None  # the source's figures: numbers and nested maps
    while time.monotonic() < deadline:
        error = running.exception()
        if error is not None:
            raise error
        figures = source_metrics(running.query.lastProgress)
        if figures is not None and _settled(figures, records):
            return figures
        running.query.awaitTermination(0.1)
    raise TimeoutError(f"not settled within {timeout_s:g} s; the source's last figures: {figures}")


def _settled(figures: dict[str, Any], records: int | None) -> bool:
    parts = [p for topic in figures["partitions"].values() for p in topic.values()]
    done = figures.get("acked", 0) + figures.get("dead_lettered", 0)
    return (
        figures["pending"] == 0
        and figures.get("waiting", 0) == 0
        and any(p["end"] > 0 for p in parts)
        and all(p["lag"] == 0 for p in parts)
        and (records is None or done >= records)
    )
