"""The sink: where a topology's final tuples go, and how it says what it could not write.

A sink's ``write`` runs at the end of the topology's ``foreachBatch``, after every
stage. Its rows are acked only once ``write`` returned, and only those it did not
hand back, so a record is never acked unwritten. Every sink passes one contract
suite (``tests/sinks/test_sink_contract.py``).

A sink of one's own subclasses :class:`Sink` and writes ``write``: it then says it
continues no trees and has nothing to close, as the protocol's defaults say.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

__all__ = ["ContinuingSink", "Sink"]


@runtime_checkable
class Sink(Protocol):
    """User output of a topology."""

    #: Whether the sink's messages continue their rows' tuple trees in another process
    #: (a :class:`ContinuingSink` that says so); a topology asks once, when the sink is
    #: declared. False for every sink that writes its rows and is done with them.
    continue_trees: bool = False

    def write(self, outputs: DataFrame, batch_id: int) -> DataFrame | None:
        """Write the rows of ``outputs`` (a static DataFrame that still carries the
        lineage columns) for micro-batch ``batch_id``. Return None when every row was
        written, or the rows that were not, as a DataFrame with at least their lineage
        columns (and a ``_reason`` column, if the sink knows why): their roots fail and
        are replayed. Raising fails the roots of every row it was given (an error out
        of Spark's jobs, which computed the stages, fails the batch as a whole
        instead: see :mod:`ackstream.topology.batch_failure`). A batch re-run after a
        crash is written again (at least once): ``batch_id`` lets a sink drop what it
        already has."""

    def close(self) -> None:
        """Release clients; called once ``RunningTopology.stop()`` has stopped the
        queries (not under Spark Connect, where the sinks that wrote are copies beside
        the server, nor when a query ends with an error)."""


@runtime_checkable
class ContinuingSink(Sink, Protocol):
    """A sink whose messages continue their rows' tuple trees in another process
    (:mod:`ackstream.sinks.continued`): with ``continue_trees`` true, a topology's batch
    calls :meth:`write_continued` instead of ``write``, and the trees stay open until
    that process acks."""

    def write_continued(
        self, outputs: DataFrame, batch_id: int
    ) -> tuple[DataFrame | None, pa.Table]:
        """Write ``outputs``, whose rows carry ``_roots`` (the roots each is anchored
        to), with their lineage as headers; return the unwritten rows (or None, as
        ``write`` does) and the ack records ``(root, edge)`` of every message written
        (an Arrow table of :data:`~ackstream.vocabulary.records.ACK_RECORD_SCHEMA`)."""
