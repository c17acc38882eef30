"""Rounds of isolation: finding the records at fault in a batch that failed as a whole.

A batch fails as a whole when an error comes out of its Spark jobs or it overruns
the batch deadline (completions ``batch_failed``): its records are *suspects*, not
known to be at fault. Each is replayed at once, no retry charged, in a batch of its
own group: the failed batch's roots split in :data:`ISOLATION_PARTS` groups, a
*round*, so a record at fault is alone after a few rounds. Only a record that fails
alone in its batch is charged, and it stays alone for its replays. Once every group
of a first round (or of one as wide) has failed as a whole, the error is every
record's (a stage that fails them all, a downstream outage): the round's records are
charged a retry each and replayed together after their backoff, not split again;
they end acked once the error goes, or dead-lettered with its reason after their
retries.

A group that fails is split as widely as the failures of its round suggest records
at fault in it (twice the groups of its round failed so far, at most
:data:`ISOLATION_PARTS`): a record at fault alone in a first round's group is then
found by halving, a batch or two a round, not eight. A narrower round all of whose
groups failed says only that each holds a record at fault: its groups split on,
wider.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from ackstream.sources.outcomes import Outcomes
from ackstream.sources.retries import Retries
from ackstream.sources.spans import Roots
from ackstream.sources.waiting import NO_GROUP, packed
from ackstream.vocabulary.arrays import distinct
from ackstream.vocabulary.dead_letter import DeadLetter
from ackstream.vocabulary.records import BATCH_FAILED

__all__ = ["ISOLATION_PARTS", "Isolation", "Rounds"]

log = logging.getLogger(__name__)

#: The roots of a batch that failed as a whole replay in this many batches of their own.
ISOLATION_PARTS = 8


class Isolation:
    """The rounds of isolation of one source (see the module doc); the records it
    replays or charges wait in the source's :class:`~ackstream.sources.retries.Retries`."""

    def __init__(self, retries: Retries, counts: dict[str, int]) -> None:
        self.rounds = Rounds()
        self._retries = retries
        self._counts = counts  # the tracker's outcome counts

    def isolate(self, failed: Roots, outcome: Outcomes, now_ms: int) -> list[DeadLetter]:
        """Roots whose batch failed as a whole (``failed``, in flight until now), batch by
        batch: a root alone in its batch is at fault, and fails as any root does;
        those of a bigger batch are split into a round, or charged together once
        every group of their round failed whole."""
        self._counts["failed"] += len(failed.root)
        new_dead = []
        for batch in np.unique(failed.batch).tolist():
            rows = failed.batch == batch
            roots, why = failed.at(rows), outcome.select(rows)
            group = self.rounds.group_of_batch.pop(batch, NO_GROUP)
            if len(roots.root) == 1:
                new_dead += self._retries.fail(roots, why, now_ms, alone=True)
            elif self.rounds.systematic(group):  # its round failed whole before
                new_dead += self._charge_together(roots, why, now_ms)
            elif self.rounds.failed(group):  # and so did every other group of its round
                taken = self._take_descendants(group)
                new_dead += self._charge_together(Roots.concat([roots, taken]), why, now_ms)
            else:
                self._split(roots, group, now_ms)
        return new_dead

    def take_group(
        self, now_ms: int, batch: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The records of the group due first, replayed in batch ``batch`` (``part``,
        ``offset``, ``attempt``), or None when no group is due; groups that no longer
        wait are forgotten."""
        waiting = self._retries.waiting
        taken = waiting.take_group(now_ms)
        if taken is not None:
            self.rounds.group_of_batch[batch] = taken[0]
        live = set(distinct(waiting.columns()[4]).tolist())
        self.rounds.prune(live | set(self.rounds.group_of_batch.values()), batch)
        return None if taken is None else taken[1:]

    def _split(self, roots: Roots, parent: int, now_ms: int) -> None:
        """Replay the suspects ``roots`` at once, uncharged, in a round of groups: as
        many as the module doc says."""
        retries, n = self._retries, len(roots.root)
        parts = ISOLATION_PARTS
        if parent != NO_GROUP:
            parts = max(2, min(ISOLATION_PARTS, 2 * self.rounds.failures(parent)))
        size = -(-n // parts)  # ceiling
        numbers = retries.new_groups(-(-n // size))
        groups = numbers[np.arange(n) // size]
        self.rounds.add(numbers.tolist(), parent)
        retries.waiting.add(roots.part, roots.offset, roots.attempt + 1, now_ms, groups)
        retries.uncharged.add(packed(roots.part, roots.offset))
        self._counts["replayed"] += n

    def _take_descendants(self, group: int) -> Roots:
        """The records waiting in the rounds that groups of ``group``'s round were split
        into (their round failed whole: they are not split further), as in-flight rows
        at the attempt they failed."""
        groups = self.rounds.descendants(group)
        part, offset, attempt = self._retries.waiting.take_groups(groups)
        self._retries.uncharged.add(packed(part, offset), -1)  # counted for a replay not made
        self._counts["replayed"] -= len(offset)
        zero = np.zeros(len(offset), np.int64)
        return Roots(zero, part, offset, attempt - 1, zero, zero)

    def _charge_together(self, roots: Roots, why: Outcomes, now_ms: int) -> list[DeadLetter]:
        """Every one of ``roots`` fails, charged; the replays wait together in one group
        (a batch of their own), dead letters go with the batch's first reason, saying
        that it was charged with the group's (it may quote another record's value)."""
        (group,) = self._retries.new_groups(1).tolist()
        self.rounds.add_systematic(group)
        first, n = why.first_reason, len(roots.root)
        log.warning(
            "ackstream: every group of %d records failed as a whole (%s): they are retried "
            "together after their backoff, not split further",
            n,
            first,
        )
        reason = first
        if n > 1:
            charged = f"charged with {n} records of a failing group"
            reason = f"{charged}; the group's first error: {first}" if first else charged
        why = Outcomes.repeat(BATCH_FAILED, reason, n)
        return self._retries.fail(roots, why, now_ms, group=group)


class Rounds:
    """Rounds of isolation in progress (see :class:`Isolation`): the groups a failed
    batch's suspects were split into, how many of each round failed as a whole, the
    group each planned batch replayed, and the groups whose round failed whole (their
    records replay together, charged). A few entries per group, kept in the source's
    offset (:meth:`snapshot`), so a restart goes on with its rounds: begun again, each
    group waiting would start a round of its own."""

    def __init__(self) -> None:
        #: the group a batch replayed, by the batch's number (see ``Tracker.batch``)
        self.group_of_batch: dict[int, int] = {}
        self._round: dict[int, int] = {}  # group -> its round (the round's first group)
        self._size: dict[int, int] = {}  # round -> its groups
        self._failed: dict[int, int] = {}  # round -> its groups failed as a whole
        self._children: dict[int, list[int]] = {}  # group -> the groups it was split into
        self._systematic: set[int] = set()

    def add(self, groups: list[int], parent: int) -> None:
        """A new round of ``groups``, split out of group ``parent`` (or of a batch of no
        group, :data:`~ackstream.sources.waiting.NO_GROUP`)."""
        first = groups[0]
        self._round.update(dict.fromkeys(groups, first))
        self._size[first], self._failed[first] = len(groups), 0
        if parent != NO_GROUP:
            self._children[parent] = groups

    def failed(self, group: int) -> bool:
        """Group ``group`` failed as a whole: whether every group of its round now has,
        and the round says the error is every record's (a first round, or one of
        :data:`ISOLATION_PARTS` groups)."""
        first = self._round.get(group)
        if first is None:
            return False
        self._failed[first] += 1
        if self._failed[first] < self._size[first]:
            return False
        return self._size[first] >= ISOLATION_PARTS or not self._split_from_a_group(first)

    def failures(self, group: int) -> int:
        """How many groups of ``group``'s round have failed as a whole (0: no round)."""
        first = self._round.get(group)
        return 0 if first is None else self._failed[first]

    def _split_from_a_group(self, first: int) -> bool:
        """Whether the round ``first`` was split out of a group (not a batch of none)."""
        return any(first in children for children in self._children.values())

    def descendants(self, group: int) -> list[int]:
        """The groups that the groups of ``group``'s round were split into, and theirs;
        the round is over."""
        first = self._round[group]
        stack = [g for g, r in self._round.items() if r == first]
        found: list[int] = []
        while stack:
            children = self._children.pop(stack.pop(), [])
            found += children
            stack += children
        for g in [g for g, r in self._round.items() if r == first]:
            del self._round[g]
        del self._size[first], self._failed[first]
        return found

    def add_systematic(self, group: int) -> None:
        self._systematic.add(group)

    def systematic(self, group: int) -> bool:
        """Whether ``group`` holds records whose round failed whole."""
        return group in self._systematic

    def snapshot(self, batch: int) -> dict[str, Any] | None:
        """What :meth:`restore` takes, JSON-able; None when no round is in progress.
        ``flying``: the group the batch ``batch`` (the last planned) replays."""
        if not (self._round or self._systematic):
            return None
        return {
            "round": [[g, r] for g, r in self._round.items()],
            "size": [[r, n] for r, n in self._size.items()],
            "failed": [[r, n] for r, n in self._failed.items()],
            "children": [[g, c] for g, c in self._children.items()],
            "systematic": sorted(self._systematic),
            "flying": self.group_of_batch.get(batch, NO_GROUP),
        }

    def restore(self, snapshot: Mapping[str, Any] | None, batch: int) -> None:
        """Rounds as :meth:`snapshot` gave them; the roots restored in flight, in batch
        ``batch``, are the ``flying`` group's."""
        if not snapshot:
            return
        self._round = {g: r for g, r in snapshot["round"]}
        self._size = {r: n for r, n in snapshot["size"]}
        self._failed = {r: n for r, n in snapshot["failed"]}
        self._children = {g: list(c) for g, c in snapshot["children"]}
        self._systematic = set(snapshot["systematic"])
        if snapshot.get("flying", NO_GROUP) != NO_GROUP:
            self.group_of_batch[batch] = snapshot["flying"]

    def prune(self, live: set[int], batch: int) -> None:
        """Forget groups that neither wait nor were split (their batch went through),
        rounds left with no group, and the groups of batches long planned."""
        for group in [g for g in self._round if g not in live and g not in self._children]:
            first = self._round.pop(group)
            if first not in self._round.values():
                self._size.pop(first, None)
                self._failed.pop(first, None)
        self._systematic &= live
        for old in [b for b in self.group_of_batch if b < batch - 1_000]:
            del self.group_of_batch[old]
