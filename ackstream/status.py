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
  brokers have; see :func:`ackstream.ranges.checked`). Both are ignored by sources.
- ``replayed``: failed or timed-out roots whose record was not dead-lettered on
  that attempt, so the source reads it again (or will, after its backoff).
- ``dead_lettered``: records in the dead-letter Parquet folder or on the dead-letter
  topic (Kafka channel), each once (a letter written twice after a crash counts
  once); ``None`` when unknown.
- ``latency_ms``: complete latency (init to ack, as Storm's ``complete latency``)
  percentiles of the acked roots; ``None`` when nothing was acked.

- ``rates_per_s``: acked, replayed and dead-lettered roots a second over the last
  ``window_s`` seconds, by their completions' time.
- ``failed_by_stage``: failed and timed-out roots by the stage their reason names
  (``"timed out"`` for timeouts): Storm UI's failed count per bolt;
  ``rejected_by_stage``: the rejected roots, apart (they are never replayed).
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

Reading needs pyarrow only, no Spark session. :func:`summarize` is the pure part.

>>> import pyarrow as pa
>>> from ackstream.records import COMPLETION_SCHEMA
>>> done = pa.Table.from_pylist([
...     {"root": 1, "status": "acked", "latency_ms": 40},
...     {"root": 2, "status": "failed", "topic": "t", "partition": 0, "offset": 7,
...      "attempt": 0}], schema=COMPLETION_SCHEMA)
>>> s = summarize([1, 2, 3], done)
>>> (s.pending, s.acked, s.failed, s.replayed, s.latency_ms["p50"])
(1, 1, 1, 1, 40.0)
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ackstream.channels.kafka import KafkaChannel
from ackstream.channels.local import SOURCE_METRICS_FILE, LocalChannel
from ackstream.clock import now_ms
from ackstream.errors import EnvironmentProblem
from ackstream.kafka.offsets import end_offsets
from ackstream.kafka.settings import client_settings
from ackstream.ranges import checked, expand, is_run
from ackstream.records import (
    ACKED,
    BATCH_FAILED,
    FAILED,
    INIT,
    INVALID,
    REJECTED,
    TIMED_OUT,
    UNKNOWN,
    one_outcome_per_root,
)
from ackstream.sinks.dead_letters import read_dead_letters
from ackstream.topology.held_store import FOLDER as HELD_FOLDER
from ackstream.topology.held_store import held_counts
from ackstream.topology.stage_counts import FILE as STAGE_COUNTS_FILE
from ackstream.topology.stage_counts import read_stage_counts

__all__ = [
    "PERCENTILES",
    "PROMETHEUS_FAMILIES",
    "Status",
    "kafka_status",
    "local_status",
    "held_in",
    "stages_in",
    "partition_ends",
    "saved_ends",
    "source_metrics",
    "summarize",
]

PERCENTILES = (50, 90, 99)


#: The metric families of :meth:`Status.prometheus` (``ackstream_<name>``): their type
#: and help. Counts that only grow are counters, named ``*_total``; levels are gauges.
PROMETHEUS_FAMILIES = {
    "roots_pending": ("gauge", "Roots with an init record and no completion yet."),
    "roots_total": ("counter", "Completed roots by outcome."),
    "roots_replayed_total": ("counter", "Failed or timed-out roots whose record is read again."),
    "dead_letters_total": ("counter", "Records dead-lettered."),
    "rate_per_second": ("gauge", "Roots a second over the last window_s seconds, by outcome."),
    "failed_by_stage_total": ("counter", "Failed and timed-out roots by the stage at fault."),
    "rejected_by_stage_total": ("counter", "Rejected roots by the stage at fault."),
    "complete_latency_ms": ("gauge", "Complete latency of the acked roots, in ms."),
    "held": ("gauge", "Tuples and roots a window or join stage holds."),
    "stage_tuples_total": ("counter", "Tuples each stage and sink read (in) and emitted (out)."),
    "partition_end": ("gauge", "The end offset of each upstream partition."),
    "partition_committed": ("gauge", "The offset the source's group committed, per partition."),
    "partition_lag": ("gauge", "Offsets not yet acked or dead-lettered, per partition."),
}


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
    partitions: dict | None = None  #: {topic: {partition: {"end", "committed", "lag"}}}
    held: dict | None = None  #: {stage: {"tuples": n, "roots": n}}
    stages: dict | None = None  #: {stage or sink: {"in": n, "out": n}}

    def to_dict(self) -> dict:
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
            ("dead-lettered", dead, ""),
        ]
        rows += [
            (name, str(n), note)
            for name, n, note in (
                ("unknown", self.unknown, "acks for a root whose init never came; ignored"),
                ("invalid", self.invalid, "unusable ack records or runs; ignored"),
            )
            if n
        ]
        out = [f"topology {self.topology}  channel {self.channel}"]
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
        for what, by_stage in (
            ("failed", self.failed_by_stage),
            ("rejected", self.rejected_by_stage),
        ):
            if by_stage:
                out.append(f"  {what} by stage")
                out += [f"    {stage:<24}{n:>8}" for stage, n in by_stage.items()]
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

    def prometheus(self) -> str:
        """The figures in Prometheus' text exposition format (the families of
        :data:`PROMETHEUS_FAMILIES`), for a textfile collector or a scrape through a
        small HTTP wrapper. Every sample has the label ``topology``."""
        by_stage = {"failed": self.failed_by_stage, "rejected": self.rejected_by_stage}
        samples: dict[str, list] = {
            "roots_pending": [({}, self.pending)],
            "roots_total": [
                ({"outcome": name}, getattr(self, name))
                for name in ("acked", "failed", "timed_out", "rejected")
            ],
            "roots_replayed_total": [({}, self.replayed)],
            "dead_letters_total": [] if self.dead_lettered is None else [({}, self.dead_lettered)],
            "rate_per_second": [
                ({"outcome": k, "window_s": f"{self.window_s:g}"}, v)
                for k, v in (self.rates_per_s or {}).items()
            ],
            **{
                f"{what}_by_stage_total": [({"stage": s}, n) for s, n in (counts or {}).items()]
                for what, counts in by_stage.items()
            },
            "complete_latency_ms": [
                ({"quantile": f"{int(k[1:]) / 100:g}"}, v)
                for k, v in (self.latency_ms or {}).items()
            ],
            "held": [
                ({"stage": stage, "of": what}, n[what])
                for stage, n in (self.held or {}).items()
                for what in ("tuples", "roots")
            ],
            "stage_tuples_total": [
                ({"stage": stage, "side": side}, n)
                for stage, sides in (self.stages or {}).items()
                for side, n in sides.items()
            ],
            **{
                f"partition_{name}": [
                    ({"topic": topic, "partition": p}, m[name])
                    for topic, parts in (self.partitions or {}).items()
                    for p, m in parts.items()
                ]
                for name in ("end", "committed", "lag")
            },
        }
        lines = []
        for name, (kind, text) in PROMETHEUS_FAMILIES.items():
            if samples[name]:
                lines += [f"# HELP ackstream_{name} {text}", f"# TYPE ackstream_{name} {kind}"]
                lines += [
                    f"ackstream_{name}{_labels(self.topology, labels)} {_number(value)}"
                    for labels, value in samples[name]
                ]
        return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    """A sample's value: an integer as it is, a float in full (``{:g}`` would round)."""
    return str(value) if isinstance(value, int) else repr(float(value))


def _labels(topology: str, labels: dict) -> str:
    pairs = {"topology": topology, **labels}
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in pairs.items()) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def stage_of(status: str, reason: str | None) -> str:
    """The stage a failed root's reason names: the text before its first colon
    (``"poison: (offset % 10) = 5"`` -> ``"poison"``; a sink's reason names the sink).

    >>> stage_of("failed", "parse#2: ValueError: bad"), stage_of("timed_out", None)
    ('parse#2', 'timed out')
    """
    if status == TIMED_OUT:
        return "timed out"
    if status == BATCH_FAILED:  # no stage is known: the batch's Spark jobs failed
        return "whole batch"
    return (reason or "").split(":", 1)[0].strip() or "(no reason)"


def summarize(
    init_roots: Iterable[int] | np.ndarray,
    completions: pa.Table,
    dead_letters: pa.Table | None = None,
    *,
    topology: str = "ackstream",
    channel: str = "",
    now_ms: int | None = None,
    window_s: float = 60.0,
    partitions: dict | None = None,
) -> Status:
    """Count roots by outcome from the roots of init records, the completions
    (``COMPLETION_SCHEMA``) and the dead letters (``DEAD_LETTER_SCHEMA``, or None if
    unknown); rates over the ``window_s`` seconds before ``now_ms`` (None: no rates);
    ``partitions`` as the source reported them. Pure: no I/O."""
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
    columns = ["status", "topic", "partition", "offset", "attempt", "completed_ms", "reason"]
    for c in done.select(columns).to_pylist():
        outcome: str | None
        if c["status"] == ACKED:
            outcome = "acked"
        elif (c["topic"], c["partition"], c["offset"], c["attempt"]) in dead_keys:
            outcome = "dead_lettered"
        else:
            outcome = "replayed" if c["status"] in (FAILED, TIMED_OUT, BATCH_FAILED) else None
        replayed += outcome == "replayed"
        if c["status"] in (FAILED, TIMED_OUT, BATCH_FAILED, REJECTED):
            counted = by_stage[REJECTED if c["status"] == REJECTED else FAILED]
            stage = stage_of(c["status"], c["reason"])
            counted[stage] = counted.get(stage, 0) + 1
        if outcome and since is not None and (c["completed_ms"] or 0) > since:
            recent[outcome] += 1

    acked = done.filter(pc.equal(done.column("status"), ACKED))
    latency = acked.column("latency_ms").drop_null().to_numpy().astype(np.float64)
    percentiles = (
        {f"p{p}": float(v) for p, v in zip(PERCENTILES, np.percentile(latency, PERCENTILES))}
        if latency.size
        else None
    )
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
        latency_ms=percentiles,
        window_s=window_s,
        rates_per_s=None if since is None else {k: n / window_s for k, n in recent.items()},
        failed_by_stage=_most_first(by_stage[FAILED]),
        rejected_by_stage=_most_first(by_stage[REJECTED]),
        partitions=partitions,
    )


def _most_first(counts: dict[str, int]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def local_status(
    directory: str,
    topology: str = "ackstream",
    dead_letter_dir: str | None = None,
    window_s: float = 60.0,
) -> Status:
    """The status of the local channel in ``directory`` (dead letters default to
    ``<directory>/dead_letters``, the source's folder when no dead-letter topic is set)."""

    if not os.path.isdir(directory):
        raise EnvironmentProblem(
            f"no channel directory at {directory}",
            "Give the directory the topology's ackstream.channel points to.",
        )
    channel = LocalChannel(directory)
    completions, _ = channel.completions_since(None, runs=True)
    letters = read_dead_letters(dead_letter_dir or os.path.join(directory, "dead_letters"))
    partitions = (read_source_metrics(directory) or {}).get("partitions")
    return summarize(
        _init_roots(channel.ack_records()),
        expand(checked(completions, saved_ends(partitions))),
        letters,
        topology=topology,
        channel=directory,
        now_ms=now_ms(),
        window_s=window_s,
        partitions=partitions,
    )


def saved_ends(partitions: dict | None) -> dict[tuple[str, int], int]:
    """``{(topic, partition): end}`` of the partitions in the source's saved metrics
    (:func:`read_source_metrics`): the ends no run of acked offsets may pass, since the
    source saves them each trigger before it plans the batch whose runs they bound."""
    return {
        (topic, int(p)): m["end"]
        for topic, parts in (partitions or {}).items()
        for p, m in parts.items()
    }


def held_in(checkpoint: str) -> dict:
    """Per window or join stage of the topology started with ``checkpoint`` (the directory
    given to ``Topology.start``), the tuples and distinct roots it holds now: ``{stage:
    {"tuples": n, "roots": n}}``, {} when it has no such stage or has run none."""
    return held_counts(os.path.join(checkpoint, "topology", HELD_FOLDER))


def stages_in(checkpoint: str) -> dict:
    """Per stage and sink of the topology started with ``checkpoint``, the tuples it
    read and emitted since the checkpoint began: ``{node: {"in": n, "out": n}}``, {}
    before its first counted batch."""
    return read_stage_counts(os.path.join(checkpoint, "topology", STAGE_COUNTS_FILE))


def read_source_metrics(directory: str) -> dict | None:
    """The metrics the source last saved in the local channel ``directory``, or None."""
    try:
        with open(os.path.join(directory, SOURCE_METRICS_FILE)) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None


def kafka_status(
    bootstrap: str,
    topology: str,
    dead_letter_dir: str | None = None,
    dead_letter_topic: str | None = None,
    window_s: float = 60.0,
    group_id: str | None = None,
    kafka_options=None,
    upstream_bootstrap: str | None = None,
) -> Status:
    """The status of the Kafka channel of ``topology`` (topics ``<topology>.acks`` and
    ``<topology>.done``), with the lag of the source's consumer group ``group_id``
    (default ``ackstream-<topology>``, the source's) on the same brokers, or on
    ``upstream_bootstrap`` when the source reads topics on other brokers.
    ``kafka_options``: ``kafka.*`` connection and security options, as a
    :class:`~ackstream.channels.kafka.KafkaChannel` takes them.

    Dead letters come from ``dead_letter_dir`` (Parquet) if given, else from the
    dead-letter topic (default ``<topology>.dead``, the source's default with
    ``ackstream.channel=kafka``). Brokers that do not answer fail the first read
    (raised as kafka-python raises it); a completions read they do not answer raises
    :class:`EnvironmentProblem`."""

    channel = KafkaChannel(bootstrap, topology, kafka_options=kafka_options)
    try:
        inits = _init_roots(channel.ack_records())
        completions, _ = channel.completions_since(None, runs=True)  # rides out a silent broker
        if not channel.answering():
            raise EnvironmentProblem(
                f"the Kafka brokers at {bootstrap} did not answer a read of {channel.done_topic}",
                "Check that they are up, then ask again.",
            )
    finally:
        channel.close()
    ran = completions.filter(pa.array(is_run(completions)))
    ends = partition_ends(
        upstream_bootstrap or bootstrap,
        set(zip(ran.column("topic").to_pylist(), ran.column("partition").to_pylist())),
        kafka_options,
    )
    completions = expand(checked(completions, ends))
    if dead_letter_dir:
        letters = read_dead_letters(dead_letter_dir)
    else:
        topic = dead_letter_topic or f"{topology}.dead"
        letters = read_dead_letters(bootstrap=bootstrap, topic=topic, kafka_options=kafka_options)
    return summarize(
        inits,
        completions,
        letters,
        topology=topology,
        channel=f"kafka {bootstrap} {channel.acks_topic}, {channel.done_topic}",
        now_ms=now_ms(),
        window_s=window_s,
        partitions=group_lag(
            upstream_bootstrap or bootstrap, group_id or f"ackstream-{topology}", kafka_options
        ),
    )


def partition_ends(bootstrap: str, partitions, kafka_options=None) -> dict[tuple[str, int], int]:
    """``{(topic, partition): end offset}`` of those of ``partitions`` the brokers at
    ``bootstrap`` have (none asked when there are none)."""
    if not partitions:
        return {}
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        **client_settings(kafka_options or {}),
        bootstrap_servers=bootstrap.split(","),
        enable_auto_commit=False,
        group_id=None,
        allow_auto_create_topics=False,
    )
    try:
        listed = consumer.topics()
        there = [
            TopicPartition(topic, p)
            for topic, p in sorted(partitions, key=str)
            if topic in listed and p in (consumer.partitions_for_topic(topic) or ())
        ]
        ends = end_offsets(consumer, there) if there else {}
    finally:
        consumer.close()
    return {(tp.topic, tp.partition): end for tp, end in ends.items()}


def group_lag(bootstrap: str, group_id: str, kafka_options=None) -> dict | None:
    """``{topic: {partition: {"end", "committed", "lag"}}}`` for every partition the
    consumer group ``group_id`` has committed (the source commits its acked watermark,
    so ``lag`` counts the offsets not yet acked or dead-lettered); None when the group
    has committed nothing."""
    from kafka import KafkaAdminClient, KafkaConsumer
    from kafka.errors import KafkaError

    settings = client_settings(kafka_options or {})
    admin = KafkaAdminClient(
        **settings, bootstrap_servers=bootstrap.split(","), client_id="ackstream-status"
    )
    try:
        for attempt in range(10):
            try:
                listed = admin.list_group_offsets(group_id).get(group_id, {})
                break
            except KafkaError as error:  # a fresh cluster's coordinator is not up yet
                if not error.retriable or attempt == 9:
                    raise
                time.sleep(0.5)
    finally:
        admin.close()
    committed = {tp: meta for tp, meta in listed.items() if meta.offset >= 0}
    if not committed:
        return None
    consumer = KafkaConsumer(
        **settings, bootstrap_servers=bootstrap.split(","), enable_auto_commit=False, group_id=None
    )
    try:
        ends = end_offsets(consumer, list(committed))
    finally:
        consumer.close()
    partitions: dict = {}
    for tp in sorted(committed):
        done, end = committed[tp].offset, ends[tp]
        partitions.setdefault(tp.topic, {})[str(tp.partition)] = {
            "end": end,
            "committed": done,
            "lag": max(0, end - done),
        }
    return partitions


def _init_roots(records: pa.Table) -> np.ndarray:
    is_init = pc.not_equal(pc.bit_wise_and(records.column("kind"), pa.scalar(INIT, pa.int8())), 0)
    roots = records.column("root").filter(pc.fill_null(is_init, False))
    return np.unique(roots.to_numpy(zero_copy_only=False).astype(np.int64))


def source_metrics(progress) -> dict | None:
    """The ``ackstream`` source's metrics in a ``StreamingQueryProgress`` (as
    ``query.lastProgress`` gives it, or its JSON as a dict): acked, failed, timed_out,
    rejected, replayed and dead_lettered since the checkpoint began, pending roots, and
    per topic and partition ``end``, ``committed`` and ``lag``. Spark shows them as the
    source's ``latestOffset`` (see ``Spout.metrics``). None if no source reported them.

    >>> source_metrics({"sources": [{"latestOffset": '{"acked": 3, "pending": 1, '
    ...                              '"partitions": {"t": {"0": {"lag": 1}}}}'}]})["acked"]
    3
    """
    for source in (progress or {}).get("sources", ()):
        latest = source.get("latestOffset")
        try:
            latest = json.loads(latest) if isinstance(latest, str) else latest
        except ValueError:
            continue
        if isinstance(latest, dict) and {"pending", "partitions"} <= latest.keys():
            return latest
    return None
