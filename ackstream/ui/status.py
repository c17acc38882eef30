"""What became of a topology's roots, read from its ack and completion channels.

``ackstream status`` prints this. Every count is of **roots** (one root per
attempt of an upstream record: a replay is a new root, attempt + 1):

- ``pending``: an init record is in the ack channel and no completion yet (the
  acker still holds the root, or has not read its init). Roots the source gave up
  waiting for (``ackstream.sourceTimeout``) stay here until the acker times them out.
  A tree a topology batch settles itself never reaches the ack channel: it goes
  from its batch straight to a completion, so it is never counted as pending.

Counts cover everything the channel holds since it was created: root ids are
hashes of the record's coordinates, so a rerun over the same records in a reused
channel counts each root once, with its first completion.
- ``acked``, ``failed``, ``timed_out``, ``rejected``: completions, one per root (a
  completion delivered twice, as the Kafka channel may after a crash, counts once;
  of two outcomes of one root, the one that is not an ack, as the source decides).
- ``unknown``: roots the acker saw acks for but never an init (stray records);
  ``invalid``: ack records the acker could not use, and completions of a run of
  offsets that its partition does not hold (past the end the source last saw, or the
  brokers have; see :func:`ackstream.vocabulary.ranges.checked`). Both are ignored by sources.
- ``replayed``: failed or timed-out roots whose record was not dead-lettered on
  that attempt, so the source reads it again (or will, after its backoff).
- ``dead_lettered``: records in the dead-letter Parquet folder or on the dead-letter
  topic (Kafka channel), each once (a letter written twice after a crash counts
  once); ``None`` when unknown. ``last_dead_letter_ms``: when the newest of them was
  written (its record died); ``None`` when none says.
- ``latency_ms``: complete latency (init to ack, as Storm's ``complete latency``)
  percentiles of the acked roots; ``None`` when nothing was acked.
  ``latency_histogram``: the same latencies counted in :data:`LATENCY_BUCKETS_MS`
  (cumulative, as Prometheus' histograms), with their count and sum.
- ``history``: per time bin of the completions (:func:`history`), the acked, failed,
  replayed and dead-lettered roots a second and the complete latency's percentiles:
  what the live view plots, read from the channel, so it shows with no topology running.

- ``rates_per_s``: acked, replayed and dead-lettered roots a second over the last
  ``window_s`` seconds, by their completions' time.
- ``failed_by_stage``: failed and timed-out roots by the stage that failed them
  (``"timed out"`` for timeouts): Storm UI's failed count per bolt;
  ``rejected_by_stage``: the rejected roots, apart (they are never replayed);
  ``failed_reasons`` and ``rejected_reasons``: per stage, its most frequent reasons
  (:data:`REASONS_SHOWN`) and their roots. A failure is charged to the stage its reason
  begins with (``"parse#2: ValueError: bad"``), or, with the topology's declared graph,
  to the stage whose fixed reason it is (``fail_where(..., "negative amount")``); else
  to the reason's text. With a checkpoint they count the completions since the
  checkpoint began (``stages_since_ms``), the span of the stages' tuple counts.
- ``partitions``: per topic and partition the upstream's ``end``, the ``committed``
  offset (everything below it acked or dead-lettered) and ``lag`` (end - committed),
  as the source last saw them (in a local channel, the file
  :data:`~ackstream.channels.local.SOURCE_METRICS_FILE`), or
  with the Kafka channel as the source's consumer group has them on the brokers now
  (:func:`group_lag`); ``None`` when unknown.
- ``held``: per window or join stage, the ``tuples`` it holds across batches and their
  distinct ``roots`` (pending until released), as its newest saved state in
  the topology's checkpoint has them (:func:`held_in`); ``None`` without a checkpoint.
- ``stages``: per stage and sink, the tuples it read (``in``, Storm UI's executed)
  and emitted (``out``) since its checkpoint began, as the topology saved them there
  (:func:`stages_in`); ``None`` without a checkpoint.
- ``graph``: the topology's declared stages and sinks and the streams they read, as
  ``start()`` wrote them beside the checkpoint
  (:func:`~ackstream.topology.described.describe`); ``None`` without a checkpoint.
- ``run``: whether the topology query runs (running, stopped, or not responding:
  its process killed or silent), since when, its last batch (id, duration, rows and
  input and processing rates, by the source's own count) and Spark's UI address, as
  its process keeps them beside the checkpoint
  (:func:`~ackstream.topology.described.read_run`), with ``heard_ms`` its last word;
  ``None`` without a checkpoint or before a start.

Reading needs pyarrow only, no Spark session. :func:`summarize` is the pure part.

>>> import pyarrow as pa
>>> from ackstream.vocabulary.records import COMPLETION_SCHEMA
>>> done = pa.Table.from_pylist([
...     {"root": 1, "status": "acked", "latency_ms": 40},
...     {"root": 2, "status": "failed", "topic": "t", "partition": 0, "offset": 7,
...      "attempt": 0}], schema=COMPLETION_SCHEMA)
>>> s = summarize([1, 2, 3], done)
>>> (s.pending, s.acked, s.failed, s.replayed, s.latency_ms["p50"])
(1, 1, 1, 1, 40.0)
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ackstream.topology.described import source_metrics
from ackstream.vocabulary.lineage import REASON_LIMIT
from ackstream.vocabulary.records import (
    ACKED,
    BATCH_FAILED,
    FAILED,
    INVALID,
    REJECTED,
    TIMED_OUT,
    UNKNOWN,
    one_outcome_per_root,
)

if TYPE_CHECKING:
    pass

__all__ = [
    "HISTORY_BINS",
    "LATENCY_BUCKETS_MS",
    "PERCENTILES",
    "REASONS_SHOWN",
    "Status",
    "history",
    "source_metrics",
    "summarize",
]

PERCENTILES = (50, 90, 99)


#: Upper bounds (ms) of the complete-latency histogram's buckets (``+Inf`` is implied).
LATENCY_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000, 60_000)

#: How many time bins :func:`history` cuts the completions into, at most.
HISTORY_BINS = 60

#: How many reasons :class:`Status` keeps per stage (the most frequent).
REASONS_SHOWN = 3


@dataclass(frozen=True)
class Status:
    """Counts of roots by outcome, and complete-latency percentiles (see the module doc)."""

    topology: str
    channel: str
    roots: int  #: distinct roots seen, by init record or completion
    pending: int
    acked: int
    failed: int
    timed_out: int
    replayed: int
    rejected: int
    unknown: int
    invalid: int
    dead_lettered: int | None
    latency_ms: dict[str, float] | None  #: {"p50": .., "p90": .., "p99": ..}
    window_s: float = 60.0
    rates_per_s: dict[str, float] | None = None  #: {"acked": .., "replayed": .., ..}
    failed_by_stage: dict[str, int] | None = None
    rejected_by_stage: dict[str, int] | None = None
    partitions: dict[str, Any] | None = None  #: {topic: {partition: {"end", "committed", "lag"}}}
    held: dict[str, Any] | None = None  #: {stage: {"tuples": n, "roots": n}}
    stages: dict[str, Any] | None = None  #: {stage or sink: {"in": n, "out": n}}
    #: {"buckets": [[le_ms, cumulative count], ...], "count": n, "sum": ms}
    latency_histogram: dict[str, Any] | None = None
    history: list[dict[str, Any]] | None = None  #: see :func:`history`
    failed_reasons: dict[str, Any] | None = None  #: {stage: {reason: roots}}
    rejected_reasons: dict[str, Any] | None = None
    stages_since_ms: int | None = None  #: when the checkpoint began; None: all completions
    graph: dict[str, Any] | None = None  #: {"nodes": [{"name", "kind", "after", "reason"}, ...]}
    run: dict[str, Any] | None = None  #: see the module doc
    #: records the source's batches read since it started (its own count, whichever
    #: reader reads them): as it saved them in a local channel, else as its run's
    #: process recorded them beside the checkpoint; None when neither is at hand
    read: int | None = None
    last_dead_letter_ms: int | None = None  #: when the newest dead letter was written

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """The human-readable report ``ackstream status`` prints."""
        dead = "unknown" if self.dead_lettered is None else str(self.dead_lettered)
        rows = [
            ("roots seen", str(self.roots), ""),
            ("pending", str(self.pending), "init seen, no completion yet"),
            ("acked", str(self.acked), ""),
            ("failed", str(self.failed), ""),
            ("timed out", str(self.timed_out), ""),
            ("replayed", str(self.replayed), "failed or timed out, not dead-lettered"),
            ("rejected", str(self.rejected), "dead-lettered without a replay"),
            (
                "dead-lettered",
                dead,
                ""
                if self.last_dead_letter_ms is None
                else f"the newest died {_utc(self.last_dead_letter_ms)}",
            ),
        ]
        if self.read is not None:
            rows.append(("read", str(self.read), "records the source read since it started"))
        rows += [
            (name, str(n), note)
            for name, n, note in (
                ("unknown", self.unknown, "acks for a root whose init never came; ignored"),
                ("invalid", self.invalid, "unusable ack records or runs; ignored"),
            )
            if n
        ]
        out = [f"topology {self.topology}  channel {self.channel}"]
        if self.run is not None:
            out.append("  " + run_line(self.run))
        out += [
            f"  {name:<14}{value:>8}" + (f"   ({note})" if note else "")
            for name, value, note in rows
        ]
        if self.latency_ms is None:
            out.append("  complete latency: no acked roots yet")
        else:
            out.append(
                "  complete latency (acked)  "
                + "  ".join(f"{k} {v:.0f} ms" for k, v in self.latency_ms.items())
            )
        if self.rates_per_s is not None:
            out.append(
                f"  last {self.window_s:g} s  "
                + "  ".join(f"{k.replace('_', '-')} {v:.1f}/s" for k, v in self.rates_per_s.items())
            )
        since = (
            ""
            if self.stages_since_ms is None
            else f" (since the checkpoint began, {_utc(self.stages_since_ms)})"
        )
        for what, by_stage, reasons in (
            ("failed", self.failed_by_stage, self.failed_reasons or {}),
            ("rejected", self.rejected_by_stage, self.rejected_reasons or {}),
        ):
            if by_stage:
                out.append(f"  {what} by stage{since}")
                for stage, n in by_stage.items():
                    said = "; ".join(f"{r} ({k})" for r, k in reasons.get(stage, {}).items())
                    out.append(f"    {stage:<24}{n:>8}" + (f"   {said}" if said else ""))
        if self.stages:
            out.append(f"  {'tuples by stage':<26}{'in':>10}{'out':>10}")
            for stage, n in self.stages.items():
                counted = "".join(f"{n.get(side, '-'):>10}" for side in ("in", "out"))
                out.append(f"    {stage:<24}{counted}")
        for stage, n in (self.held or {}).items():
            out.append(
                f"  held by {stage}: {n['tuples']} tuples of {n['roots']} roots "
                "(pending until released)"
            )
        if self.partitions is None:
            out.append("  lag: unknown (no source metrics or group commits yet)")
        else:
            out.append(f"  {'partition':<24}{'end':>10}{'committed':>11}{'lag':>8}")
            for topic, parts in self.partitions.items():
                for p, m in parts.items():
                    name = f"{topic}[{p}]"
                    out.append(f"  {name:<24}{m['end']:>10}{m['committed']:>11}{m['lag']:>8}")
        return out


def run_line(run: dict[str, Any]) -> str:
    """The run state :func:`~ackstream.topology.described.read_run` gives, in a line:
    running, stopped or not responding since when, the last batch, the sink a paused
    batch waits for and Spark's UI address.

    >>> run_line({"state": "stopped", "started_ms": 0, "stopped_ms": 60_000,
    ...           "heard_ms": 60_000, "error": None, "spark_ui": None, "last_batch": None})
    'stopped at 1970-01-01 00:01:00 UTC (started 1970-01-01 00:00:00 UTC), no batch yet'
    """
    if run["state"] == "stopped":
        at = (
            f"at {_utc(run['stopped_ms'])}"
            if run.get("stopped_ms") is not None
            else f"after {_utc(run['heard_ms'])}, when it was last heard"
        )
        said = f"stopped {at} (started {_utc(run['started_ms'])})"
        if run.get("error"):
            said += f" with an error: {run['error']}"
    elif run["state"] == "not responding":
        said = f"not responding since {_utc(run['heard_ms'])} (started {_utc(run['started_ms'])})"
    else:
        said = f"running since {_utc(run['started_ms'])}, last heard {_utc(run['heard_ms'])}"
    batch = run.get("last_batch")
    if batch is None:
        said += ", no batch yet"
    else:
        rates = "  ".join(
            f"{name} {batch[key]:.1f} rows/s"
            for name, key in (("input", "input_per_s"), ("processed", "processed_per_s"))
            if batch.get(key) is not None
        )
        said += f", last batch {batch['id']} took {batch['duration_ms']} ms"
        said += f" ({batch['rows']} rows{', ' + rates if rates else ''})"
    paused = run.get("paused")
    if paused:
        said += (
            f"; paused: sink {paused.get('sink')} unreachable since "
            f"{_utc(paused.get('since_ms') or 0)} ({paused.get('error')}), a batch waits "
            f"and no record is charged, next try within {paused.get('retry_s')} s"
        )
    if run.get("spark_ui"):
        said += f", Spark UI {run['spark_ui']}"
    return said


def _utc(t_ms: int | None) -> str:
    if t_ms is None:
        return "unknown"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t_ms / 1000))


def stage_of(status: str, reason: str | None, graph: dict[str, Any] | None = None) -> str:
    """The stage a failed root is charged to: the one its reason begins with, the text
    before its first colon (``"poison: (offset % 10) = 5"`` -> ``"poison"``; a sink's
    reason names the sink); with the declared ``graph``
    (:func:`~ackstream.topology.described.describe`), failing that, the stage whose fixed
    reason it is; else the reason's first part itself.

    >>> stage_of("failed", "parse#2: ValueError: bad"), stage_of("timed_out", None)
    ('parse#2', 'timed out')
    >>> graph = {"nodes": [{"name": "check", "reason": "negative amount"}]}
    >>> stage_of("failed", "negative amount", graph)
    'check'
    """
    if status == TIMED_OUT:
        return "timed out"
    if status == BATCH_FAILED:  # no stage is known: the batch's Spark jobs failed
        return "whole batch"
    named = (reason or "").split(":", 1)[0].strip()
    if graph is not None and reason:
        nodes = graph.get("nodes", ())
        if named not in {n["name"] for n in nodes}:
            for n in nodes:
                fixed = n.get("reason")
                if fixed is not None and reason == fixed[:REASON_LIMIT]:
                    return str(n["name"])
    return named or "(no reason)"


def summarize(
    init_roots: Iterable[int] | np.ndarray,
    completions: pa.Table,
    dead_letters: pa.Table | None = None,
    *,
    topology: str = "ackstream",
    channel: str = "",
    now_ms: int | None = None,
    window_s: float = 60.0,
    partitions: dict[str, Any] | None = None,
    graph: dict[str, Any] | None = None,
    stages_since_ms: int | None = None,
) -> Status:
    """Count roots by outcome from the roots of init records, the completions
    (``COMPLETION_SCHEMA``) and the dead letters (``DEAD_LETTER_SCHEMA``, or None if
    unknown); rates over the ``window_s`` seconds before ``now_ms`` (None: no rates);
    ``partitions`` as the source reported them; failures charged to the stages of the
    declared ``graph`` (:func:`stage_of`), counting those completed from
    ``stages_since_ms`` on (None: all). Pure: no I/O."""
    inits = np.unique(
        np.asarray(
            list(init_roots) if not isinstance(init_roots, np.ndarray) else init_roots,
            dtype=np.int64,
        )
    )
    invalid = pc.equal(completions.column("status"), INVALID)
    n_invalid = pc.sum(pc.cast(invalid, pa.int64())).as_py() or 0
    done = one_outcome_per_root(completions.filter(pc.invert(invalid)))
    done_roots = done.column("root").to_numpy(zero_copy_only=False).astype(np.int64)
    status = done.column("status").to_pylist()
    counts = {s: status.count(s) for s in (ACKED, FAILED, TIMED_OUT, REJECTED, UNKNOWN)}
    counts[FAILED] += status.count(BATCH_FAILED)  # a root of a batch that failed whole

    dead_keys = set()  # (topic, partition, offset, attempt) of each dead-lettered root
    if dead_letters is not None:
        for d in dead_letters.select(["topic", "partition", "offset", "attempts"]).to_pylist():
            dead_keys.add((d["topic"], d["partition"], d["offset"], d["attempts"] - 1))
    since = None if now_ms is None else now_ms - window_s * 1000
    recent = dict.fromkeys(("acked", "replayed", "dead_lettered"), 0)
    replayed = 0
    by_stage: dict[str, dict[str, int]] = {FAILED: {}, REJECTED: {}}
    reasons: dict[str, dict[str, dict[str, int]]] = {FAILED: {}, REJECTED: {}}
    outcomes: list[str | None] = []  # per completion, as counted
    kinds: list[str] = []  # per completion, the card it counts on
    columns = ["status", "topic", "partition", "offset", "attempt", "completed_ms", "reason"]
    for c in done.select(columns).to_pylist():
        outcome: str | None
        if c["status"] == ACKED:
            outcome = "acked"
        elif (c["topic"], c["partition"], c["offset"], c["attempt"]) in dead_keys:
            outcome = "dead_lettered"
        else:
            outcome = "replayed" if c["status"] in (FAILED, TIMED_OUT, BATCH_FAILED) else None
        outcomes.append(outcome)
        kinds.append(FAILED if c["status"] == BATCH_FAILED else c["status"])
        replayed += outcome == "replayed"
        charged = stages_since_ms is None or (c["completed_ms"] or 0) >= stages_since_ms
        if charged and c["status"] in (FAILED, TIMED_OUT, BATCH_FAILED, REJECTED):
            kind = REJECTED if c["status"] == REJECTED else FAILED
            stage = stage_of(c["status"], c["reason"], graph)
            by_stage[kind][stage] = by_stage[kind].get(stage, 0) + 1
            why = reasons[kind].setdefault(stage, {})
            said = c["reason"] or ("timed out" if c["status"] == TIMED_OUT else "(no reason)")
            if said.startswith(f"{stage}:"):  # the stage is said beside it
                said = said[len(stage) + 1 :].strip()
            why[said] = why.get(said, 0) + 1
        if outcome and since is not None and (c["completed_ms"] or 0) > since:
            recent[outcome] += 1

    acked = done.filter(pc.equal(done.column("status"), ACKED))
    latency = acked.column("latency_ms").drop_null().to_numpy().astype(np.float64)
    percentiles = (
        {f"p{p}": float(v) for p, v in zip(PERCENTILES, np.percentile(latency, PERCENTILES))}
        if latency.size
        else None
    )
    completed = done.column("completed_ms").fill_null(0).to_numpy(zero_copy_only=False)
    latencies = done.column("latency_ms").to_numpy(zero_copy_only=False)
    return Status(
        topology=topology,
        channel=channel,
        roots=int(np.union1d(inits, done_roots).size),
        pending=int(np.setdiff1d(inits, done_roots).size),
        acked=counts[ACKED],
        failed=counts[FAILED],
        timed_out=counts[TIMED_OUT],
        replayed=replayed,
        rejected=counts[REJECTED],
        unknown=counts[UNKNOWN],
        invalid=n_invalid,
        dead_lettered=None if dead_letters is None else len(dead_keys),
        last_dead_letter_ms=None
        if dead_letters is None
        else pc.max(dead_letters.column("written_ms")).as_py(),
        latency_ms=percentiles,
        window_s=window_s,
        rates_per_s=None if since is None else {k: n / window_s for k, n in recent.items()},
        failed_by_stage=_most_first(by_stage[FAILED]),
        rejected_by_stage=_most_first(by_stage[REJECTED]),
        failed_reasons=_top_reasons(reasons[FAILED]),
        rejected_reasons=_top_reasons(reasons[REJECTED]),
        stages_since_ms=stages_since_ms,
        graph=graph,
        partitions=partitions,
        latency_histogram=latency_histogram(latency),
        history=history(
            np.asarray(completed, dtype=np.int64),
            np.asarray(outcomes, dtype=object),
            np.asarray(latencies, dtype=np.float64),
            kinds=np.asarray(kinds, dtype=object),
        ),
    )


def latency_histogram(latency_ms: np.ndarray) -> dict[str, Any]:
    """The latencies counted in :data:`LATENCY_BUCKETS_MS`, cumulative as Prometheus'
    histograms have them: ``{"buckets": [[le, n], ...], "count": n, "sum": ms}``.

    >>> latency_histogram(np.array([3.0, 40.0, 70_000.0]))["buckets"][:4]
    [[5, 1], [10, 1], [25, 1], [50, 2]]
    """
    counts = np.searchsorted(np.sort(latency_ms), LATENCY_BUCKETS_MS, side="right")
    return {
        "buckets": [[le, int(n)] for le, n in zip(LATENCY_BUCKETS_MS, counts)],
        "count": int(latency_ms.size),
        "sum": float(latency_ms.sum()),
    }


def history(
    completed_ms: np.ndarray,
    outcomes: np.ndarray,
    latency_ms: np.ndarray,
    bins: int = HISTORY_BINS,
    kinds: np.ndarray | None = None,
) -> list[dict[str, Any]]:
    """Per time bin of the completions (at most ``bins`` of them, each a whole number of
    seconds, over the span the completions cover): the bin's start ``t_ms`` and width
    ``bin_s``; ``acked``, ``failed``, ``timed_out`` and ``rejected`` roots a second by
    their completion's status (``kinds``, one each as the cards count them; without
    them every completion not acked is ``failed``), disjoint, so they stack; of the
    failed and timed out, the ``replayed`` and ``dead_lettered`` roots a second; and
    the percentiles of the bin's acked roots' complete latency (None if none).
    ``outcomes`` as :func:`summarize` counts each completion (None: neither).

    >>> h = history(np.array([1000, 1500, 3200]), np.array(["acked", "replayed", "acked"]),
    ...             np.array([10.0, np.nan, 30.0]), bins=3)
    >>> [(b["t_ms"], b["acked"], b["replayed"], b["p50"]) for b in h]
    [(1000, 1.0, 1.0, 10.0), (2000, 0.0, 0.0, None), (3000, 1.0, 0.0, 30.0)]
    """
    known = completed_ms > 0
    if not known.any():
        return []
    completed_ms, outcomes = completed_ms[known], outcomes[known]
    if kinds is not None:
        kinds = kinds[known]
    latency_ms = latency_ms[known]
    first = int(completed_ms.min()) // 1000 * 1000
    span_s = (int(completed_ms.max()) - first) // 1000 + 1
    bin_s = max(1, -(-span_s // bins))
    which = (completed_ms - first) // (bin_s * 1000)
    out = []
    for i in range(int(which.max()) + 1):
        here = which == i
        got = outcomes[here]
        acked = got == "acked"
        lat = latency_ms[here][acked]
        lat = lat[~np.isnan(lat)]
        row: dict[str, Any] = {"t_ms": first + i * bin_s * 1000, "bin_s": bin_s}
        if kinds is None:
            row.update(acked=float(acked.sum()) / bin_s, failed=float((~acked).sum()) / bin_s)
        else:
            kind = kinds[here]
            for name in (ACKED, FAILED, TIMED_OUT, REJECTED):
                row[name] = float((kind == name).sum()) / bin_s
        row |= {
            "replayed": float((got == "replayed").sum()) / bin_s,
            "dead_lettered": float((got == "dead_lettered").sum()) / bin_s,
        }
        values = np.percentile(lat, PERCENTILES) if lat.size else [None] * len(PERCENTILES)
        out.append(
            {
                **row,
                **{f"p{p}": None if v is None else float(v) for p, v in zip(PERCENTILES, values)},
            }
        )
    return out


def _most_first(counts: dict[str, int]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def _top_reasons(reasons: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    return {
        stage: dict(list(_most_first(said).items())[:REASONS_SHOWN])
        for stage, said in reasons.items()
    }
