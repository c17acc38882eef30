"""A dead letter: a record the source gave up on, with how often it was emitted and why.

The source's tracker makes them and the dead-letter writers (``ackstream.sinks``) write
them; both read this one type.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DeadLetter"]


@dataclass(frozen=True)
class DeadLetter:
    """A record that failed on its last allowed attempt or was rejected; ``attempts``
    counts every emit (a suspect's too: an emit not charged to its retries);
    ``reason`` is the status, then the stage's reason if it gave one
    (``"failed: parse#2: ValueError: ..."``)."""

    topic: str
    partition: int
    offset: int
    attempts: int
    reason: str
