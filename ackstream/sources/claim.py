"""A running source's claim on its consumer group, so two topologies never share one.

Two topologies given the same name share root ids, channel and consumer group: one
would commit offsets the other never processed. Each query therefore has an owner
id (made with its first offset, kept in every offset after, so a restart from the
checkpoint is the same owner) and writes it, with the time, into the metadata of
every commit; at least every ``heartbeat_ms`` it commits again and first reads the
group's commits. Another owner's claim younger than ``lease_ms`` stops it with an
error naming both. A query whose predecessor is gone may start once that claim is
older than the lease.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping

from ackstream.errors import AckstreamError
from ackstream.vocabulary.partition import Partition

__all__ = ["GroupClaim", "new_owner"]


def new_owner() -> str:
    """A new query's owner id. Random on purpose: it names a run, not a record (record
    ids are hashes, the same on every re-read); it is kept in the query's offsets."""
    return uuid.uuid4().hex[:12]


class GroupClaim:
    """This query's claim on ``group`` (see the module doc)."""

    def __init__(self, topology: str, group: str, owner: str, heartbeat_ms: int = 5_000):
        self.topology, self.group, self.owner = topology, group, owner
        self.heartbeat_ms, self.lease_ms = heartbeat_ms, 3 * heartbeat_ms
        self._beat_ms: int | None = None

    def stamp(self, metadata: str, now_ms: int) -> str:
        """Commit metadata (a JSON object, or empty) with this claim in it."""
        fields = json.loads(metadata) if metadata else {}
        fields.update(owner=self.owner, at=now_ms)
        return json.dumps(fields, separators=(",", ":"))

    def due(self, now_ms: int) -> bool:
        """Whether it is time to check the group and renew the claim (it is at first)."""
        return self._beat_ms is None or now_ms - self._beat_ms >= self.heartbeat_ms

    def check(self, committed: Mapping[Partition, tuple[int, str]], now_ms: int) -> None:
        """Raise if another owner claimed the group less than a lease ago; else this
        claim counts as renewed now. ``committed``: ``{tp: (offset, metadata)}``."""
        for _offset, metadata in committed.values():
            try:
                fields = json.loads(metadata) if metadata else {}
                other, at = fields.get("owner"), int(fields.get("at", 0))
            except (ValueError, TypeError, AttributeError):
                continue
            if other and other != self.owner and now_ms - at < self.lease_ms:
                raise AckstreamError(
                    f"topology {self.topology!r} (query {self.owner}): another query, "
                    f"{other}, committed to consumer group {self.group!r} "
                    f"{(now_ms - at) / 1000:.1f} s ago. Two topologies with one name settle "
                    "each other's records: give one another ackstream.topology, or stop the "
                    f"other (if it is gone, start again after {self.lease_ms / 1000:g} s)"
                )
        self._beat_ms = now_ms
