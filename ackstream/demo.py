"""The main job on the embedded default: no broker, nothing to start by hand.

A local Spark session reads the built-in generator upstream (deterministic
sentences) with tracking on; a word-split topology counts words into a memory
sink, each batch settles the tuple trees it closed (the acker query beside it
gets only trees left open), and completions go through a local-directory
channel to the source, which commits, replays or dead-letters. A few tuples
fail on their first attempt (they are replayed and then acked) and every
``poison_every``-th record always fails (it is dead-lettered after
``max_retries`` replays).

:func:`run_demo` runs it until every generated record is acked or
dead-lettered and committed, and returns a :class:`DemoResult`: the figures
``ackstream demo`` prints, and the completions, dead letters and word counts
that ``notebooks/quickstart.ipynb`` plots. Its timings come from the records
themselves: a completion carries its root's end (``completed_ms``) and its
complete latency, so the root's start is their difference, on one clock. The
first batch is cold (Spark plans and compiles it, Python workers start), so its
latency is reported apart from the later batches' p50 and p99.

The channel and checkpoints stay in :func:`demo_directory` (cleared when a run
starts), so that ``ackstream status --topology demo`` reads them afterwards.

>>> result = run_demo(spark, records=200)                       # doctest: +SKIP
>>> result.acked + result.dead_lettered, result.accounted_for  # doctest: +SKIP
(200, True)
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import functions as F

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

from ackstream import LocalChannel, MemorySink, Topology, read_dead_letters
from ackstream.config.source import default_channel_dir
from ackstream.sources.generator import committed_count
from ackstream.ui.status_sources import read_source_metrics, saved_ends
from ackstream.vocabulary.clock import now_ms
from ackstream.vocabulary.ranges import checked, expand
from ackstream.vocabulary.records import (
    ACKED,
    BATCH_FAILED,
    COMPLETION_SCHEMA,
    FAILED,
    NOTICES,
    TIMED_OUT,
)

__all__ = ["DemoResult", "demo_directory", "run_demo"]


def demo_directory() -> str:
    """Where the demo keeps its channel (``channel/``) and checkpoints
    (``checkpoint/``): the default channel of topology ``demo`` is its ``channel/``,
    so ``ackstream status --topology demo`` finds it with no option."""
    return os.path.dirname(default_channel_dir("demo"))


@dataclass(frozen=True)
class DemoResult:
    """What one demo run saw. ``completions`` has one row per finished root (acked,
    failed or timed out; a replay is a new root), ``dead_letters`` one row per
    dead-lettered record, ``word_counts`` the sink's rows (word, n: per batch, sum them
    over batches). Times in the frames are ms since the epoch. The figures are
    counted from the frames:

    >>> from ackstream.vocabulary.records import completion_table
    >>> from ackstream.sinks.dead_letters import DEAD_LETTER_SCHEMA
    >>> done = completion_table([1, 2, 3], ["acked", "failed", "acked"], partition=[0, 1, 1],
    ...                         offset=0, attempt=[0, 0, 1], latency_ms=[40, 90, 30],
    ...                         completed_ms=[1_040, 1_090, 1_530]).to_pandas()
    >>> result = DemoResult(records=2, partitions=2, committed=2, seconds=1.5,
    ...                     completions=done, dead_letters=DEAD_LETTER_SCHEMA.empty_table()
    ...                     .to_pandas(), word_counts=pd.DataFrame())
    >>> result.acked, result.replayed, result.lost, result.accounted_for
    (2, 1, 0, True)
    >>> result.failed, result.timed_out  # as ``ackstream status`` names them
    (1, 0)
    >>> result.timeline(step_ms=500)["pending"].tolist()
    [2, 1, 0]
    >>> result.accounted_timeline(step_ms=500)["accounted_for"].tolist()
    [0, 1, 2]
    >>> result.cold_batch_ms, result.warm_p50_ms  # roots 1 and 2 were the first batch
    (40.0, 30.0)
    """

    records: int  #: generated records
    partitions: int
    committed: int  #: offsets committed over all partitions
    seconds: float  #: from starting the queries to the end
    completions: pd.DataFrame = field(repr=False)
    dead_letters: pd.DataFrame = field(repr=False)
    word_counts: pd.DataFrame = field(repr=False)
    #: The source's offsets summed over partitions, polled once a second: ``ms``,
    #: ``end`` (upstream) and ``committed`` (everything below acked or dead-lettered).
    offsets: pd.DataFrame = field(repr=False, default_factory=pd.DataFrame)

    def generated_records(self) -> set[tuple[int, int]]:
        """(partition, offset) of every record, split as the generator splits its count."""
        per, extra = divmod(self.records, self.partitions)
        return {(p, o) for p in range(self.partitions) for o in range(per + (p < extra))}

    def acked_records(self) -> set[tuple[int, int]]:
        """(partition, offset) of the records whose tree completed."""
        done = self.completions[self.completions["status"] == ACKED]
        return set(zip(done["partition"], done["offset"])) & self.generated_records()

    def dead_lettered_records(self) -> set[tuple[int, int]]:
        return set(zip(self.dead_letters["partition"], self.dead_letters["offset"]))

    @property
    def acked(self) -> int:
        return len(self.acked_records())

    @property
    def dead_lettered(self) -> int:
        return len(self.dead_lettered_records())

    @property
    def replayed(self) -> int:
        """Failed or timed-out attempts, each replayed or dead-lettered."""
        return int((~self.completions["status"].isin([ACKED, *NOTICES])).sum())

    @property
    def failed(self) -> int:
        """Roots failed, by a stage or with their whole batch: ``ackstream status``'s
        ``failed`` (each replayed or dead-lettered)."""
        return self._roots_ended(FAILED, BATCH_FAILED)

    @property
    def timed_out(self) -> int:
        """Roots whose tree outlived the message timeout: ``ackstream status``'s
        ``timed out``."""
        return self._roots_ended(TIMED_OUT)

    def _roots_ended(self, *statuses: str) -> int:
        done = self.completions[~self.completions["status"].isin(NOTICES)]
        return int(done.drop_duplicates("root")["status"].isin(statuses).sum())

    @property
    def lost(self) -> int:
        """Records neither acked nor dead-lettered (0 at the end of a run)."""
        return len(self.generated_records() - self.acked_records() - self.dead_lettered_records())

    @property
    def both(self) -> int:
        """Records both acked and dead-lettered (must be 0)."""
        return len(self.acked_records() & self.dead_lettered_records())

    @property
    def p50_ms(self) -> float:
        """Median complete latency of acked roots (NaN if none)."""
        return self._latency_percentile(50)

    @property
    def p99_ms(self) -> float:
        return self._latency_percentile(99)

    def _latency_percentile(self, q: float, warm: bool = False) -> float:
        acked = self.completions["status"] == ACKED
        if warm:
            acked &= ~self.completions["root"].isin(self.first_batch_roots())
        ok = self.completions.loc[acked, "latency_ms"]
        return float(np.percentile(ok.to_numpy(float), q)) if len(ok) else float("nan")

    def first_batch_roots(self) -> set[int]:
        """The roots of the first (cold) batch: a batch's roots share their init time,
        and the first batch's is :attr:`t0_ms`."""
        roots = self.roots()
        return set(roots.loc[roots["ts"] == self.t0_ms, "root"])

    @property
    def cold_batch_ms(self) -> float:
        """Complete latency of the first batch's acked roots (the slowest; NaN if none):
        Spark plans and compiles its stages and starts Python workers then."""
        first = self.completions["root"].isin(self.first_batch_roots())
        ok = self.completions.loc[first & (self.completions["status"] == ACKED), "latency_ms"]
        return float(ok.max()) if len(ok) else float("nan")

    @property
    def cold_batch_end_s(self) -> float:
        """When the first batch's trees were settled, in seconds since :attr:`t0_ms`."""
        first = self.completions["root"].isin(self.first_batch_roots())
        ends = self.completions.loc[first, "completed_ms"]
        return float(ends.max() - self.t0_ms) / 1000 if len(ends) else float("nan")

    @property
    def warm_p50_ms(self) -> float:
        """Median complete latency of acked roots after the first batch (NaN if none)."""
        return self._latency_percentile(50, warm=True)

    @property
    def warm_p99_ms(self) -> float:
        return self._latency_percentile(99, warm=True)

    @property
    def accounted_for(self) -> bool:
        """Every record acked or dead-lettered, none both, and every offset committed."""
        return (self.lost, self.both) == (
            0,
            0,
        ) and self.acked + self.dead_lettered == self.records == self.committed

    def summary(self) -> dict[str, int | float | bool]:
        """The figures ``ackstream demo`` prints, JSON-ready."""
        names = (
            "records",
            "acked",
            "dead_lettered",
            "replayed",
            "failed",
            "timed_out",
            "lost",
            "both",
            "committed",
            "p50_ms",
            "p99_ms",
            "cold_batch_ms",
            "warm_p50_ms",
            "warm_p99_ms",
            "seconds",
            "accounted_for",
        )
        return {name: getattr(self, name) for name in names}

    # --- over time, for the notebook's plots ------------------------------------------

    def roots(self) -> pd.DataFrame:
        """One row per finished root: root, partition, offset, attempt, and ``ts``, when
        the topology got it (its init: ``completed_ms - latency_ms``)."""
        known = self.completions[self.completions["latency_ms"].notna()].drop_duplicates("root")
        out = known[["root", "partition", "offset", "attempt"]].astype("int64")
        return out.assign(ts=(known["completed_ms"] - known["latency_ms"]).astype("int64"))

    @property
    def t0_ms(self) -> int:
        """When the first batch got its roots: time 0 of the plots (Spark's start-up is
        left out)."""
        ts = self.roots()["ts"]
        return int(ts.min()) if len(ts) else 0

    def timeline(self, step_ms: int = 100) -> pd.DataFrame:
        """Cumulative counts on a regular grid: ``t_s`` (seconds since :attr:`t0_ms`),
        ``emitted`` (roots given to the topology, replays included), ``finished``
        (completions), ``pending`` (emitted minus finished: roots in their trees)."""
        t0, roots = self.t0_ms, self.roots()
        started = np.sort(roots["ts"].to_numpy(np.int64))
        finished = np.sort(self.completions["completed_ms"].to_numpy(np.int64))
        end = max([t0, *started[-1:], *finished[-1:]]) + step_ms
        grid = np.arange(t0, end + 1, step_ms, dtype=np.int64)
        emitted_n = np.searchsorted(started, grid, side="right")
        finished_n = np.searchsorted(finished, grid, side="right")
        return pd.DataFrame(
            {
                "t_s": (grid - t0) / 1000.0,
                "emitted": emitted_n,
                "finished": finished_n,
                "pending": emitted_n - finished_n,
            }
        )

    def accounted_timeline(self, step_ms: int = 100) -> pd.DataFrame:
        """Records accounted for over time, on a grid of ``t_s`` since :attr:`t0_ms`:
        ``acked`` (by their ack), ``dead_lettered`` (by their last attempt's failure)
        and ``accounted_for``, their sum, which reaches :attr:`records` at the end (an
        example in the class's doc)."""
        c, t0 = self.completions, self.t0_ms
        acked = c[c["status"] == ACKED].drop_duplicates(["partition", "offset"])
        last = self.dead_letters.assign(attempt=self.dead_letters["attempts"] - 1)
        dead = c.merge(
            last[["partition", "offset", "attempt"]], on=["partition", "offset", "attempt"]
        )
        dead = dead[dead["status"] != ACKED].drop_duplicates(["partition", "offset"])
        times = {
            k: np.sort(df["completed_ms"].to_numpy(np.int64))
            for k, df in (("acked", acked), ("dead_lettered", dead))
        }
        end = max([t0, *(t[-1] for t in times.values() if len(t))]) + step_ms
        grid = np.arange(t0, end + 1, step_ms, dtype=np.int64)
        out = pd.DataFrame({"t_s": (grid - t0) / 1000.0})
        for name, t in times.items():
            out[name] = np.searchsorted(t, grid, side="right")
        return out.assign(accounted_for=out["acked"] + out["dead_lettered"])

    def offsets_timeline(self) -> pd.DataFrame:
        """:attr:`offsets` with ``t_s`` since :attr:`t0_ms` and ``lag`` (end - committed)."""
        o = self.offsets
        if o.empty:
            return pd.DataFrame(columns=["t_s", "end", "committed", "lag"])
        return pd.DataFrame(
            {
                "t_s": (o["ms"] - self.t0_ms) / 1000.0,
                "end": o["end"],
                "committed": o["committed"],
                "lag": o["end"] - o["committed"],
            }
        )

    def bucket_ms(self, buckets: int = 30) -> int:
        """A round bucket width giving at most about ``buckets`` buckets over the run."""
        done = self.completions["completed_ms"]
        span = int(done.max() - self.t0_ms) if len(done) else 0
        widths = (250, 500, 1000, 2000, 5000, 10_000, 30_000, 60_000)
        return next((w for w in widths if span / w <= buckets), widths[-1])

    def per_bucket(self, bucket_ms: int | None = None) -> pd.DataFrame:
        """Per time bucket of ``bucket_ms`` (default: :meth:`bucket_ms`) since
        :attr:`t0_ms`: roots ``acked``, roots ``failed`` (failed or timed out), and
        ``replayed`` (roots emitted again, attempt > 0). Indexed by the bucket's start
        in seconds."""
        bucket_ms, t0 = bucket_ms or self.bucket_ms(), self.t0_ms

        def counts(ms: pd.Series) -> pd.Series:
            starts = (np.asarray(ms, dtype=np.int64) - t0) // bucket_ms * bucket_ms / 1000
            return pd.Series(starts).value_counts()

        c, r = self.completions, self.roots()
        out = pd.DataFrame(
            {
                "acked": counts(c.loc[c["status"] == ACKED, "completed_ms"]),
                "failed": counts(c.loc[~c["status"].isin([ACKED, *NOTICES]), "completed_ms"]),
                "replayed": counts(r.loc[r["attempt"] > 0, "ts"]),
            }
        )
        if out.empty:
            return out.astype("int64")
        index = np.arange(0, out.index.max() + bucket_ms / 1000 / 2, bucket_ms / 1000)
        out = out.reindex(np.round(index, 3)).fillna(0).astype("int64")
        out.index.name = "t_s"
        return out


def run_demo(
    spark: SparkSession,
    records: int = 2_000,
    partitions: int = 2,
    fail_percent: int = 3,
    poison_every: int = 500,
    max_retries: int = 2,
    message_timeout_ms: int = 10_000,
    max_per_batch: int | None = None,
    directory: str | None = None,
    progress: Callable[[str], object] = print,
    timeout_s: float = 600.0,
) -> DemoResult:
    """Run the word-split topology over ``records`` generated sentences until every one
    is acked or dead-lettered and committed, or ``timeout_s`` has passed (the result is
    then not :attr:`~DemoResult.accounted_for`); stop it and return what it saw.

    ``fail_percent`` of word tuples fail on their first attempt; the record at offset
    ``poison_every // 2`` of every ``poison_every`` of a partition fails on every
    attempt. ``progress`` gets a line a second. ``max_per_batch`` is the source's
    ``maxOffsetsPerTrigger`` (None: no limit). ``directory`` (default:
    :func:`demo_directory`) holds the channel and the checkpoints; a run clears them
    first (an old checkpoint would resume the old query) and leaves them for
    ``ackstream status``.
    """
    directory = directory or demo_directory()
    channel_dir = os.path.join(directory, "channel")
    checkpoint = os.path.join(directory, "checkpoint")
    for old in (channel_dir, checkpoint):
        shutil.rmtree(old, ignore_errors=True)
    channel = LocalChannel(channel_dir)
    where = "" if channel_dir == default_channel_dir("demo") else f" --channel {channel_dir}"
    progress(
        f"channel {channel_dir}, checkpoints {checkpoint}: kept after the run for "
        f"`ackstream status --topology demo{where}`"
    )
    sink = MemorySink()
    flaky = (F.col("_attempt") == 0) & (
        F.pmod(F.xxhash64("word", "offset"), F.lit(100)) < fail_percent
    )
    topology = (
        Topology("demo", spark, channel, message_timeout_ms=message_timeout_ms)
        .map(lambda df: df.withColumn("line", F.col("value").cast("string")))
        .explode(F.split("line", " "), "word")
        .fail_where(flaky, name="flaky_first_attempt")
        .fail_where(F.col("offset") % poison_every == poison_every // 2, name="poison")
        .aggregate("word", F.count("*").alias("n"))
        .sink(sink)
    )
    options = {
        "ackstream.upstream": "generator",
        "ackstream.generator.count": records,
        "ackstream.generator.partitions": partitions,
        # a cold first batch on a busy machine can take tens of seconds: replaying
        # records whose completion is merely late would only add duplicates
        "ackstream.sourceTimeout": f"{max(6 * message_timeout_ms, 120_000)}ms",
        "ackstream.retryInitialDelay": "200ms",
        "ackstream.maxRetries": max_retries,
    }
    if max_per_batch:
        options["maxOffsetsPerTrigger"] = max_per_batch
    started = time.monotonic()
    progress("starting the topology and acker queries (Spark start-up)")
    running = topology.start(topology.read_stream(options), checkpoint, trigger_ms=500)
    done, position = COMPLETION_SCHEMA.empty_table(), None

    samples: list[dict[str, int]] = []

    def seen() -> DemoResult:
        nonlocal done, position
        table, position = channel.completions_since(position, runs=True)
        parts = (read_source_metrics(channel_dir) or {}).get("partitions", {})
        done = pa.concat_tables([done, expand(checked(table, saved_ends(parts)))])
        sums = [sum(p[k] for t in parts.values() for p in t.values()) for k in ("end", "committed")]
        if parts:
            samples.append({"ms": now_ms(), "end": sums[0], "committed": sums[1]})
        return DemoResult(
            records=records,
            partitions=partitions,
            committed=committed_count(channel_dir),
            seconds=time.monotonic() - started,
            completions=done.to_pandas(),
            dead_letters=read_dead_letters(os.path.join(channel_dir, "dead_letters"))
            .to_pandas()
            .drop(columns=["key", "value"]),
            word_counts=sink.to_pandas(),
            offsets=pd.DataFrame(samples, columns=["ms", "end", "committed"]),
        )

    said, said_at = "", 0.0
    try:
        while True:
            if running.exception():
                raise RuntimeError(f"a query of the demo stopped: {running.exception()}")
            now = seen()
            if now.completions.empty:  # Spark start-up, then the cold first batch
                line = f"waiting for the first batch: {_query_phase(running.query)}"
                if line != said or now.seconds - said_at >= 5:
                    progress(f"[{now.seconds:5.1f}s] {line}")
                    said, said_at = line, now.seconds
            else:
                if said:
                    progress(
                        f"[{now.seconds:5.1f}s] first batch settled (cold: Spark compiled its "
                        "plans and started Python workers); later batches are warm"
                    )
                    said = ""
                progress(
                    f"[{now.seconds:5.1f}s] committed {now.committed:>6}/{records}"
                    f"  acked {now.acked:>6}  failed {now.failed:>4}  timed out {now.timed_out:>3}"
                    f"  dead-lettered {now.dead_lettered:>3}"
                )
            if (now.lost == 0 and now.committed >= records) or now.seconds > timeout_s:
                break
            time.sleep(1.0)
    finally:
        running.stop()
    return seen()


def _query_phase(query: StreamingQuery) -> str:
    """What Spark says the topology query is doing, in words for the demo's progress."""
    status = query.status
    if query.lastProgress is None and not status.get("isTriggerActive"):
        return "Spark is starting the query"
    if query.lastProgress is None:
        return f"batch 0 is running ({status.get('message', '').lower()})"
    return f"batch {query.lastProgress['batchId'] + 1} ({status.get('message', '').lower()})"
