"""The quickstart walkthrough: run a word-split topology on the generator and time it.

``notebooks/quickstart.ipynb`` calls :func:`run_quickstart` and plots what it
returns. The run uses the embedded default (generator upstream, local channel in
a temporary directory, the acker query beside the topology) and a pandas bolt
that fails a few tuples: some only on their first attempt (their records are
replayed, then acked) and some on every attempt (their records end as dead
letters). It returns once every generated record is acked or dead-lettered.

Timings come from the records themselves, not from polling: each root's start
is its init's ``ts`` and its end is its completion's ``completed_ms``; a
completion carries both (``latency_ms`` is the difference), on one clock.

>>> result = run_quickstart(spark, records=200)                    # doctest: +SKIP
>>> result.figures()["acked"] + result.figures()["dead_lettered"]  # doctest: +SKIP
200
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import zlib
from dataclasses import dataclass

import numpy as np
import pandas as pd
from pyspark.sql import functions as F

from ackstream.records import ACKED, COMPLETION_SCHEMA
from ackstream.channels.local import LocalChannel
from ackstream.sinks.dead_letters import read_dead_letters
from ackstream.sinks.memory import MemorySink
from ackstream.topology import Topology

__all__ = ["QuickstartResult", "flaky_word_bolt", "run_quickstart", "tuple_draw"]


def tuple_draw(partition, offset, word) -> np.ndarray:
    """A number in [0, 1) per tuple, the same in every process and on every attempt
    (crc32 of ``partition/offset/word``; Python's ``hash`` differs between workers)."""
    keys = (pd.Series(partition).astype(str) + "/" + pd.Series(offset).astype(str) + "/"
            + pd.Series(word).astype(str))
    return np.array([zlib.crc32(k.encode()) for k in keys], dtype=np.float64) / 2.0**32


class FlakyTuple(Exception):
    """Raised by the quickstart bolt for the tuples it fails."""


def flaky_word_bolt(fail_rate: float, poison_rate: float):
    """A pandas bolt ``fn(frame)`` emitting ``word, length`` for each input tuple. It
    raises for a tuple whose :func:`tuple_draw` is below ``poison_rate`` (on every
    attempt) or below ``poison_rate + fail_rate`` on its first attempt (``_attempt``
    0). ackstream bisects the chunk, so only the roots of those tuples fail."""

    def bolt(frame: pd.DataFrame) -> pd.DataFrame:
        draw = tuple_draw(frame["partition"], frame["offset"], frame["word"])
        first = frame["_attempt"].to_numpy() == 0
        if ((draw < poison_rate) | (first & (draw < poison_rate + fail_rate))).any():
            raise FlakyTuple("this tuple fails (quickstart)")
        return pd.DataFrame({"word": frame["word"],
                             "length": frame["word"].str.len().astype("int32")})

    return bolt


@dataclass
class QuickstartResult:
    """What one quickstart run saw. Times are ms since the epoch; ``t0_ms`` is when the
    first batch reached the topology (the plots' zero: Spark's start-up is left out)."""

    records: int  #: generated records
    t0_ms: int
    elapsed_s: float  #: from starting the queries to every record accounted for
    #: one row per root handed to the topology: root, partition, offset, attempt, ts
    #: (when its init was made: completed_ms - latency_ms)
    roots: pd.DataFrame
    completions: pd.DataFrame  #: one row per finished root (the completion channel)
    dead_letters: pd.DataFrame  #: one row per dead-lettered record
    word_counts: pd.DataFrame  #: the sink's output: word, n (per batch; sum over batches)

    def acked_records(self) -> set:
        done = self.completions[self.completions["status"] == ACKED]
        return set(zip(done["partition"], done["offset"], strict=True))

    def dead_lettered_records(self) -> set:
        return set(zip(self.dead_letters["partition"], self.dead_letters["offset"], strict=True))

    def timeline(self, step_ms: int = 100) -> pd.DataFrame:
        """Cumulative counts on a regular grid: ``t_s`` (seconds since ``t0_ms``), ``emitted``
        (roots given to the topology, replays included), ``finished`` (completions),
        ``pending`` (emitted minus finished: roots in flight in the tuple trees)."""
        end = max(int(self.roots["ts"].max()) if len(self.roots) else self.t0_ms,
                  int(self.completions["completed_ms"].max()) if len(self.completions)
                  else self.t0_ms) + step_ms
        grid = np.arange(self.t0_ms, end + 1, step_ms, dtype=np.int64)
        started = np.sort(self.roots["ts"].to_numpy(np.int64))
        finished = np.sort(self.completions["completed_ms"].to_numpy(np.int64))
        emitted_n = np.searchsorted(started, grid, side="right")
        finished_n = np.searchsorted(finished, grid, side="right")
        return pd.DataFrame({"t_s": (grid - self.t0_ms) / 1000.0, "emitted": emitted_n,
                             "finished": finished_n, "pending": emitted_n - finished_n})

    def bucket_ms(self, buckets: int = 30) -> int:
        """A round bucket width giving at most about ``buckets`` buckets over the run."""
        span = int(self.completions["completed_ms"].max() - self.t0_ms) if len(
            self.completions) else 0
        widths = (250, 500, 1000, 2000, 5000, 10_000, 30_000, 60_000)
        return next((w for w in widths if span / w <= buckets), widths[-1])

    def per_bucket(self, bucket_ms: int | None = None) -> pd.DataFrame:
        """Per time bucket of ``bucket_ms`` (default: :meth:`bucket_ms`) since ``t0_ms``:
        roots ``acked``, roots ``failed`` (failed or timed out), and ``replayed`` (roots
        emitted again, attempt > 0). Indexed by the bucket's start in seconds."""
        bucket_ms = bucket_ms or self.bucket_ms()

        def bucket(ms):
            return ((np.asarray(ms, dtype=np.int64) - self.t0_ms) // bucket_ms) * bucket_ms / 1000

        c, r = self.completions, self.roots
        acked = pd.Series(bucket(c.loc[c["status"] == ACKED, "completed_ms"])).value_counts()
        failed = pd.Series(bucket(c.loc[c["status"] != ACKED, "completed_ms"])).value_counts()
        replayed = pd.Series(bucket(r.loc[r["attempt"] > 0, "ts"])).value_counts()
        out = pd.DataFrame({"acked": acked, "failed": failed, "replayed": replayed})
        if out.empty:
            return out.astype("int64")
        index = np.arange(0, out.index.max() + bucket_ms / 1000 / 2, bucket_ms / 1000)
        out = out.reindex(np.round(index, 3)).fillna(0).astype("int64")
        out.index.name = "t_s"
        return out

    def figures(self) -> dict:
        """The run's key figures, JSON-ready."""
        acked, dead = self.acked_records(), self.dead_lettered_records()
        ok = self.completions[self.completions["status"] == ACKED]["latency_ms"]
        statuses = self.completions["status"].value_counts()
        replays = self.roots[self.roots["attempt"] > 0]
        return {
            "records": self.records,
            "acked": len(acked),
            "dead_lettered": len(dead),
            "acked_and_dead_lettered": len(acked & dead),
            "replayed": len(replays),  # roots with attempt > 0
            "replayed_records": len(replays[["partition", "offset"]].drop_duplicates()),
            "roots": len(self.roots),
            "completions": {k: int(v) for k, v in statuses.items()},
            "latency_ms_p50": float(ok.quantile(0.5)) if len(ok) else None,
            "latency_ms_p99": float(ok.quantile(0.99)) if len(ok) else None,
            "elapsed_s": round(self.elapsed_s, 2),
        }


def _wait_idle(running, timeout_s: float = 10.0) -> None:
    """Wait (a little) until neither query is inside a batch: a query stopped mid-batch
    works, but Spark may log a long error from the interrupted batch."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(q.status.get("isTriggerActive") for q in running.queries):
            return
        time.sleep(0.05)


def _roots(completions: pd.DataFrame) -> pd.DataFrame:
    """One row per finished root with its coordinates and the time of its init."""
    known = completions[completions["latency_ms"].notna()].drop_duplicates("root")
    return pd.DataFrame({
        "root": known["root"].to_numpy(np.int64),
        "partition": known["partition"].to_numpy(np.int64),
        "offset": known["offset"].to_numpy(np.int64),
        "attempt": known["attempt"].to_numpy(np.int64),
        "ts": (known["completed_ms"] - known["latency_ms"]).to_numpy(np.int64),
    })


def _expected(records: int, partitions: int) -> set:
    per, extra = divmod(records, partitions)
    return {(p, o) for p in range(partitions) for o in range(per + (1 if p < extra else 0))}


def run_quickstart(spark, *, records: int = 1000, partitions: int = 2, rate: float = 0.0,
                   max_per_batch: int | None = None, fail_rate: float = 0.02,
                   poison_rate: float = 0.002, max_retries: int = 2,
                   message_timeout_ms: int = 5000, retry_initial_delay_ms: int = 200,
                   trigger_ms: int = 300, timeout_s: float = 300.0, poll_s: float = 0.25,
                   workdir: str | None = None, name: str = "quickstart") -> QuickstartResult:
    """Run the quickstart topology until every generated record is acked or
    dead-lettered, then stop it and return what it saw.

    The topology: split each sentence into words (``explode``), run
    :func:`flaky_word_bolt` (``fail_rate``, ``poison_rate`` per tuple), count
    words per batch (``aggregate``: multi-anchored outputs) into a ``MemorySink``.
    ``rate`` is the generator's records per second (0: all at once), ``max_per_batch``
    the source's ``maxOffsetsPerTrigger`` (None: no limit). ``workdir``
    (default: a new temporary directory, removed afterwards) holds the channel and
    the checkpoints. Raises ``TimeoutError`` after ``timeout_s`` seconds.
    """
    own_dir = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="ackstream-quickstart-")
    channel_dir = os.path.join(workdir, "channel")
    channel = LocalChannel(channel_dir)
    sink = MemorySink()
    topology = (Topology(name, spark, channel, message_timeout_ms=message_timeout_ms)
                .map(lambda df: df.withColumn("line", F.col("value").cast("string")))
                .explode(F.split("line", " "), "word")
                .pandas_bolt(flaky_word_bolt(fail_rate, poison_rate), "word string, length int")
                .aggregate("word", F.count("*").alias("n"))
                .sink(sink))
    expected = _expected(records, partitions)
    start_ms = int(time.time() * 1000)
    options = {"ackstream.upstream": "generator", "ackstream.generator.count": records,
               "ackstream.generator.partitions": partitions, "ackstream.generator.rate": rate,
               # a cold first batch on a busy machine can take tens of seconds: replaying
               # records whose completion is merely late would only add duplicates
               "ackstream.sourceTimeout": f"{max(6 * message_timeout_ms, 120_000)}ms",
               "ackstream.retryInitialDelay": f"{retry_initial_delay_ms}ms",
               "ackstream.maxRetries": max_retries}
    if max_per_batch:
        options["maxOffsetsPerTrigger"] = max_per_batch
    running = topology.start(topology.read_stream(options), os.path.join(workdir, "checkpoint"),
                             trigger_ms=trigger_ms)
    done = COMPLETION_SCHEMA.empty_table().to_pandas()
    position, parts = None, []
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            error = running.exception()
            if error:
                raise RuntimeError(f"the quickstart topology stopped: {error}")
            table, position = channel.completions_since(position)
            if table.num_rows:
                parts.append(table.to_pandas())
                done = pd.concat(parts, ignore_index=True)
            acked = set(zip(done.loc[done["status"] == ACKED, "partition"],
                            done.loc[done["status"] == ACKED, "offset"], strict=True))
            letters = read_dead_letters(os.path.join(channel_dir, "dead_letters")).to_pandas()
            dead = set(zip(letters["partition"], letters["offset"], strict=True))
            if expected <= acked | dead:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"after {timeout_s:.0f}s, {len(expected - acked - dead)} of {records} records "
                    "are neither acked nor dead-lettered")
            time.sleep(poll_s)
        elapsed_s = time.time() - start_ms / 1000
        _wait_idle(running)
    finally:
        running.stop()
    roots = _roots(done)
    t0_ms = int(roots["ts"].min()) if len(roots) else start_ms
    result = QuickstartResult(records=records, t0_ms=t0_ms, elapsed_s=elapsed_s,
                              roots=roots, completions=done.reset_index(drop=True),
                              dead_letters=letters.drop(columns=["key", "value"]),
                              word_counts=sink.to_pandas())
    if own_dir:
        shutil.rmtree(workdir, ignore_errors=True)
    return result
