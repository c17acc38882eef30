"""A batch of an isolation round writes its sinks only once their input is computed.

A batch whose Spark jobs fail as a whole is replayed in groups, a round at a time,
until the record at fault fails alone (:mod:`ackstream.topology.batch_failure`).
Spark's writers write as their tasks go, so a group whose job fails has had its other
tasks' rows (and the rows before the one at fault) written already, and they are
written again when their records go through in a later round. A round's batch
therefore persists each sink's input and counts it first (a stage raising fails that
count, before anything is written), then writes it from the cache: a failing round
writes nothing, and a round that goes through computes its stages once, as before.

Only rounds pay for the cache and the count. A batch that is not a round still writes
in the job that computes it: when that job fails, what its tasks wrote before it
failed stays written, and is written again by the rounds (duplicates, never a loss).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ackstream.vocabulary.batch_offset import BatchOffset

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from ackstream.sinks.base import ContinuingSink, Sink
    from ackstream.topology.batch import DeclaredTopology

__all__ = ["ComputedFirst", "computed_first", "is_isolation_round"]

_T = TypeVar("_T", bound="DeclaredTopology")


def is_isolation_round(offsets: Sequence[BatchOffset]) -> bool:
    """Whether the batch of ``offsets`` replays a group of an isolation in progress: a
    tracked source planned it with rounds under way, replays only, nothing new (each
    group of a round is a batch of its own)."""
    return any(
        offset.tracked is not None
        and offset.tracked.rounds is not None
        and offset.replays
        and not offset.new_records
        for offset in offsets
    )


def computed_first(topology: _T) -> _T:
    """A copy of ``topology`` whose sinks compute their input before writing it."""
    checked = copy.copy(topology)
    checked.sinks = [replace(node, sink=ComputedFirst(node.sink)) for node in topology.sinks]
    return checked


class ComputedFirst:
    """``sink``, given its input persisted and counted: an error of the stages that
    compute it raises before the sink writes a row."""

    def __init__(self, sink: Sink):
        self.sink = sink
        self.continue_trees = getattr(sink, "continue_trees", False)

    def write(self, outputs: DataFrame, batch_id: int) -> Any:
        kept = _computed(outputs)
        try:
            return self.sink.write(kept, batch_id)
        finally:
            kept.unpersist()

    def write_continued(self, outputs: DataFrame, batch_id: int) -> Any:
        kept = _computed(outputs)
        try:
            return cast("ContinuingSink", self.sink).write_continued(kept, batch_id)
        finally:
            kept.unpersist()

    def close(self) -> None:
        self.sink.close()


def _computed(outputs: DataFrame) -> DataFrame:
    """``outputs`` persisted and counted: building the cache computes every column of
    every row, so a stage's run-time error raises here (and nothing is kept). Not a
    ``noop`` write: after a batch whose hung pandas bolt was cancelled, that write of
    the next round's one record ran past the batch deadline, where the count did not."""
    kept = outputs.persist()
    try:
        kept.count()
    except BaseException:
        kept.unpersist()
        raise
    return kept
