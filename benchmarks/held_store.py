"""Where a holding stage keeps its held rows: the candidates doing the same work side by side.

Every candidate holds ``--held`` rows after a first batch, then for ``--batches`` batches
adds ``--changes`` new rows and releases as many of the oldest (so ``--held`` stay held),
and must give the next batch the rows held. Per batch it reports the seconds and the
bytes it wrote (the files under its folder created or changed by the batch):

- ``rewrite``: every held row written as Parquet every batch and read back (what the
  held store did before it saved changes);
- ``changelog``: ``HeldStore`` as the topology uses it, the rows added and the ids
  released as Parquet beside the last base, a new base once the changes since reach
  a quarter of what is held;
- ``state_store``: Spark's RocksDB state store through ``transformWithStateInPandas``
  (a ``MapState`` of held rows by id per bucket of ids), a streaming query over files
  of each batch's changes (the file written before the batch is timed);
- ``window``: the changelog as a stage uses it, a count window of two per key
  (``Topology.run_batch``, tracked, held rows in a folder as a running query keeps
  them): a first batch of ``--held`` rows of as many keys, then each batch
  ``--changes`` rows of new keys and as many that fill the windows of the oldest;
- ``partials``: a time window holding partial aggregates (one row per window and key;
  untracked ``Topology.run_batch``, the same store a tracked one uses), one hour long:
  each batch ``--changes`` rows over the same ``--keys`` keys, so what it writes a
  batch should follow the keys touched, not the rows seen.

For the two file candidates a batch's time is the save (``save_s``) and a count of the
state read back (``scan_s``: what the next batch of a window or join reads); the state
store's is its micro-batch, the window's its whole batch (``batch_s``). Candidates
alternate ``--repeats`` times; each candidate's figure is the median batch after the
first. Run with ``--held 1000000 --changes 10000`` it shows what the changelog writes
a batch (alone, and in a window) growing with the changes, not with what is held.
Prints the medians as one JSON line and writes everything to
``benchmarks/results/held-store-<date>.json``.

    .venv/bin/python benchmarks/held_store.py [--held N] [--changes N] [--batches N]
        [--repeats N] [--candidates rewrite,changelog,state_store,window]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from acker import machine  # noqa: E402

from ackstream import MemorySink, Topology, local_session  # noqa: E402
from ackstream.testing import with_lineage  # noqa: E402
from ackstream.topology.held_store import Changes, HeldState, HeldStore  # noqa: E402

CANDIDATES = ("rewrite", "changelog", "state_store", "window", "partials")
BUCKETS = 64  # the state store's grouping keys: ids spread over them
T = 1_000_000_000_000  # the window candidate's first batch time (ms)
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
CHANGE_DDL = "id long, op string, root long, held_ms long, word string, n long"

if __name__ != "__main__":  # imported (tests): Spark's Python workers cannot import us by name
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def rows(spark, start: int, count: int, batch: int):
    """``count`` held rows with ids from ``start``, shaped like a window's held counts."""
    return spark.range(start, start + count).selectExpr(
        "id AS _hold",
        "id * 7919 AS _root",
        f"{batch}L AS _held_ms",
        "concat('word-', CAST(id % 2000 AS STRING)) AS word",
        "id % 97 AS n",
    )


def files_of(folder: str) -> dict[str, tuple[int, int]]:
    """Each file under ``folder``: (size, modification time in ns)."""
    out = {}
    for where, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(where, name)
            try:
                stat = os.stat(path)
            except FileNotFoundError:  # removed meanwhile
                continue
            out[path] = (stat.st_size, stat.st_mtime_ns)
    return out


def written(folder: str, before: dict[str, tuple[int, int]]) -> int:
    """Bytes of the files under ``folder`` created or changed since ``before``."""
    return sum(
        size for path, (size, t) in files_of(folder).items() if before.get(path) != (size, t)
    )


def run_files(spark, folder: str, held: int, changes: int, batches: int, incremental: bool):
    """The ``rewrite`` (``incremental=False``) or ``changelog`` candidate."""
    store = HeldStore(folder)
    store.save(0, HeldState(rows(spark, 0, held, 0)))
    out = []
    for b in range(1, batches + 1):
        snapshot = files_of(folder)
        started = time.perf_counter()
        before = store.before(spark, b)
        added = rows(spark, held + (b - 1) * changes, changes, b)
        released = spark.range((b - 1) * changes, b * changes).selectExpr("id AS _hold")
        kept = before.rows.join(released, "_hold", "left_anti").unionByName(added)
        given = Changes(added, released, before.log) if incremental else None
        log = store.save(b, HeldState(kept), given)
        saved = time.perf_counter()
        count = store.before(spark, b + 1).rows.count()
        scanned = time.perf_counter()
        if count != held:
            raise RuntimeError(f"batch {b}: {count:,} rows held, expected {held:,}")
        out.append(
            {
                "save_s": saved - started,
                "scan_s": scanned - saved,
                "batch_s": scanned - started,
                "bytes": written(folder, snapshot),
                "base": log.base,
                "pieces": len(log.pieces()),
            }
        )
    return out


def holder():
    """The state store candidate's stateful processor: per bucket of ids, a map of held
    rows by id; emits each bucket's change in rows held."""
    import pandas as pd
    from pyspark.sql.streaming import StatefulProcessor

    class Holder(StatefulProcessor):
        def init(self, handle) -> None:
            self.held = handle.getMapState(
                "held", "id long", "root long, held_ms long, word string, n long"
            )

        def handleInputRows(self, key, rows, timerValues):
            delta = 0
            for frame in rows:
                for row in frame.itertuples(index=False):
                    if row.op == "add":
                        self.held.updateValue((row.id,), (row.root, row.held_ms, row.word, row.n))
                        delta += 1
                    else:
                        self.held.removeKey((row.id,))
                        delta -= 1
            yield pd.DataFrame({"bucket": [key[0]], "delta": [delta]})

        def close(self) -> None:
            pass

    return Holder()


def run_state_store(spark, folder: str, held: int, changes: int, batches: int):
    inbox, checkpoint = os.path.join(folder, "inbox"), os.path.join(folder, "state")
    os.makedirs(inbox)

    def changes_file(b: int, adds: tuple[int, int], releases: tuple[int, int]) -> None:
        add = rows(spark, adds[0], adds[1] - adds[0], b).selectExpr(
            "_hold AS id", "'add' AS op", "_root AS root", "_held_ms AS held_ms", "word", "n"
        )
        release = spark.range(*releases).selectExpr(
            "id", "'release' AS op", "0L AS root", "0L AS held_ms", "'' AS word", "0L AS n"
        )
        add.unionByName(release).coalesce(1).write.parquet(os.path.join(inbox, f"{b:06d}"))

    total = {"rows": 0}

    def tally(batch, _batch_id) -> None:
        total["rows"] += sum(r["delta"] for r in batch.collect())

    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    changes_file(0, (0, held), (0, 0))
    query = (
        spark.readStream.schema(CHANGE_DDL)
        .option("maxFilesPerTrigger", 1)
        .parquet(os.path.join(inbox, "*"))
        .selectExpr("*", f"pmod(id, {BUCKETS}) AS bucket")
        .groupBy("bucket")
        .transformWithStateInPandas(
            holder(), "bucket long, delta long", outputMode="Update", timeMode="None"
        )
        .writeStream.foreachBatch(tally)
        .option("checkpointLocation", checkpoint)
        .start()
    )
    out = []
    try:
        query.processAllAvailable()
        for b in range(1, batches + 1):
            start = held + (b - 1) * changes
            changes_file(b, (start, start + changes), ((b - 1) * changes, b * changes))
            snapshot = files_of(checkpoint)
            started = time.perf_counter()
            query.processAllAvailable()
            out.append(
                {"batch_s": time.perf_counter() - started, "bytes": written(checkpoint, snapshot)}
            )
            if total["rows"] != held:
                raise RuntimeError(f"batch {b}: {total['rows']:,} rows held, expected {held:,}")
    finally:
        query.stop()
        spark.conf.unset("spark.sql.streaming.stateStore.providerClass")
    return out


def keyed(spark, batch: int, ids: tuple[int, int], keys_from: int):
    """Tracked rows of ``batch`` (its partition) at the offsets ``ids`` (a range), with
    key ``k`` = offset + ``keys_from``."""
    rows = spark.range(*ids).selectExpr(
        "CAST(NULL AS string) AS key",
        "'x' AS value",
        "'t' AS topic",
        f"{batch} AS partition",
        "id AS offset",
        f"id + {keys_from} AS k",
    )
    return with_lineage(rows)


def run_window(spark, folder: str, held: int, changes: int, batches: int):
    """The ``window`` candidate."""
    from pyspark.sql import functions as F

    topology = (
        Topology("held-store", spark, None, message_timeout_ms=3_600_000)
        .window("k", F.count("*").alias("n"), count=2, name="w")
        .sink(MemorySink())
    )
    topology.held_folder = folder
    store = HeldStore(os.path.join(folder, "w"))
    topology.run_batch(keyed(spark, 0, (0, held), 0), 0, now_ms=T)
    out = []
    for b in range(1, batches + 1):
        new = keyed(spark, b, (0, changes), held + (b - 1) * changes)
        filling = keyed(spark, b, (changes, 2 * changes), (b - 1) * changes - changes)
        snapshot = files_of(folder)
        started = time.perf_counter()
        topology.run_batch(new.unionByName(filling), b, now_ms=T + 1000 * b)
        elapsed = time.perf_counter() - started
        count = store.counts()["tuples"]
        if count != held:
            raise RuntimeError(f"batch {b}: {count:,} rows held, expected {held:,}")
        out.append({"batch_s": elapsed, "bytes": written(folder, snapshot)})
    return out


def run_partials(spark, folder: str, keys: int, changes: int, batches: int):
    """The ``partials`` candidate."""
    from pyspark.sql import functions as F

    topology = (
        Topology("held-partials", spark, None, tracking=False)
        .window("k", F.count("*").alias("n"), F.sum("x").alias("x"), duration="1h", name="w")
        .sink(MemorySink())
    )
    topology.held_folder = folder
    rows = spark.range(changes).selectExpr(f"id % {keys} AS k", "id AS x")
    topology.run_batch(rows, 0, now_ms=T)  # the keys' first partials
    out = []
    for b in range(1, batches + 1):
        snapshot = files_of(folder)
        started = time.perf_counter()
        topology.run_batch(rows, b, now_ms=T + 1000 * b)
        elapsed = time.perf_counter() - started
        out.append({"batch_s": elapsed, "bytes": written(folder, snapshot)})
    held, touched = HeldStore(os.path.join(folder, "w")).counts()["tuples"], min(keys, changes)
    if held != touched:
        raise RuntimeError(f"{held:,} partial rows held, expected one per key ({touched:,})")
    return out


def summary(batches: list[dict]) -> dict:
    timed = batches[1:] or batches
    return {
        key: statistics.median(b[key] for b in timed)
        for key in ("batch_s", "save_s", "scan_s", "bytes")
        if key in timed[0]
    } | {"bytes_mean": statistics.fmean(b["bytes"] for b in batches)}


def run(
    spark, held: int, changes: int, batches: int, repeats: int, candidates, keys: int = 1000
) -> dict:
    runs: dict[str, list] = {c: [] for c in candidates}
    workdir = tempfile.mkdtemp(prefix="ackstream-held-store-")
    try:
        for repeat in range(repeats):
            order = candidates if repeat % 2 == 0 else candidates[::-1]
            for candidate in order:
                folder = os.path.join(workdir, f"{candidate}-{repeat}")
                if candidate == "state_store":
                    batch = run_state_store(spark, folder, held, changes, batches)
                elif candidate == "window":
                    batch = run_window(spark, folder, held, changes, batches)
                elif candidate == "partials":
                    batch = run_partials(spark, folder, keys, changes, batches)
                else:
                    incremental = candidate == "changelog"
                    batch = run_files(spark, folder, held, changes, batches, incremental)
                runs[candidate].append({"batches": batch, "median": summary(batch)})
                figure = runs[candidate][-1]["median"]
                print(
                    f"held store: {candidate}, run {repeat + 1}: {figure['batch_s']:.3f} s and "
                    f"{figure['bytes'] / 1e6:.2f} MB a batch",
                    file=sys.stderr,
                )
                shutil.rmtree(folder, ignore_errors=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return runs


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held", type=int, default=100_000, help="rows held throughout")
    parser.add_argument("--changes", type=int, default=10_000, help="added (and released) a batch")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--keys", type=int, default=1000, help="the partials' keys")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument("--output", help="write the JSON here instead of benchmarks/results/")
    args = parser.parse_args(argv)
    candidates = [c.strip() for c in args.candidates.split(",") if c.strip()]
    unknown = sorted(set(candidates) - set(CANDIDATES))
    if unknown:
        parser.error(f"unknown candidates {unknown}; choose from {CANDIDATES}")
    spark = local_session("ackstream-held-store-bench")
    load_before = os.getloadavg()
    try:
        runs = run(
            spark, args.held, args.changes, args.batches, args.repeats, candidates, args.keys
        )
    finally:
        spark.stop()
    out = {
        "benchmark": "held_store",
        "date": dt.datetime.now(dt.UTC).isoformat(),
        "machine": {**machine(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "config": {k: v for k, v in vars(args).items() if k not in ("no_save", "output")},
        "summary": {c: [r["median"] for r in rs] for c, rs in runs.items()},
        "runs": runs,
    }
    print(json.dumps(out["summary"]))
    if not args.no_save:
        path = args.output or os.path.join(HERE, "results", f"held-store-{dt.date.today()}.json")
        with open(path, "w") as f:
            f.write(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
