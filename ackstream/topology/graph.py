"""The topology as a graph: which stages and sinks subscribe to which stream.

A stream is the output of the spout (:data:`SPOUT`) or of a stage; any number of
stages and sinks may subscribe to it (Storm's several subscribers of one stream),
and a stage may subscribe to several streams (branches joining again: it reads
their union). Stages are declared after the streams they read, so declaration
order is a topological order and a batch runs them in it.

Acking a fan-out: in Storm a tuple emitted to a stream with k subscribers goes
out as k tuples with k edge ids, all XORed into its anchors' ack, so the root
completes only when every subscriber has acked its copy. Here each subscriber
gets its own copy of the stream, re-minted with edge ``xxhash64(edge, producer,
-i)`` (:func:`subscriber_copies`), and the fan-out point acks the stream's own
edges XOR the copies' (an extra hop of the tree, same outcome). Telescoped
topologies carry roots only, so their subscribers share the stream as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ackstream.topology.anchoring import Anchoring, anchor_list, is_multi_anchored
from ackstream.vocabulary.lineage import ANCHORS, EDGE, ROOT

if TYPE_CHECKING:
    from ackstream.sinks.base import Sink

__all__ = ["SPOUT", "SinkNode", "join_streams", "subscriber_copies", "subscribers"]

#: The name of the topology's input stream (what ``after=`` names to read it).
SPOUT = "spout"


@dataclass
class SinkNode:
    """A sink and the stream(s) it writes; ``continues_trees``: the sink leaves its
    rows' trees open for another process (``KafkaSink(continue_trees=True)``), so a
    batch calls its ``write_continued``."""

    name: str
    sink: Sink
    after: tuple[str, ...]
    continues_trees: bool = False


class Subscriber(Protocol):
    """What the graph reads of a stage or a sink: its name and the streams it reads."""

    @property
    def name(self) -> str: ...
    @property
    def after(self) -> tuple[str, ...]: ...


def subscribers(stages: Sequence[Subscriber], sinks: Sequence[SinkNode]) -> dict[str, list[str]]:
    """Per stream (the spout's and each stage's), the names of the stages and sinks
    that read it, in declaration order."""
    subs: dict[str, list[str]] = {SPOUT: []}
    subs.update({stage.name: [] for stage in stages})
    nodes: list[Subscriber] = [*stages, *sinks]
    for node in nodes:
        for stream in node.after:
            subs[stream].append(node.name)
    return subs


def subscriber_copies(
    stream: DataFrame, producer: int, names: list[str], anchoring: Anchoring
) -> dict[str, DataFrame]:
    """Each subscriber's copy of ``stream`` (made by stage number ``producer``, 0 for
    the spout): with several subscribers, a child of the stream each (``anchoring``'s:
    with edges, re-minted with an edge id of its own, so that each subscriber's ack is
    needed); else the stream itself."""
    if len(names) < 2:
        return {name: stream for name in names}
    return {name: anchoring.children(stream, producer, -(i + 1)) for i, name in enumerate(names)}


def join_streams(streams: list[DataFrame]) -> DataFrame:
    """The union of the streams a stage subscribes to, by column name (a payload
    column one stream lacks is null in its rows). If any stream is multi-anchored
    (with edges, or a waiting join's output with telescoped acks), single-anchored
    rows are turned into one-entry anchor lists, so that a row's roots are in one
    place whichever stream it came from."""
    if len(streams) > 1 and any(is_multi_anchored(s) for s in streams):
        null = F.lit(None).cast("long")
        streams = [
            s
            if is_multi_anchored(s)
            else s.withColumn(ANCHORS, anchor_list(s, F.col(EDGE))).withColumn(ROOT, null)
            for s in streams
        ]
    joined = streams[0]
    for stream in streams[1:]:
        joined = joined.unionByName(stream, allowMissingColumns=True)
    return joined
