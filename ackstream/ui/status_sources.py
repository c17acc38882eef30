"""Where a topology's status is read from: its local or Kafka channel, its checkpoint
(stage counts, held rows, the run's file) and its consumer group's lag, summed by
:func:`ackstream.ui.status.summarize` into a :class:`~ackstream.ui.status.Status`.
``ackstream status``, the live view and the metrics read them through
:class:`StatusSource`."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ackstream.channels.kafka import KafkaChannel
from ackstream.channels.local import SOURCE_METRICS_FILE, LocalChannel
from ackstream.config.source import default_channel_dir
from ackstream.errors import EnvironmentProblem
from ackstream.kafka.offsets import end_offsets
from ackstream.kafka.settings import client_settings, kafka_options_of
from ackstream.sinks.dead_letters import read_dead_letters
from ackstream.sinks.replay_log import FileReplayLog, ReplayLog, TopicReplayLog
from ackstream.topology.described import read_graph, read_run
from ackstream.topology.held_store import FOLDER as HELD_FOLDER
from ackstream.topology.held_store import held_counts
from ackstream.topology.stage_counts import FILE as STAGE_COUNTS_FILE
from ackstream.topology.stage_counts import read_stage_counts
from ackstream.vocabulary.clock import now_ms
from ackstream.vocabulary.ranges import checked, expand, is_run
from ackstream.vocabulary.records import (
    INIT,
)

if TYPE_CHECKING:
    from ackstream.topology.dsl import Topology

from ackstream.ui.status import Status, summarize

__all__ = [
    "StatusSource",
    "checkpoint_began",
    "graph_of",
    "group_lag",
    "held_in",
    "kafka_status",
    "local_status",
    "partition_ends",
    "read_source_metrics",
    "saved_ends",
    "stages_in",
]


def local_status(
    directory: str,
    topology: str = "ackstream",
    dead_letter_dir: str | None = None,
    window_s: float = 60.0,
    graph: dict[str, Any] | None = None,
    stages_since_ms: int | None = None,
) -> Status:
    """The status of the local channel in ``directory`` (dead letters default to
    ``<directory>/dead_letters``, the source's folder when no dead-letter topic is set);
    ``graph`` and ``stages_since_ms`` as :func:`summarize` takes them."""

    if not os.path.isdir(directory):
        raise EnvironmentProblem(
            f"no channel directory at {directory}",
            "Give the directory the topology's ackstream.channel points to.",
        )
    channel = LocalChannel(directory)
    completions, _ = channel.completions_since(None, runs=True)
    letters = read_dead_letters(dead_letter_dir or os.path.join(directory, "dead_letters"))
    saved = read_source_metrics(directory) or {}
    partitions = saved.get("partitions")
    status = summarize(
        _init_roots(channel.ack_records()),
        expand(checked(completions, saved_ends(partitions))),
        letters,
        topology=topology,
        channel=directory,
        now_ms=now_ms(),
        window_s=window_s,
        partitions=partitions,
        graph=graph,
        stages_since_ms=stages_since_ms,
    )
    return replace(status, read=saved.get("read"))


def saved_ends(partitions: dict[str, Any] | None) -> dict[tuple[str, int], int]:
    """``{(topic, partition): end}`` of the partitions in the source's saved metrics
    (:func:`read_source_metrics`): the ends no run of acked offsets may pass, since the
    source saves them each trigger before it plans the batch whose runs they bound."""
    return {
        (topic, int(p)): m["end"]
        for topic, parts in (partitions or {}).items()
        for p, m in parts.items()
    }


def held_in(checkpoint: str) -> dict[str, Any]:
    """Per window or join stage of the topology started with ``checkpoint`` (the directory
    given to ``Topology.start``), the tuples and distinct roots it holds now: ``{stage:
    {"tuples": n, "roots": n}}``, {} when it has no such stage or has run none."""
    return held_counts(os.path.join(checkpoint, "topology", HELD_FOLDER))


def stages_in(checkpoint: str) -> dict[str, Any]:
    """Per stage and sink of the topology started with ``checkpoint``, the tuples it
    read and emitted since the checkpoint began: ``{node: {"in": n, "out": n}}``, {}
    before its first counted batch."""
    return read_stage_counts(os.path.join(checkpoint, "topology", STAGE_COUNTS_FILE))


def read_source_metrics(directory: str) -> dict[str, Any] | None:
    """The metrics the source last saved in the local channel ``directory``, or None."""
    try:
        with open(os.path.join(directory, SOURCE_METRICS_FILE)) as f:
            saved: dict[str, Any] = json.load(f)
            return saved
    except (FileNotFoundError, ValueError):
        return None


def kafka_status(
    bootstrap: str,
    topology: str,
    dead_letter_dir: str | None = None,
    dead_letter_topic: str | None = None,
    window_s: float = 60.0,
    group_id: str | None = None,
    kafka_options: Mapping[str, str] | None = None,
    upstream_bootstrap: str | None = None,
    graph: dict[str, Any] | None = None,
    stages_since_ms: int | None = None,
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
    :class:`EnvironmentProblem`. ``graph`` and ``stages_since_ms`` as :func:`summarize`
    takes them."""

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
        graph=graph,
        stages_since_ms=stages_since_ms,
    )


def partition_ends(
    bootstrap: str,
    partitions: Iterable[tuple[str, int]],
    kafka_options: Mapping[str, str] | None = None,
) -> dict[tuple[str, int], int]:
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


@dataclass(frozen=True)
class StatusSource:
    """Where one topology's status is read: what ``ackstream status`` is given on its
    command line, or what a started topology says of itself (:meth:`of_topology`).
    ``channel``: the local channel's folder; ``bootstrap``: the Kafka channel's
    brokers instead (one of the two). The rest as :func:`kafka_status` takes them;
    ``checkpoint`` adds the stages' counts and held rows."""

    topology: str
    channel: str | None = None
    bootstrap: str | None = None
    kafka_options: dict[str, Any] | None = None
    dead_letters: str | None = None
    dead_letter_topic: str | None = None
    group: str | None = None
    upstream_bootstrap: str | None = None
    checkpoint: str | None = None
    #: the stage graph's edges ``(stream, reader)``, when the topology is at hand
    edges: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of_topology(cls, topology: Topology, checkpoint: str | None = None) -> StatusSource:
        """Where the status of ``topology`` (a :class:`~ackstream.topology.Topology`,
        started with ``checkpoint``) is: its channel, its source's consumer group,
        brokers and dead-letter topic."""
        config = topology.source_config
        channel = topology.channel
        named = [(n.name, n.after) for n in topology.stages]
        named += [(n.name, n.after) for n in topology.sinks]
        edges = tuple((stream, name) for name, after in named for stream in after)
        group = upstream = topic = None
        if config is not None and config.upstream == "kafka":
            group = config.kafka.group_id
            upstream = config.kafka.bootstrap_servers
        if config is not None:
            topic = config.dead_letter_topic
        if isinstance(channel, KafkaChannel):
            if upstream and set(upstream.split(",")) == set(channel.bootstrap.split(",")):
                upstream = None
            return cls(
                channel.topology,
                bootstrap=channel.bootstrap,
                kafka_options=dict(channel.kafka_options),
                dead_letter_topic=topic,
                group=group,
                upstream_bootstrap=upstream,
                checkpoint=checkpoint,
                edges=edges,
            )
        if not isinstance(channel, LocalChannel):
            raise TypeError(
                f"the status of {topology.name!r} is read from a local or a Kafka channel, "
                f"not a {type(channel).__name__}"
            )
        return cls(
            topology.name,
            channel=channel.directory,
            kafka_options=None if config is None else kafka_options_of(config),
            group=group,
            upstream_bootstrap=upstream,
            checkpoint=checkpoint,
            edges=edges,
        )

    @property
    def source_brokers(self) -> str | None:
        """The brokers of the topics the source reads (where dead letters are replayed
        to), when known."""
        return self.upstream_bootstrap or self.bootstrap

    def dead_letters_at(self) -> tuple[str, pa.Table, ReplayLog]:
        """Where the dead letters are (said for a person), the letters, and the log
        their replays are marked in: as ``ackstream dead-letters`` finds them."""
        if self.dead_letters:
            folder = self.dead_letters
        elif self.bootstrap:
            topic = self.dead_letter_topic or f"{self.topology}.dead"
            letters = read_dead_letters(
                bootstrap=self.bootstrap, topic=topic, kafka_options=self.kafka_options
            )
            marks = TopicReplayLog(self.bootstrap, topic, self.kafka_options)
            return f"topic {topic} on {self.bootstrap}", letters, marks
        else:
            folder = os.path.join(
                self.channel or default_channel_dir(self.topology), "dead_letters"
            )
        return folder, read_dead_letters(folder), FileReplayLog(folder)

    def read(self, window_s: float = 60.0) -> Status:
        """The status now (see :func:`kafka_status` for what a silent broker does)."""
        graph = run = since = None
        if self.checkpoint:
            folder = os.path.join(self.checkpoint, "topology")
            graph, run, since = read_graph(folder), read_run(folder), checkpoint_began(folder)
        if graph is None and self.edges:
            graph = graph_of(self.edges)
        if self.bootstrap:
            status = kafka_status(
                self.bootstrap,
                self.topology,
                self.dead_letters,
                self.dead_letter_topic,
                window_s=window_s,
                group_id=self.group,
                kafka_options=self.kafka_options,
                upstream_bootstrap=self.upstream_bootstrap,
                graph=graph,
                stages_since_ms=since,
            )
        else:
            channel = self.channel or default_channel_dir(self.topology)
            status = local_status(
                channel,
                self.topology,
                self.dead_letters,
                window_s=window_s,
                graph=graph,
                stages_since_ms=since,
            )
            if self.upstream_bootstrap:
                group = self.group or f"ackstream-{self.topology}"
                lag = group_lag(self.upstream_bootstrap, group, self.kafka_options)
                status = replace(status, partitions=lag)
        if self.checkpoint:
            status = replace(
                status,
                held=held_in(self.checkpoint),
                stages=stages_in(self.checkpoint),
                run=run,
                # the Kafka channel keeps no source metrics: the run's process says it
                read=status.read if status.read is not None else (run or {}).get("read"),
            )
        return status


def graph_of(edges: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """A graph as :func:`~ackstream.topology.described.describe` has it, from edges
    ``(stream, reader)`` alone (kinds and reasons unknown).

    >>> [n["name"] for n in graph_of([("spout", "a"), ("a", "b"), ("spout", "b")])["nodes"]]
    ['spout', 'a', 'b']
    """
    after: dict[str, list[str]] = {"spout": []}
    for stream, reader in edges:
        after.setdefault(stream, [])
        after.setdefault(reader, []).append(stream)
    return {
        "nodes": [
            {"name": name, "kind": None, "after": streams, "reason": None}
            for name, streams in after.items()
        ]
    }


def checkpoint_began(folder: str) -> int | None:
    """When the query checkpoint ``folder`` began (ms): the time Spark wrote its
    ``metadata`` file, which it writes once; None before the query's first start."""
    try:
        return int(os.stat(os.path.join(folder, "metadata")).st_mtime * 1000)
    except FileNotFoundError:
        return None


def group_lag(
    bootstrap: str, group_id: str, kafka_options: Mapping[str, str] | None = None
) -> dict[str, Any] | None:
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
    partitions: dict[str, Any] = {}
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
