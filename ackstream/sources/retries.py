"""What becomes of a record that failed: a replay after its backoff, or a dead letter.

Retries and backoff count the attempts *charged*: a suspect's replays (a record
replayed because its batch failed as a whole, see :mod:`ackstream.sources.isolation`)
are not. A record charged its last allowed retry, or rejected (the record itself is at
fault), is dead: it waits for its dead letter to be written, and is then done.
"""

from __future__ import annotations

import numpy as np

from ackstream.config.source import RetryPolicy
from ackstream.sources.outcomes import Outcomes
from ackstream.sources.spans import Roots
from ackstream.sources.waiting import NO_GROUP, Scheduled, UnchargedCounts, packed
from ackstream.vocabulary.dead_letter import DeadLetter
from ackstream.vocabulary.partition import Partition

__all__ = ["Retries"]


class Retries:
    """The records of one source waiting for a replay or for their dead letter."""

    def __init__(self, policy: RetryPolicy, tps: list[Partition], counts: dict[str, int]):
        self.policy = policy
        self._tps = tps  # the partition of each number (the tracker's, growing)
        self._counts = counts  # the tracker's outcome counts
        #: records waiting for their replay; those of a group (suspects, records that
        #: failed alone) replay only with their group, in a batch of its own
        self.waiting = Scheduled()
        self.dead: dict[tuple[Partition, int], DeadLetter] = {}
        #: per record not done, its attempts not charged to its retries (as a suspect)
        self.uncharged = UnchargedCounts()
        self.groups = 0  # the last group number given

    def __len__(self) -> int:
        """How many records wait for a replay or for their dead letter."""
        return len(self.waiting) + len(self.dead)

    def new_groups(self, n: int) -> np.ndarray:
        """``n`` group numbers not given before."""
        first = self.groups + 1
        self.groups += n
        return first + np.arange(n)

    def fail(
        self,
        roots: Roots,
        why: Outcomes,
        now_ms: int,
        replay: np.ndarray | bool = True,
        alone: bool = False,
        group: int = NO_GROUP,
    ) -> list[DeadLetter]:
        """Records no longer in flight failed: schedule their replays or dead-letter them.
        ``replay`` False: dead now (rejected); ``alone``: each failed a batch of its
        own, and its replays stay alone; ``group``: their replays wait together in that
        group."""
        keys = packed(roots.part, roots.offset)
        charged = roots.attempt - self.uncharged.get(keys)
        dead = (charged >= self.policy.max_retries) | ~np.broadcast_to(replay, charged.shape)
        letters = [
            DeadLetter(self._tps[p][0], self._tps[p][1], off, att + 1, reason)
            for p, off, att, reason in zip(
                roots.part[dead].tolist(),
                roots.offset[dead].tolist(),
                roots.attempt[dead].tolist(),
                why.select(dead).dead_letter_reasons(),
            )
        ]
        for letter in letters:
            self.dead[((letter.topic, letter.partition), letter.offset)] = letter
        live = ~dead
        n = int(live.sum())
        groups = self.new_groups(n) if alone else np.full(n, group)
        due = now_ms + self.policy.delays_ms(charged[live] + 1)
        self.waiting.add(roots.part[live], roots.offset[live], roots.attempt[live] + 1, due, groups)
        self._counts["replayed"] += n
        return letters

    def forget(self, part: int, offsets: np.ndarray) -> None:
        """The records at ``offsets`` of partition number ``part`` neither wait nor are dead."""
        self.waiting.drop(part, offsets)
        self.uncharged.drop(packed(part, offsets))
        if self.dead:
            tp = self._tps[part]
            for off in offsets.tolist():
                self.dead.pop((tp, off), None)
