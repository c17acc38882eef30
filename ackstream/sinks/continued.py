"""Tuple trees that continue in another process, through a Kafka topic.

Storm lets a tuple tree span workers; ackstream lets it span processes. A
``KafkaSink(..., continue_trees=True)`` writes each output message with its
lineage as headers and leaves its trees open: the message is a new tuple of every
tree its row was anchored to, with a fresh edge id, and the batch sends the ack
record ``(root, edge)`` of each such pair to the acker, so those roots stay pending
(their XOR is not 0) until whoever consumes the message acks the same pairs. The
upstream offset is committed only then; a fail, or no ack within the message
timeout, replays the record from the upstream topic.

Headers of a continued message:

- ``ackstream.roots``: the roots, 8 bytes each, big-endian signed (an aggregate's
  row has several);
- ``ackstream.edge``: the message's edge id, 8 bytes, big-endian signed.

Edge ids are random 64-bit numbers, never 0 (an edge 0 would add nothing to a
root's XOR, and its tree would complete without the downstream ack). They are not
hashes of coordinates as the spout's are: a sink's write that runs again writes
new messages, which must not be acked by the acks of the first ones.

:class:`TreeClient` is the downstream side for a plain Python consumer: it reads
the headers of a consumed message and writes its ack or fail to the upstream
topology's channel. A message without the headers is not part of any tree: the
client says so (returns 0) and writes nothing.

A downstream ackstream topology continues the trees with
``Topology(name, spark, upstream_channel, continue_trees=True)``: its source reads
the topic untracked (its own offsets are committed as Spark runs their batches, as
Storm's workers do not track a tuple's transfer) and with headers; its rows keep
root ids of their own, so that stages, aggregates and the batch's ledger work as
they always do, and :func:`translate` maps each batch's records from those local
roots onto the upstream trees named by the headers before they go to the upstream
channel. A record without the headers is processed untracked, as Storm's
unanchored tuple: nothing acks, fails or replays it (the batch logs how many).

Such a topology may write the trees on with a continuing sink of its own: its
messages then name the upstream roots, not its local ones, so any number of
processes continue the first topology's trees, each acking on that topology's
channel (``ackstream.topology.batch.with_upstream_roots``).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from ackstream.vocabulary.clock import Clock, now_ms
from ackstream.vocabulary.records import ACK, ACK_RECORD_SCHEMA, FAIL, INIT, RESET, ack_table

__all__ = [
    "EDGE_HEADER",
    "ROOTS_HEADER",
    "Lineage",
    "TreeClient",
    "UpstreamResets",
    "continued_acks",
    "lineage_headers",
    "lineage_of",
    "mint_edges",
    "translate",
]

ROOTS_HEADER = "ackstream.roots"
EDGE_HEADER = "ackstream.edge"

Lineage = tuple[tuple[int, ...], int]  #: (roots, edge) of one continued message


class AckWriter(Protocol):
    """What a continued message's acks are written to: the upstream topology's channel
    (a :class:`~ackstream.channels.base.Channel`, which sinks do not import)."""

    def write_acks(self, records: pa.Table) -> None: ...

    def close(self) -> None: ...


def mint_edges(n: int) -> np.ndarray:
    """``n`` random, non-zero 64-bit edge ids (int64), from the OS's random source."""
    rng = np.random.default_rng(secrets.randbits(128))
    edges = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, n, dtype=np.int64)
    while not edges.all():  # 0 adds nothing to a XOR: draw again (p = n / 2**64)
        zero = edges == 0
        edges[zero] = rng.integers(1, np.iinfo(np.int64).max, int(zero.sum()), dtype=np.int64)
    return edges


def lineage_headers(roots: Sequence[int], edge: int) -> list[tuple[str, bytes]]:
    """The Kafka headers of a message that continues the trees ``roots`` as ``edge``."""
    return [
        (ROOTS_HEADER, b"".join(int(r).to_bytes(8, "big", signed=True) for r in roots)),
        (EDGE_HEADER, int(edge).to_bytes(8, "big", signed=True)),
    ]


def lineage_of(headers: Iterable[tuple[str, bytes]] | None) -> Lineage | None:
    """``(roots, edge)`` from a message's headers (kafka-python's ``(key, value)``
    pairs), or None when they are missing or malformed (not a continued message)."""
    found = dict(headers or ())
    roots, edge = found.get(ROOTS_HEADER), found.get(EDGE_HEADER)
    if not isinstance(roots, bytes) or not isinstance(edge, bytes):
        return None
    if len(edge) != 8 or not roots or len(roots) % 8:
        return None
    decoded = tuple(
        int.from_bytes(roots[i : i + 8], "big", signed=True) for i in range(0, len(roots), 8)
    )
    return decoded, int.from_bytes(edge, "big", signed=True)


def continued_acks(
    lineages: Sequence[Lineage], kind: int, now: int, reason: str | None = None
) -> pa.Table:
    """Ack records for continued messages: per (root, edge) pair an ``ACK`` whose value
    is the edge, or with ``kind=FAIL`` a fail of each root with ``reason``."""
    roots = np.array([r for rs, _ in lineages for r in rs], np.int64)
    edges = np.array([edge for rs, edge in lineages for _ in rs], np.int64)
    return ack_table(roots, edges if kind == ACK else np.zeros_like(edges), kind, now, reason)


def translate(records: pa.Table, local: dict[int, Lineage], now: int) -> pa.Table:
    """A downstream batch's ack records (pre-combined: one per local root) as records of
    the upstream trees: a local root continues ``local[root] = (roots, edge)``, and each
    of its records goes to every upstream root, its init standing for the ack of the
    incoming message (its value XOR the edge). A finished local tree (value 0) thus
    acks the message; one left open keeps the upstream roots open as well; a fail or
    reject fails or rejects them. Records of local roots with no lineage are dropped:
    nothing upstream tracks them."""
    roots, values, kinds, reasons = [], [], [], []
    for row in records.select(["root", "value", "kind", "reason"]).to_pylist():
        lineage = local.get(row["root"])
        if lineage is None:
            continue
        upstream, edge = lineage
        value = row["value"] ^ (edge if row["kind"] & INIT else 0)
        for root in upstream:
            roots.append(root)
            values.append(value)
            kinds.append(row["kind"] & ~INIT)
            reasons.append(row["reason"])
    table = ack_table(roots, values, ACK, now)
    kind, reason = (
        ACK_RECORD_SCHEMA.get_field_index("kind"),
        ACK_RECORD_SCHEMA.get_field_index("reason"),
    )
    table = table.set_column(kind, ACK_RECORD_SCHEMA.field(kind), pa.array(kinds, pa.int8()))
    return table.set_column(reason, ACK_RECORD_SCHEMA.field(reason), pa.array(reasons, pa.string()))


@dataclass(frozen=True)
class UpstreamResets:
    """Storm's ``resetTimeout`` from a stage of a topology that continues upstream trees:
    restarts the message timeout of the upstream trees its local roots continue
    (``lineage``, as :func:`translate` reads it), on the upstream ``channel``. It is
    pickled to wherever the stage runs; :meth:`close` releases the channel's client."""

    channel: Any  # an AckWriter; Any while the topology passes its channel as optional
    lineage: Mapping[int, Lineage]
    clock: Clock = now_ms

    def reset(self, local_roots: Iterable[int]) -> int:
        """Reset the upstream trees of ``local_roots`` (unknown ones are skipped: their
        rows are untracked); returns how many upstream trees were reset."""
        found = (self.lineage.get(root) for root in local_roots)
        lineages = [lineage for lineage in found if lineage is not None]
        if not lineages:
            return 0
        self.channel.write_acks(continued_acks(lineages, RESET, self.clock()))
        return len({root for roots, _ in lineages for root in roots})

    def close(self) -> None:
        self.channel.close()


class TreeClient:
    """Ack or fail, from any Python process, messages a ``continue_trees`` sink wrote.

    ``channel`` is the upstream topology's channel (``KafkaChannel(bootstrap, name)``
    with its topology's name, or its ``LocalChannel``). Storm's rules hold: ack a
    message once its work is done; fail it to have its upstream records replayed;
    a message neither acked nor failed within the topology's message timeout times
    its roots out (they are replayed too). An ack delivered twice cancels itself, so
    it costs a timeout and a replay, never a false ack (or, written after its tree
    completed, the acker reports it as ``unknown`` and nothing else happens).

    >>> client = TreeClient(channel)                        # doctest: +SKIP
    >>> for message in consumer:                            # doctest: +SKIP
    ...     client.ack(message) if handle(message) else client.fail(message, "bad")

    A message whose work outlasts the message timeout stays alive with
    :meth:`reset_timeout`, called more often than the timeout.
    """

    def __init__(self, channel: AckWriter, clock: Clock = now_ms):
        self.channel, self.clock = channel, clock

    def ack(self, *messages: object) -> int:
        """Ack ``messages`` (kafka-python ``ConsumerRecord``s, or anything with
        ``headers``); returns how many carried lineage (the others are ignored)."""
        return self._write(messages, ACK, None)

    def fail(self, *messages: object, reason: str = "failed downstream") -> int:
        """Fail the trees of ``messages``: their upstream records are replayed (or
        dead-lettered after ``maxRetries``, with ``reason``)."""
        return self._write(messages, FAIL, reason)

    def reset_timeout(self, *messages: object) -> int:
        """Restart the message timeout of the trees of ``messages`` (Storm's
        ``collector.resetTimeout``): for work that takes longer than the timeout, call
        it more often than the timeout, then ack or fail as usual. The acker extends
        the roots' deadlines and tells the upstream source, which restarts its own."""
        return self._write(messages, RESET, None)

    def _write(self, messages: tuple[object, ...], kind: int, reason: str | None) -> int:
        found = (lineage_of(getattr(m, "headers", None)) for m in messages)
        lineages = [lineage for lineage in found if lineage is not None]
        if lineages:
            self.channel.write_acks(continued_acks(lineages, kind, self.clock(), reason))
        return len(lineages)
