"""The XOR ledger: Storm's acker as a pure, vectorised step function.

``step(pending, records, now_ms, timeout_ms) -> (pending, completions)`` merges one
batch of ack records into a shard's pending table and returns the roots that
finished. No Spark, no clock: time is passed in, so the same code runs inside the
acker query, in tests and in benchmarks.

Per root the table keeps 40 bytes whatever the size of its tuple tree: the root
id, the XOR of every value seen, the source coordinates from the init record,
the init's timestamp (for complete latency) and a deadline. A root failed with a
reason before its init came also keeps the reason, beside the table, until it
is reported. Storm's rules:

- a root completes as *acked* when its value is 0 and its init arrived an odd
  number of times (a duplicated init cancels itself like any other record);
- a fail record marks it *failed* at once (fail wins over acks in the same or a
  later batch); it is reported once its init is known, with the first fail's
  reason; a reject record does the same and reports *rejected* (the source
  dead-letters it without a replay);
- records that arrive before the init are held (the init may come later);
- a root still pending at its deadline is *timed_out*, or *unknown* if its init
  never came (a stray ack: reported, and ignored by sources that do not track
  it); the deadline is one message timeout after the acker first saw the root,
  and a reset record extends it (Storm's RotatingMap and ``resetTimeout``);
- XOR makes order and batch splits irrelevant, and a record delivered twice
  cancels itself, so duplicates cost a timeout and a replay, never a false ack.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ackstream.vocabulary.records import (
    ACKED,
    FAIL,
    FAILED,
    INIT,
    REJECT,
    REJECTED,
    RESET,
    TIMED_OUT,
    UNKNOWN,
)

__all__ = ["PENDING_DTYPE", "Pending", "step", "combine", "notices", "MAX_TIMEOUT_MS"]

#: One pending root; packed, 40 bytes. Times are ms relative to ``Pending.epoch_ms``.
PENDING_DTYPE = np.dtype(
    [
        ("root", "<i8"),
        ("value", "<i8"),
        ("offset", "<i8"),
        ("partition", "<i4"),
        ("started", "<i4"),  # the init record's ts
        ("deadline", "<i4"),
        ("topic", "<i2"),  # index into Pending.topics, -1 before the init
        ("attempt", "u1"),
        ("flags", "u1"),
    ]
)
_INIT_ODD = np.uint8(1)  # the init arrived an odd number of times (a duplicate cancels it)
_FAILED = np.uint8(2)
_KNOWN = np.uint8(4)  # the init arrived at least once: coordinates and start time are set
_REJECTED = np.uint8(8)  # a reject record came (with _FAILED)

#: Relative times are int32 ms; the epoch moves forward long before they overflow.
_REBASE_AFTER_MS = 1 << 30
MAX_TIMEOUT_MS = 1 << 29
_I32_MIN, _I32_MAX = np.iinfo(np.int32).min, np.iinfo(np.int32).max

_STATUSES = np.array([ACKED, REJECTED, FAILED, TIMED_OUT, UNKNOWN], dtype=object)
_COMPLETION_COLUMNS = [
    "root",
    "status",
    "topic",
    "partition",
    "offset",
    "attempt",
    "latency_ms",
    "completed_ms",
    "reason",
]


@dataclass(frozen=True)
class Pending:
    """A shard's pending roots: a table sorted by root, its time epoch, topic names, and
    the reasons of the roots failed or rejected with one before their init came."""

    table: np.ndarray
    epoch_ms: int
    topics: tuple[str, ...] = field(default=())
    reasons: Mapping[int, str] = field(default_factory=dict)

    @classmethod
    def empty(cls, now_ms: int) -> Pending:
        return cls(np.empty(0, PENDING_DTYPE), int(now_ms), ())

    def __len__(self) -> int:
        return len(self.table)

    @property
    def nbytes(self) -> int:
        """Bytes the table takes in the shard's state (topic names excluded)."""
        return self.table.nbytes

    def to_state(self) -> tuple[int, str, bytes]:
        """The Spark state row: (epoch_ms, topic names joined by newlines, table bytes).

        Topic names travel as one string because pyspark 4.3 cannot read an array
        column in an ``applyInPandasWithState`` state schema (KeyError 'elementType');
        Kafka topic names never contain a newline."""
        return (self.epoch_ms, "\n".join(self.topics), self.table.tobytes())

    @classmethod
    def from_state(cls, row: tuple[int, str, bytes]) -> Pending:
        epoch_ms, topics, blob = row
        table = np.frombuffer(blob, dtype=PENDING_DTYPE).copy()
        return cls(table, int(epoch_ms), tuple(topics.split("\n")) if topics else ())

    def values(self) -> dict[int, int]:
        """Current XOR value of every pending root (for tests and debugging)."""
        return dict(zip(self.table["root"].tolist(), self.table["value"].tolist()))


@dataclass(frozen=True)
class Combined:
    """One row per root of a batch: XOR of values, OR of kinds, parity of inits, the
    init's coordinates, and its timestamp (the latest one when the root had no init)."""

    root: np.ndarray
    value: np.ndarray
    kind: np.ndarray
    init_odd: np.ndarray
    topic: np.ndarray  # object array, None where no init
    partition: np.ndarray
    offset: np.ndarray
    attempt: np.ndarray
    ts: np.ndarray
    reason: np.ndarray  # object array: a fail's or reject's reason, else None


def combine(records: pa.Table | pd.DataFrame) -> Combined:
    """Pre-combine a batch of ack records per root (order inside the batch is irrelevant).

    ``records`` is an Arrow table or a pandas frame of ack-record columns with no null
    root, value, kind or ts. Only the init rows' coordinates and the fail rows' reasons
    are read row by row: strings of the other rows are never converted."""
    root = _column(records, "root", np.int64)
    # not a stable sort: every per-root fold below (XOR, OR, max) ignores the order, and
    # numpy's default sort is about 2.5x faster on shuffled int64 ids (29 vs 74 ms at 670k)
    order = np.argsort(root)
    sorted_root = root[order]
    starts = np.flatnonzero(np.r_[True, sorted_root[1:] != sorted_root[:-1]])
    roots = sorted_root[starts]
    kinds = _column(records, "kind", np.int8)
    value = np.bitwise_xor.reduceat(_column(records, "value", np.int64)[order], starts)
    kind = np.bitwise_or.reduceat(kinds[order], starts)
    init_odd = np.bitwise_xor.reduceat(kinds[order] & INIT, starts) != 0
    record_ts = _column(records, "ts", np.int64)
    ts = np.maximum.reduceat(record_ts[order], starts)

    n = len(roots)
    topic = np.full(n, None, dtype=object)
    partition = np.zeros(n, np.int64)
    offset = np.zeros(n, np.int64)
    attempt = np.zeros(n, np.int64)
    init_rows = np.flatnonzero(kinds & INIT)
    if len(init_rows):
        group = np.searchsorted(roots, root[init_rows])
        topic[group] = _column(records, "topic", object, init_rows)
        partition[group] = _column(records, "partition", np.int64, init_rows)
        offset[group] = _column(records, "offset", np.int64, init_rows)
        attempt[group] = _column(records, "attempt", np.int64, init_rows)
        ts[group] = record_ts[init_rows]
    reason = np.full(n, None, dtype=object)
    given = np.flatnonzero((kinds & (FAIL | REJECT)) != 0)
    if len(given) and "reason" in _names(records):
        why = _column(records, "reason", object, given)
        known = pd.notna(why)
        reason[np.searchsorted(roots, root[given[known]])] = why[known]
    return Combined(roots, value, kind, init_odd, topic, partition, offset, attempt, ts, reason)


def _names(records: pa.Table | pd.DataFrame) -> list[str]:
    return records.column_names if isinstance(records, pa.Table) else list(records.columns)


def _column(
    records: pa.Table | pd.DataFrame,
    name: str,
    dtype: npt.DTypeLike,
    rows: np.ndarray | None = None,
) -> np.ndarray:
    """Column ``name`` of an Arrow table or a pandas frame as numpy (at ``rows`` only, if
    given); a null reads 0 in a number column and None in a string column."""
    if isinstance(records, pa.Table):
        column = records.column(name)
        if rows is not None:
            column = column.take(rows)
        if dtype is object:
            strings: np.ndarray = column.to_numpy(zero_copy_only=False)
            return strings.astype(object, copy=False)
        if column.null_count:
            column = pc.fill_null(column, 0)
        numbers: np.ndarray = column.to_numpy()
        return numbers.astype(dtype, copy=False)
    values: np.ndarray = records[name].to_numpy()
    values = values if rows is None else values[rows]
    return values if dtype is object else values.astype(dtype, copy=False)


def step(
    pending: Pending, records: pa.Table | pd.DataFrame | None, now_ms: int, timeout_ms: int
) -> tuple[Pending, pd.DataFrame]:
    """Merge ``records`` into ``pending`` at time ``now_ms``; return the new table and
    the completions (one row per finished root, columns as ``COMPLETION_SCHEMA``)."""
    pending = _rebased(pending, now_ms)
    now = now_ms - pending.epoch_ms
    table, topics = pending.table, pending.topics
    batch = None
    if records is not None and len(records):
        batch = combine(records)
        table, topics = _merge(table, topics, batch, now, timeout_ms, pending.epoch_ms)

    flags = table["flags"]
    failed = (flags & _FAILED) != 0
    acked = ~failed & ((flags & _INIT_ODD) != 0) & (table["value"] == 0)
    done = acked | (failed & ((flags & _KNOWN) != 0))
    expired = ~done & (table["deadline"] <= now)
    finished = done | expired
    out = table[finished]
    known = (out["flags"] & _KNOWN) != 0
    rejected = (out["flags"] & _REJECTED) != 0
    status = _STATUSES[
        np.select(
            [acked[finished], done[finished] & rejected, done[finished], known], [0, 1, 2, 3], 4
        )
    ]
    held = _held_reasons(pending.reasons, batch)
    reason = _reasons(out["root"], held)
    completions = _completions(out, status, reason, topics, pending.epoch_ms, now_ms)
    remaining = table[~finished]
    if not len(remaining):
        topics = ()  # nothing refers to a topic index any more
    if held:  # only roots still pending keep theirs
        still = np.isin(np.fromiter(held, np.int64, len(held)), remaining["root"])
        held = {root: why for (root, why), keep in zip(held.items(), still) if keep}
    return Pending(remaining, pending.epoch_ms, topics, held), completions


def _merge(
    table: np.ndarray,
    topics: tuple[str, ...],
    batch: Combined,
    now: int,
    timeout_ms: int,
    epoch_ms: int,
) -> tuple[np.ndarray, tuple[str, ...]]:
    has_init = (batch.kind & INIT) != 0
    topic_codes, topics = _topic_codes(batch.topic[has_init], topics)
    codes = np.full(len(batch.root), -1, np.int16)
    codes[has_init] = topic_codes
    started = np.clip(batch.ts - epoch_ms, _I32_MIN, _I32_MAX).astype(np.int32)
    deadline = np.int32(min(now + timeout_ms, _I32_MAX))

    pos = np.searchsorted(table["root"], batch.root)
    hit = pos < len(table)
    hit[hit] = table["root"][pos[hit]] == batch.root[hit]

    # roots already pending
    p = pos[hit]
    table["value"][p] ^= batch.value[hit]
    first_init = has_init[hit] & ((table["flags"][p] & _KNOWN) == 0)
    q = p[first_init]
    src = np.flatnonzero(hit)[first_init]
    table["topic"][q] = codes[src]
    table["partition"][q] = batch.partition[src]
    table["offset"][q] = batch.offset[src]
    table["attempt"][q] = np.minimum(batch.attempt[src], 255)
    table["started"][q] = started[src]
    table["flags"][p] = (table["flags"][p] | _flags(batch.kind[hit], False)) ^ np.where(
        batch.init_odd[hit], _INIT_ODD, 0
    ).astype(np.uint8)
    reset = (batch.kind[hit] & RESET) != 0
    table["deadline"][p[reset]] = deadline

    # roots seen for the first time
    new = ~hit
    fresh = np.empty(int(new.sum()), PENDING_DTYPE)
    fresh["root"] = batch.root[new]
    fresh["value"] = batch.value[new]
    fresh["offset"] = np.where(has_init[new], batch.offset[new], 0)
    fresh["partition"] = np.where(has_init[new], batch.partition[new], 0)
    fresh["started"] = np.where(has_init[new], started[new], now)
    fresh["deadline"] = deadline
    fresh["topic"] = codes[new]
    fresh["attempt"] = np.minimum(np.where(has_init[new], batch.attempt[new], 0), 255)
    fresh["flags"] = _flags(batch.kind[new], batch.init_odd[new])
    return np.insert(table, pos[new], fresh), topics


def _held_reasons(held: Mapping[int, str], batch: Combined | None) -> Mapping[int, str]:
    """``held`` with the reasons of the batch's fails and rejects added (a root keeps the
    reason it was first given). Few roots have one: a plain dict serves."""
    if batch is None:
        return held
    given = np.flatnonzero(pd.notna(batch.reason))
    if not len(given):
        return held
    added = dict(zip(batch.root[given].tolist(), batch.reason[given].tolist()))
    return {**added, **held}


def _reasons(roots: np.ndarray, held: Mapping[int, str]) -> np.ndarray:
    """The fail or reject reason of each finished root (None if it had none)."""
    out = np.full(len(roots), None, dtype=object)
    if held and len(roots):
        keys = np.fromiter(held, np.int64, len(held))
        given = np.flatnonzero(np.isin(roots, keys))
        out[given] = [held[root] for root in roots[given].tolist()]
    return out


def _flags(kind: np.ndarray, init_odd: npt.ArrayLike) -> np.ndarray:
    """Table flags for a batch's kinds; the parity bit is set from ``init_odd``."""
    flags = (
        np.where(kind & INIT, _KNOWN, 0)
        | np.where(kind & (FAIL | REJECT), _FAILED, 0)
        | np.where(kind & REJECT, _REJECTED, 0)
    )
    return (flags | np.where(init_odd, _INIT_ODD, 0)).astype(np.uint8)


def _topic_codes(names: np.ndarray, topics: tuple[str, ...]) -> tuple[np.ndarray, tuple[str, ...]]:
    """Index of each topic name in ``topics``, appending names not seen before."""
    if not len(names):
        return np.empty(0, np.int16), topics
    inverse, uniques = pd.factorize(names, use_na_sentinel=False)  # np.unique sorts: slower
    uniques = [str(t) for t in uniques]  # a null topic reads "None", as it always did
    known = {t: i for i, t in enumerate(topics)}
    added = [t for t in dict.fromkeys(uniques) if t not in known]
    topics = topics + tuple(added)
    if len(topics) > np.iinfo(np.int16).max:
        raise ValueError(f"an acker shard tracks more than {np.iinfo(np.int16).max} topics")
    known.update({t: len(topics) - len(added) + i for i, t in enumerate(added)})
    lookup = np.array([known[t] for t in uniques], dtype=np.int16)
    return lookup[inverse], topics


def _rebased(pending: Pending, now_ms: int) -> Pending:
    """Move the epoch to ``now_ms`` before relative times could overflow int32."""
    if now_ms - pending.epoch_ms < _REBASE_AFTER_MS:
        return pending
    if not len(pending.table):
        return Pending.empty(now_ms)
    shift = now_ms - pending.epoch_ms
    table = pending.table.copy()
    for name in ("started", "deadline"):
        table[name] = np.clip(table[name].astype(np.int64) - shift, _I32_MIN, _I32_MAX)
    return replace(pending, table=table, epoch_ms=int(now_ms))


def notices(pending: Pending, roots: npt.ArrayLike, status: str, now_ms: int) -> pd.DataFrame:
    """A ``status`` notice (no outcome, e.g. ``alive``) for each of ``roots`` that is
    pending, with its record's coordinates when its init came, so that the source finds
    it by them instead of by its id (columns as ``COMPLETION_SCHEMA``, no latency)."""
    table = pending.table
    out = table[np.isin(table["root"], np.asarray(roots, np.int64))]
    frame = _completions(out, status, None, pending.topics, pending.epoch_ms, now_ms)
    frame["latency_ms"] = pd.array([None] * len(out), dtype="Int64")
    return frame


def _completions(
    out: np.ndarray,
    status: np.ndarray | str,
    reason: np.ndarray | None,
    topics: tuple[str, ...],
    epoch_ms: int,
    now_ms: int,
) -> pd.DataFrame:
    unknown = (out["flags"] & _KNOWN) == 0  # never saw the init: no coordinates

    def nullable(values: np.ndarray, dtype: npt.DTypeLike) -> pd.arrays.IntegerArray:
        return pd.arrays.IntegerArray(np.asarray(values, dtype), mask=unknown.copy())

    names = np.array(list(topics) + [None], dtype=object)
    latency = now_ms - (epoch_ms + out["started"].astype(np.int64))
    return pd.DataFrame(
        {
            "root": out["root"],
            "status": status,
            "topic": names[np.where(unknown, -1, out["topic"])],
            "partition": nullable(out["partition"], np.int32),
            "offset": nullable(out["offset"], np.int64),
            "attempt": nullable(out["attempt"], np.int32),
            "latency_ms": nullable(latency, np.int64),
            "completed_ms": np.full(len(out), now_ms, np.int64),
            "reason": reason,
        },
        columns=_COMPLETION_COLUMNS,
    )
