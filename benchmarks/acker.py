"""Acker benchmark: ack records per second, several ways, in one run.

- ``ledger``: the pure vectorised ``step`` in batches;
- ``acker_query``: the real ``start_acker`` query on the local channel, whose one
  ledger runs on the driver, with where its time goes per batch (Spark's planning and
  commit, bringing the records to the driver, checking them, the ledger, saving the
  pending table, writing completions);
- ``acker_query_kafka``: the real ``start_acker`` query on a Kafka channel (an Apache
  Kafka broker on loopback, started here), one ledger per shard in the tasks that read
  the acks topic's partitions, ``ackers=2``; the driver's rows a batch are counted to
  show that no ack record reaches it (skipped when Kafka's jars are missing);
- ``running_acker``: both forms already running (their start left out), the records
  written while each waits for its next trigger, alternated twice;
- ``spark_per_root``: the design card's literal form, ``groupBy(root)`` with a per-root state;
- ``storm_dict``: Storm's Acker.java algorithm as a plain Python dict in rotating buckets.

Records are real Storm-style init/ack records (``generate``): every root's XOR is 0,
so every root must complete as acked, and each run checks the exact counts.
Prints one JSON line and writes it to ``benchmarks/results/acker-<date>.json``.

    .venv/bin/python benchmarks/acker.py [--quick] [--records N] [--fanout K] ...
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import time

import numpy as np
import pandas as pd
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ackstream.acker.ledger import Pending, step
from ackstream.vocabulary import ids
from ackstream.vocabulary.records import ACK, ACK_RECORD_SCHEMA, ACKED, INIT

if __name__ != "__main__":  # imported (tests): Spark's Python workers cannot import us by name
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
TIMEOUT_MS = 600_000  # nothing may time out during a run

# --- records ------------------------------------------------------------------------


def generate(n_roots: int, fanout: int = 8, block_roots: int = 10_000, seed: int = 0) -> pa.Table:
    """Ack records of ``n_roots`` trees: a spout tuple with ``fanout`` children (leaves).

    Per root: the init (XOR of the spout edge), the spout tuple's ack (its edge XOR
    its children's edges) and one ack per child, so ``fanout + 2`` records whose XOR
    is 0. Edge ids are ``ackstream.vocabulary.ids`` hashes, as the topology derives them. Records
    of each block of roots are shuffled, so a root's records are spread out.
    """
    rng = np.random.default_rng(seed)
    offsets = np.arange(n_roots, dtype=np.int64)
    partitions = (offsets % 4).astype(np.int32)
    roots = ids.root_ids("bench", "events", partitions, offsets, 0)
    spout = ids.spout_edges(roots)
    kids = np.stack([ids.child_edges(spout, 1, i) for i in range(fanout)], axis=1)
    spout_ack = spout ^ np.bitwise_xor.reduce(kids, axis=1)
    per_root = fanout + 2
    root_col = np.repeat(roots, per_root)
    value = np.concatenate([spout[:, None], spout_ack[:, None], kids], axis=1).reshape(-1)
    is_init = np.tile(np.r_[True, np.zeros(per_root - 1, bool)], n_roots)
    order = (
        np.concatenate(
            [
                start * per_root + rng.permutation(min(block_roots, n_roots - start) * per_root)
                for start in range(0, n_roots, block_roots)
            ]
        )
        if n_roots
        else np.empty(0, np.int64)
    )
    root_col, value, is_init = root_col[order], value[order], is_init[order]
    owner = order // per_root
    no_init = ~is_init
    now = int(time.time() * 1000)
    return pa.table(
        {
            "root": root_col,
            "value": value,
            "kind": np.where(is_init, INIT, ACK).astype(np.int8),
            "topic": pa.array(np.where(is_init, "events", None), pa.string()),
            "partition": pa.array(partitions[owner], pa.int32(), mask=no_init),
            "offset": pa.array(offsets[owner], pa.int64(), mask=no_init),
            "attempt": pa.array(np.zeros(len(order), np.int32), pa.int32(), mask=no_init),
            "ts": np.full(len(order), now, np.int64),
            "reason": pa.nulls(len(order), pa.string()),
        },
        schema=ACK_RECORD_SCHEMA,
    )


def _check(acked: int, other: int, n_roots: int, what: str) -> None:
    if acked != n_roots or other:
        raise AssertionError(f"{what}: {acked} acked, {other} other, expected {n_roots} acked")


# --- a. the pure ledger -------------------------------------------------------------


def bench_ledger(records: pa.Table, n_roots: int, batch_rows: int = 200_000) -> dict:
    """Records/s through ``step``, one shard, ``batch_rows`` records per call."""
    frame = records.to_pandas()
    batches = [frame.iloc[i : i + batch_rows] for i in range(0, len(frame), batch_rows)]
    pending, now, acked, other = Pending.empty(0), 1_000, 0, 0
    start = time.perf_counter()
    for batch in batches:
        now += 10
        pending, done = step(pending, batch, now, TIMEOUT_MS)
        ok = int((done["status"] == ACKED).sum())
        acked, other = acked + ok, other + len(done) - ok
    seconds = time.perf_counter() - start
    _check(acked, other + len(pending), n_roots, "ledger")
    return {
        "records_per_s": len(frame) / seconds,
        "roots_per_s": n_roots / seconds,
        "seconds": seconds,
        "batch_rows": batch_rows,
    }


# --- b. the Spark acker query ---------------------------------------------------


def _write_files(channel, records: pa.Table, files: int) -> None:
    rows = -(-records.num_rows // files)
    for i in range(0, records.num_rows, rows):
        channel.write_acks(records.slice(i, rows))


def _measure(channel, query, rows: int, n_roots: int, limit_s: float, what: str) -> dict:
    """Run ``query`` until every root completed, stop it, check the counts: the rates."""
    try:
        acked, other, seconds = _wait_completions(channel, query, n_roots, limit_s)
        progress = _progress(query)
    finally:
        query.stop()
    _check(acked, other, n_roots, what)
    return {
        "records_per_s": rows / seconds,
        "roots_per_s": n_roots / seconds,
        "seconds": seconds,
        **progress,
    }


def _wait_completions(channel, query, n_roots: int, limit_s: float) -> tuple[int, int, float]:
    """Poll the completion channel until ``n_roots`` roots completed; (acked, other, s)."""
    import pyarrow.compute as pc

    start, position, acked, other = time.perf_counter(), None, 0, 0
    while acked + other < n_roots:
        if query.exception():
            raise RuntimeError(f"acker query failed: {query.exception()}")
        if time.perf_counter() - start > limit_s:
            raise AssertionError(f"only {acked + other} of {n_roots} roots completed")
        table, position = channel.completions_since(position)
        ok = int(pc.sum(pc.equal(table["status"], ACKED)).as_py() or 0)
        acked, other = acked + ok, other + table.num_rows - ok
        if acked + other < n_roots:
            time.sleep(0.02)
    return acked, other, time.perf_counter() - start


def _progress(query) -> dict:
    """Batch count and summed durations (ms) of the batches that did work."""
    batches = [p for p in query.recentProgress if "addBatch" in p["durationMs"]]
    durations: dict[str, int] = {}
    for p in batches:
        for k, v in p["durationMs"].items():
            durations[k] = durations.get(k, 0) + v
    return {"batches": len(batches), "duration_ms": durations}


class PhaseTimer:
    """Seconds spent in each phase of the acker's batches, by wrapping the functions that
    run them (in local mode ``foreachBatch`` runs in this process)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._undo = []

    def wrap(self, owner, name: str, phase: str) -> None:
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, original))

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()


def bench_acker_query(
    spark,
    records: pa.Table,
    n_roots: int,
    workdir: str,
    *,
    files: int = 40,
    max_files_per_trigger: int | None = 10,
    limit_s: float = 900,
    name: str = "acker",
) -> dict:
    """Records/s of the real acker query, from its start to the last root's completion,
    and the seconds of each phase of its batches."""
    from pyspark.sql.classic.dataframe import DataFrame

    from ackstream.acker import batch as acker_batch
    from ackstream.acker import query as acker_query
    from ackstream.acker.pending_store import PendingStore
    from ackstream.channels.local import LocalChannel

    channel = LocalChannel(os.path.join(workdir, f"{name}-channel"))
    _write_files(channel, records, files)
    timer = PhaseTimer()
    timer.wrap(DataFrame, "toArrow", "records_to_driver_by_spark")
    timer.wrap(acker_query, "batch_records", "read_batch_files")
    timer.wrap(acker_batch, "checked", "check")
    timer.wrap(acker_batch, "step", "ledger_step")
    timer.wrap(PendingStore, "save", "save_pending")
    timer.wrap(acker_query, "report", "report")
    timer.wrap(channel, "write_completions", "write_completions")
    try:
        query = acker_query.start_acker(
            spark,
            channel,
            checkpoint=os.path.join(workdir, f"{name}-ckpt"),
            message_timeout_ms=TIMEOUT_MS,
            trigger_ms=0,
            max_files_per_trigger=max_files_per_trigger,
            query_name=f"bench_{name}",
        )
        measured = _measure(channel, query, records.num_rows, n_roots, limit_s, "acker_query")
    finally:
        timer.restore()
    durations = measured["duration_ms"]
    phases = {k: round(v, 3) for k, v in timer.seconds.items()}
    phases["spark_outside_foreach_batch"] = (
        durations.get("triggerExecution", 0) - durations.get("addBatch", 0)
    ) / 1000
    return {
        **measured,
        "files": files,
        "max_files_per_trigger": max_files_per_trigger,
        "phase_seconds": phases,
    }


def bench_acker_query_kafka(
    spark,
    records: pa.Table,
    n_roots: int,
    workdir: str,
    bootstrap: str,
    *,
    limit_s: float = 900,
    name: str = "acker",
) -> dict:
    """Records/s of the real acker query on a Kafka channel with two shards, from its
    start to the last root's completion; the records are on the acks topic before it
    starts, so they come in one batch. ``driver_rows_per_batch``: what the driver got."""
    from ackstream.channels.kafka import KafkaChannel

    channel = KafkaChannel(bootstrap, f"bench-{name}-{os.getpid()}-{time.time_ns()}")
    channel.prepare()
    _write_kafka(channel, records)
    query = _two_shards(spark, channel, workdir, f"kafka_{name}", trigger_ms=0)
    try:
        acked, other, seconds = _wait_completions(channel, query, n_roots, limit_s)
        deadline = time.monotonic() + 30  # a batch reports after its shards wrote
        while not _progress(query)["batches"] and time.monotonic() < deadline:
            time.sleep(0.05)
        progress = _progress(query)
        rows = [p["numInputRows"] for p in query.recentProgress if "addBatch" in p["durationMs"]]
    finally:
        query.stop()
        channel.close()
    _check(acked, other, n_roots, name)
    return {
        "records_per_s": records.num_rows / seconds,
        "roots_per_s": n_roots / seconds,
        "seconds": seconds,
        **progress,
        "ackers": 2,
        "driver_rows_per_batch": rows,
    }


def bench_running_acker(
    spark,
    channel,
    write,
    records: pa.Table,
    n_roots: int,
    workdir: str,
    *,
    trigger_ms: int = 10_000,
    limit_s: float = 900,
    name: str = "running",
) -> dict:
    """Records/s of an acker query that is already running: its first batch settles a
    few warm-up trees, then ``write(channel, records)`` puts the records on the channel
    while it waits for its next trigger; timed from the trigger start of the first
    batch that takes them (its progress timestamp) to the last root's completion read
    back. What a long-running acker sees, without the query's start."""
    import datetime as dt_

    warm_roots = 10
    write(channel, generate(warm_roots, seed=4))
    query = _two_shards(spark, channel, workdir, name, trigger_ms=trigger_ms)
    try:
        _wait_completions(channel, query, warm_roots, limit_s)
        _batches_reported(query, 1, limit_s)  # the next trigger is the timed one
        write(channel, records)
        acked, other, _ = _wait_completions(channel, query, warm_roots + n_roots, limit_s)
        ended = time.time()
        taken = _batches_reported(query, 2, limit_s)[1]
    finally:
        query.stop()
    _check(acked - warm_roots, other, n_roots, name)
    began = dt_.datetime.fromisoformat(taken["timestamp"].replace("Z", "+00:00")).timestamp()
    return {
        "records_per_s": records.num_rows / (ended - began),
        "seconds": ended - began,
        "batch_duration_ms": taken["durationMs"],
        "batch_input_rows": taken["numInputRows"],  # 0 on the local channel: see file_batch
        "trigger_ms": trigger_ms,
    }


def _batches_reported(query, count: int, limit_s: float) -> list[dict]:
    """The progress of the query's first ``count`` batches that ran (``addBatch``), once
    Spark reported them; a batch reports after its completions were written."""
    deadline = time.monotonic() + limit_s
    while True:
        ran = [p for p in query.recentProgress if "addBatch" in p["durationMs"]]
        if len(ran) >= count:
            return ran
        if query.exception() or time.monotonic() > deadline:
            raise AssertionError(f"{len(ran)} of {count} batches: {query.exception()}")
        time.sleep(0.02)


def _two_shards(spark, channel, workdir: str, name: str, *, trigger_ms: int):
    """The acker query on ``channel`` with ``ackers=2``, its checkpoint in ``workdir``."""
    from ackstream.acker.query import start_acker

    return start_acker(
        spark,
        channel,
        checkpoint=os.path.join(workdir, f"{name}-ckpt"),
        ackers=2,
        message_timeout_ms=TIMEOUT_MS,
        trigger_ms=trigger_ms,
        query_name=f"bench_{name}",
    )


def _write_kafka(channel, records: pa.Table) -> None:
    for piece in records.to_batches(max_chunksize=200_000):
        channel.write_acks(pa.Table.from_batches([piece]))


def bench_running_forms(
    spark,
    records: pa.Table,
    n_roots: int,
    workdir: str,
    bootstrap: str,
    trigger_ms: int,
    rounds: int = 2,
) -> dict:
    """Both acker forms already running, the local channel's (one ledger on the driver)
    and the Kafka channel's (a ledger per shard in the read tasks), ``rounds`` pairs in
    alternating order."""
    from ackstream.channels.kafka import KafkaChannel
    from ackstream.channels.local import LocalChannel

    runs: dict[str, list] = {"local": [], "kafka": []}
    order = [("local", "kafka") if r % 2 == 0 else ("kafka", "local") for r in range(rounds)]
    for i, form in enumerate(f for pair in order for f in pair):
        if form == "local":
            channel = LocalChannel(os.path.join(workdir, f"running-{i}-channel"))

            def write(c, table):
                _write_files(c, table, 40)

        else:
            channel = KafkaChannel(bootstrap, f"bench-running-{os.getpid()}-{time.time_ns()}")
            channel.prepare()
            write = _write_kafka
        try:
            runs[form].append(
                bench_running_acker(
                    spark,
                    channel,
                    write,
                    records,
                    n_roots,
                    workdir,
                    trigger_ms=trigger_ms,
                    name=f"running-{i}-{form}",
                )
            )
        finally:
            channel.close()
    return {
        form: {"runs": r, "records_per_s": sum(x["records_per_s"] for x in r) / len(r)}
        for form, r in runs.items()
    }


# --- c. the design card's literal form, keyed by root -------------------------------

PER_ROOT_STATE_DDL = "value long, init boolean"


def _per_root(key, frames, state):
    """Storm's AckObject per root id: XOR the values, remember the init, ack at 0."""
    if state.hasTimedOut:
        state.remove()
        yield pd.DataFrame({"root": [key[0]], "status": ["timed_out"]})
        return
    value, init = state.get if state.exists else (0, False)
    for f in frames:
        value ^= int(np.bitwise_xor.reduce(f["value"].to_numpy(np.int64)))
        init = init or bool((f["kind"].to_numpy() & INIT).any())
    if init and value == 0:
        state.remove()
        yield pd.DataFrame({"root": [key[0]], "status": [ACKED]})
    else:
        state.update((value, init))
        state.setTimeoutDuration(TIMEOUT_MS)


def bench_spark_per_root(
    spark, records: pa.Table, n_roots: int, workdir: str, *, files: int = 10, limit_s: float = 900
) -> dict:
    """Records/s of ``groupBy(root).applyInPandasWithState`` with a per-root state."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    from ackstream.channels.local import LocalChannel

    channel = LocalChannel(os.path.join(workdir, "root-channel"))
    _write_files(channel, records, files)
    done = (
        channel.ack_stream(spark, max_files_per_trigger=max(1, files // 4))
        .groupBy("root")
        .applyInPandasWithState(
            _per_root,
            outputStructType="root long, status string",
            stateStructType=PER_ROOT_STATE_DDL,
            outputMode="append",
            timeoutConf=GroupStateTimeout.ProcessingTimeTimeout,
        )
    )
    query = (
        done.withColumn("topic", _null("string"))
        .withColumn("partition", _null("int"))
        .withColumn("offset", _null("long"))
        .withColumn("attempt", _null("int"))
        .withColumn("latency_ms", _null("long"))
        .withColumn("completed_ms", _null("long"))
        .withColumn("reason", _null("string"))
        .writeStream.foreachBatch(lambda b, i: channel.write_completions(b.toArrow(), i))
        .option("checkpointLocation", os.path.join(workdir, "root-ckpt"))
        .trigger(processingTime="0 milliseconds")
        .queryName("bench_per_root")
        .start()
    )
    return {
        **_measure(channel, query, records.num_rows, n_roots, limit_s, "spark_per_root"),
        "files": files,
    }


def _null(kind: str):
    from pyspark.sql import functions as F

    return F.lit(None).cast(kind)


# --- d. Storm's Acker.java as a Python dict in rotating buckets ---------------------


class RotatingMap:
    """Storm's RotatingMap: a deque of dict buckets; ``put`` goes to the head bucket and
    ``rotate`` drops the tail bucket (its entries expired)."""

    def __init__(self, buckets: int = 3):
        self.buckets = [{} for _ in range(buckets)]

    def get(self, key):
        for bucket in self.buckets:
            if key in bucket:
                return bucket[key]
        return None

    def put(self, key, value):
        head = self.buckets[0]
        head[key] = value
        for bucket in self.buckets[1:]:
            bucket.pop(key, None)

    def remove(self, key):
        for bucket in self.buckets:
            if key in bucket:
                return bucket.pop(key)
        return None

    def rotate(self) -> dict:
        dead = self.buckets.pop()
        self.buckets.insert(0, {})
        return dead

    def __len__(self):
        return sum(map(len, self.buckets))


class AckObject:
    """Per root: the XOR value, whether it failed and the init's coordinates."""

    __slots__ = ("failed", "spout", "val")

    def __init__(self):
        self.val, self.failed, self.spout = 0, False, None


def storm_acker(rows, rotate_every: int = 100_000):
    """Acker.execute for each (root, value, kind, topic, partition, offset) row; a tick
    (``rotate``) every ``rotate_every`` rows. Returns (acked, failed, expired, pending)."""
    pending, acked, failed, expired = RotatingMap(), [], [], 0
    for i, (root, value, kind, topic, partition, offset) in enumerate(rows):
        if i % rotate_every == 0 and i:
            expired += len(pending.rotate())
        curr = pending.get(root)
        if curr is None:
            curr = AckObject()
        curr.val ^= value
        if kind & INIT:
            curr.spout = (topic, partition, offset)
        if kind & 2:
            curr.failed = True
        pending.put(root, curr)
        if curr.failed and curr.spout is not None:
            pending.remove(root)
            failed.append((root, curr.spout))
        elif curr.val == 0 and curr.spout is not None:
            pending.remove(root)
            acked.append((root, curr.spout))
    return acked, failed, expired, pending


def bench_storm_dict(records: pa.Table, n_roots: int) -> dict:
    """Records/s of ``storm_acker`` over Python tuples (conversion not timed)."""
    cols = [
        records[c].to_pylist() for c in ("root", "value", "kind", "topic", "partition", "offset")
    ]
    rows = list(zip(*cols))
    start = time.perf_counter()
    acked, failed, expired, pending = storm_acker(rows)
    seconds = time.perf_counter() - start
    _check(len(acked), len(failed) + expired + len(pending), n_roots, "storm_dict")
    return {
        "records_per_s": len(rows) / seconds,
        "roots_per_s": n_roots / seconds,
        "seconds": seconds,
    }


# --- state size ---------------------------------------------------------------------


def state_bytes(n_roots: int = 20_000, fanouts=(2, 100), workdir: str | None = None) -> dict:
    """Bytes per pending root of the acker's saved state (``PendingStore`` files), with
    every root's init and half its acks in, for small and big trees: the size of the
    file for ``n_roots`` roots over ``n_roots``, and what each root adds to it."""
    from ackstream.acker.pending_store import PendingStore

    out = {}
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        for fanout in fanouts:
            records = generate(n_roots, fanout, block_roots=n_roots).to_pandas()
            nth_ack = records[records["kind"] != INIT].groupby("root").cumcount()
            keep = (records["kind"] == INIT) | (nth_ack.reindex(records.index) % 2 == 1)
            pending, done = step(Pending.empty(0), records[keep], 1_000, TIMEOUT_MS)
            if len(done) or len(pending) != n_roots:
                raise AssertionError("state_bytes: roots completed that should be pending")
            one = Pending(pending.table[:1], pending.epoch_ms, pending.topics)
            size, size_one = (
                PendingStore(os.path.join(tmp, f"{fanout}-{len(p)}")).save(0, p)
                for p in (pending, one)
            )
            out[f"fanout_{fanout}"] = size / n_roots
            out[f"fanout_{fanout}_each_more_root"] = (size - size_one) / (n_roots - 1)
    # the per-root form's state row: value long + init boolean, plus its root key
    out["per_root_form_row"] = 8 + 1 + 8
    return out


# --- the run ------------------------------------------------------------------------


def machine() -> dict:
    import pyspark

    model, mem = None, None
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None
            )
        with open("/proc/meminfo") as f:
            mem = next((int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemTotal")), None)
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "memory_bytes": mem,
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
    }


def run(
    spark,
    *,
    roots: int,
    per_root_roots: int,
    fanout: int = 8,
    files: int = 40,
    max_files_per_trigger: int | None = 10,
    state_roots: int = 20_000,
    workdir: str | None = None,
    bootstrap: str | None = None,
    running_trigger_ms: int = 10_000,
    running_rounds: int = 2,
) -> dict:
    """Every measurement on ``spark`` (the Kafka acker's on the broker at ``bootstrap``,
    if given); returns the result dict (the JSON line)."""
    records = generate(roots, fanout)
    small = generate(per_root_roots, fanout, seed=1)
    warm_roots = max(1, min(roots, 10_000))
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        ledger = bench_ledger(records, roots)
        storm = bench_storm_dict(records, roots)
        # a short untimed run first, so the JVM's JIT and Python workers are warm
        bench_acker_query(
            spark,
            generate(warm_roots, fanout, seed=2),
            warm_roots,
            tmp,
            files=4,
            max_files_per_trigger=2,
            name="warmup",
        )
        kafka = None
        if bootstrap:  # the same warm-up, then the two forms alternated
            warm = generate(warm_roots, fanout, seed=3)
            bench_acker_query_kafka(spark, warm, warm_roots, tmp, bootstrap, name="warmup")
            kafka = bench_acker_query_kafka(spark, records, roots, tmp, bootstrap)
        acker = bench_acker_query(
            spark, records, roots, tmp, files=files, max_files_per_trigger=max_files_per_trigger
        )
        if bootstrap:
            again = bench_acker_query_kafka(spark, records, roots, tmp, bootstrap, name="again")
            runs = [kafka, again]  # the mean of the runs before and after the local one
            kafka = {"runs": runs, "records_per_s": sum(r["records_per_s"] for r in runs) / 2}
        running = (
            bench_running_forms(
                spark, records, roots, tmp, bootstrap, running_trigger_ms, running_rounds
            )
            if bootstrap
            else None
        )
        per_root = bench_spark_per_root(spark, small, per_root_roots, tmp)

    def rate(figures):
        return figures["records_per_s"]

    size = state_bytes(state_roots, workdir=workdir)
    return {
        "benchmark": "acker",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "ledger_records_per_s": rate(ledger),
        "acker_query_records_per_s": rate(acker),
        "acker_query_roots_per_s": acker["roots_per_s"],
        "acker_query_kafka_records_per_s": rate(kafka) if kafka else None,
        "running_acker_records_per_s": (
            {form: rate(figures) for form, figures in running.items()} if running else None
        ),
        "spark_per_root_records_per_s": rate(per_root),
        "storm_dict_records_per_s": rate(storm),
        "ratios": {
            "acker_query_over_spark_per_root": rate(acker) / rate(per_root),
            "acker_query_over_storm_dict": rate(acker) / rate(storm),
            "ledger_over_storm_dict": rate(ledger) / rate(storm),
        },
        "state_bytes_per_pending_root": size,
        "targets_met": {  # >= 1M records/s on 2 cores, <= 40 B a root
            "acker_query_1M_records_per_s": rate(acker) >= 1_000_000,
            "running_kafka_acker_1M_records_per_s": (
                running is not None and rate(running["kafka"]) >= 1_000_000
            ),
            "acker_query_kafka_1M_records_per_s_no_record_to_driver": (
                kafka is not None
                and rate(kafka) >= 1_000_000
                and all(set(r["driver_rows_per_batch"]) == {r["ackers"]} for r in kafka["runs"])
            ),
            "acker_query_500x_per_root": rate(acker) >= 500 * rate(per_root),
            "state_40_bytes_per_root": max(v for k, v in size.items() if k.endswith("more_root"))
            <= 40,
        },
        "acker_query_phase_seconds": acker["phase_seconds"],
        "load_average_1m_at_end": os.getloadavg()[0],
        "records": {
            "main": records.num_rows,
            "per_root_form": small.num_rows,
            "warmup_untimed": warm_roots * (fanout + 2),
        },
        "roots": {"main": roots, "per_root_form": per_root_roots},
        "tree": {
            "shape": "spout tuple -> fanout leaf children",
            "fanout": fanout,
            "records_per_root": fanout + 2,
        },
        "detail": {
            "ledger": ledger,
            "acker_query": acker,
            "acker_query_kafka": kafka,
            "running_acker": running,
            "spark_per_root": per_root,
            "storm_dict": storm,
        },
        "machine": machine(),
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    p.add_argument("--records", type=int, help="ack records for ledger/shard/storm runs")
    p.add_argument("--per-root-records", type=int, help="ack records for the per-root form")
    p.add_argument("--fanout", type=int, default=8, help="children of each spout tuple")
    p.add_argument("--files", type=int, default=40, help="ack files written for the query")
    p.add_argument("--max-files-per-trigger", type=int, default=10)
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--no-save", action="store_true", help="do not write benchmarks/results")
    p.add_argument("--no-kafka", action="store_true", help="skip the Kafka channel's sharded acker")
    a = p.parse_args(argv)
    per = a.fanout + 2
    records = a.records or (20_000 if a.quick else 2_000_000)
    per_root = a.per_root_records or (1_000 if a.quick else 20_000)

    from ackstream import local_session

    broker = None if a.no_kafka else _broker()
    spark = local_session("ackstream-bench", cores=a.cores)
    try:
        result = run(
            spark,
            roots=max(1, records // per),
            per_root_roots=max(1, per_root // per),
            fanout=a.fanout,
            files=a.files,
            max_files_per_trigger=a.max_files_per_trigger,
            state_roots=2_000 if a.quick else 20_000,
            bootstrap=broker.bootstrap if broker else None,
        )
    finally:
        for q in spark.streams.active:
            q.stop()
        spark.stop()
        if broker:
            broker.stop()
    line = json.dumps(result, sort_keys=False)
    print(line)
    if not a.no_save:
        os.makedirs(RESULTS, exist_ok=True)
        path = os.path.join(RESULTS, f"acker-{dt.date.today().isoformat()}.json")
        with open(path, "w") as f:
            f.write(line + "\n")
    return result


def _broker():
    """An Apache Kafka broker on loopback (tests/broker.py), or None without Kafka's jars."""
    sys.path.insert(0, os.path.join(os.path.dirname(RESULTS), "..", "tests"))
    from broker import KafkaBroker

    try:
        return KafkaBroker().start()
    except RuntimeError as missing:  # no jars: `make kafka` fetches them
        print(f"acker benchmark: no Kafka channel run ({missing})", file=sys.stderr)
        return None


if __name__ == "__main__":
    main()
