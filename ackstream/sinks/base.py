"""The sink: where a topology's final tuples go, and how it says what it could not write.

A sink's ``write`` runs at the end of the topology's ``foreachBatch``, after every
stage. Its rows are acked only once ``write`` returned, and only those it did not
hand back, so a record is never acked unwritten. Every sink passes one contract
suite (``tests/sinks/test_sink_contract.py``).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["Sink"]


@runtime_checkable
class Sink(Protocol):
    """User output of a topology."""

    def write(self, outputs, batch_id: int):
        """Write the rows of ``outputs`` (a static DataFrame that still carries the
        lineage columns) for micro-batch ``batch_id``. Return None when every row was
        written, or the rows that were not (an Arrow table or DataFrame with at least
        their lineage columns): their roots fail and are replayed. Raising fails the
        whole batch's roots. A batch re-run after a crash is written again (at least
        once): ``batch_id`` lets a sink drop what it already has."""

    def close(self) -> None:
        """Release clients; called when the topology stops."""
