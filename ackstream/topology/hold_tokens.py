"""Hold tokens: a batch's roots wait for the windows that hold what they contributed.

A tracked time window whose aggregates merge (:mod:`ackstream.topology.
window_aggregates`) holds one partial aggregate per window and key, not the rows it
was given, so no row can keep its root's tree open. It holds tokens instead, one per
(stage, batch, window): the windows a batch's rows went into. A batch that leaves a
token open does not report its acked roots; their completions (runs of offsets, as
the batch would have written them) wait in the topology's token ledger until every
window that holds the batch has closed, and are written then, by the batch that
closes the last of them, after its sink has written the windows' rows. A root that
failed, was rejected or left its tree open elsewhere is reported by its own batch, as
before: a held contribution is not dropped when its root fails elsewhere, the root
replays and its replay may be counted again (Storm's windowed bolts: at least once).

A window's output row carries ``_group`` pointing at a token root of its own (a hash
of the stage and the window's end, never a record's root). A stage or sink that
fails or rejects the row sends that token root a ``FAIL`` or ``REJECT`` record; the
batch that closes the window turns it into the outcome of every root of every batch
the window held (:meth:`BatchTokens.completions`), so that their replays bring the
window's content back.

The ledger is one Arrow table per batch in ``<held folder>/_tokens/`` (a
:class:`~ackstream.storage.files.BatchFiles`): the waiting completions with the batch
each belongs to, and in its metadata the windows each batch still waits for. A batch
starts from the table of the newest earlier batch, so one that Spark runs again
waits for and releases the same tokens. Without a folder it stays in memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ackstream.storage.files import BatchFiles
from ackstream.vocabulary import ids
from ackstream.vocabulary.ranges import expand
from ackstream.vocabulary.records import (
    ACKED,
    COMPLETION_SCHEMA,
    FAIL,
    FAILED,
    REJECT,
    REJECTED,
)

__all__ = ["FOLDER", "BatchTokens", "HoldTokens", "token_root"]

#: the ledger's folder in the topology's held folder (no holding stage may be named so)
FOLDER = "_tokens"
_BATCH = "_held_batch"
_TOKENS = b"ackstream.tokens"
_SCHEMA = COMPLETION_SCHEMA.append(pa.field(_BATCH, pa.int64()))
_TAG = ids.hash_text("ackstream hold token")

Token = tuple[int, int]  #: (stage number, window end ms)
_LOST = "its window's rows were not written (the batch that closed it failed as a whole)"


def token_root(stage: int, end_ms: int) -> int:
    """The pseudo root a window's output rows name through ``_group``: its failure
    reaches the batch that closes the window, never the acker (see the module doc)."""
    return int(ids.hash_longs(np.int64(stage), np.int64(end_ms), seed=_TAG))


@dataclass
class _State:
    """The ledger after one batch: the completions waiting (a ``_held_batch`` column
    beside ``COMPLETION_SCHEMA``) and, per batch, the tokens it still waits for."""

    waiting: pa.Table
    tokens: dict[int, set[Token]] = field(default_factory=dict)

    @classmethod
    def empty(cls) -> _State:
        return cls(_SCHEMA.empty_table())

    def to_table(self) -> pa.Table:
        meta = {str(b): sorted(t) for b, t in self.tokens.items()}
        return self.waiting.replace_schema_metadata({_TOKENS: json.dumps(meta)})

    @classmethod
    def of_table(cls, table: pa.Table) -> _State:
        meta = json.loads((table.schema.metadata or {}).get(_TOKENS, b"{}"))
        tokens = {int(b): {(int(s), int(e)) for s, e in t} for b, t in meta.items()}
        return cls(table.replace_schema_metadata(None), tokens)


class HoldTokens:
    """A topology's token ledgers, by held folder (None: in memory)."""

    def __init__(self) -> None:
        self._memory: dict[int, _State] = {}

    def __getstate__(self) -> dict[str, object]:  # pickled with the topology: no state in memory
        return {"_memory": {}}

    def batch(self, folder: str | None, batch_id: int) -> BatchTokens:
        """The ledger as batch ``batch_id`` finds it (what the newest earlier batch
        left), read when a window first asks."""
        files = None if folder is None else BatchFiles(f"{folder.rstrip('/')}/{FOLDER}")
        return BatchTokens(batch_id, files, self._memory)


class BatchTokens:
    """One batch's view of the ledger: the tokens its windows hold and release, then
    what its completions become (:meth:`completions`)."""

    def __init__(self, batch_id: int, files: BatchFiles | None, memory: dict[int, _State]):
        self.batch_id, self._files, self._memory = batch_id, files, memory
        self._earlier: _State | None = None
        self._held: set[Token] = set()
        self._released: set[Token] = set()
        self._roots: dict[int, Token] = {}
        self._outcomes: dict[Token, tuple[str, str | None]] = {}

    @property
    def _state(self) -> _State:
        if self._earlier is None:
            if self._files is None:
                earlier = max((b for b in self._memory if b < self.batch_id), default=None)
                self._earlier = _State.empty() if earlier is None else self._memory[earlier]
            else:
                earlier = self._files.newest_before(self.batch_id)
                self._earlier = (
                    _State.empty()
                    if earlier is None
                    else _State.of_table(self._files.read(earlier))
                )
        return self._earlier

    def hold(self, stage: int, ends: Iterable[int]) -> None:
        """This batch's rows went into the windows of ``stage`` ending at ``ends``."""
        self._held.update((stage, int(end)) for end in ends)

    def release(self, stage: int, before: int | None, clock: int | None) -> list[int]:
        """The windows of ``stage`` that this batch closes (its clock moved from
        ``before`` to ``clock`` past their end) and some batch waits for: their ends,
        ascending; their token roots are known to :meth:`take_outcomes` from here on.
        A window waited for that an earlier batch closed was never written (that batch
        failed as a whole, after the window's store had let it go): the batches in it
        fail, so that their replays bring its content back."""
        if clock is None:
            return []
        waiting = {t for tokens in self._state.tokens.values() for t in tokens} | self._held
        ends = []
        for s, end in sorted(waiting):
            if s != stage or end > clock:
                continue
            self._released.add((s, end))
            if before is not None and end <= before:
                self._outcomes[(s, end)] = (FAILED, _LOST)
            else:
                ends.append(end)
                self._roots[token_root(s, end)] = (s, end)
        return ends

    def token_frame_rows(self, stage: int, ends: Iterable[int]) -> list[tuple[int, int]]:
        """``(token root, window end)`` of the windows ``ends`` of ``stage``."""
        return [(token_root(stage, end), int(end)) for end in ends]

    def take_outcomes(self, rest: pa.Table) -> pa.Table:
        """``rest`` (ack records) without the records of the token roots released here,
        which :meth:`completions` turns into the outcomes of the batches they held."""
        if not self._roots or not rest.num_rows:
            return rest
        mine = pc.is_in(rest.column("root"), value_set=pa.array(list(self._roots), pa.int64()))
        outcomes: dict[Token, tuple[str, str | None]] = {}
        for row in rest.filter(mine).to_pylist():
            token = self._roots[row["root"]]
            kind = REJECTED if row["kind"] == REJECT else FAILED if row["kind"] == FAIL else None
            if kind is not None and (token not in outcomes or kind == REJECTED):
                outcomes[token] = (kind, row["reason"])
        self._outcomes = outcomes
        return rest.filter(pc.invert(mine))

    def completions(self, done: pa.Table, now_ms: int) -> pa.Table:
        """What this batch reports of ``done`` (its completions, ``COMPLETION_SCHEMA``)
        and of the waiting ones: its acked roots wait while a window it went into stays
        open; the completions of batches whose windows all closed here come out acked,
        and those of batches in a window whose output row failed or was rejected come
        out with that outcome. Saves the ledger for the next batch."""
        if self._earlier is None and not self._held:  # no window asked: nothing changes
            return done
        waiting = self._state.waiting
        tokens = {b: set(t) for b, t in self._state.tokens.items()}
        if self._held:
            acked = pc.equal(done.column("status"), ACKED)
            mine = done.filter(acked)
            if mine.num_rows:
                batch = pa.array(np.full(mine.num_rows, self.batch_id), pa.int64())
                waiting = pa.concat_tables(
                    [waiting, mine.append_column(_BATCH, batch).cast(_SCHEMA)]
                )
                tokens[self.batch_id] = set(self._held)
                done = done.filter(pc.invert(acked))
        ended: set[int] = set()
        failed: dict[int, tuple[str, str | None]] = {}
        for b, waits in tokens.items():
            met = sorted(self._outcomes[t] for t in waits & self._released if t in self._outcomes)
            if met:  # a rejection wins: the record is dead-lettered, not replayed
                failed[b] = next((m for m in met if m[0] == REJECTED), met[0])
            waits -= self._released
            if met or not waits:
                ended.add(b)
        out = [done]
        if ended:
            leaving = pc.is_in(
                waiting.column(_BATCH), value_set=pa.array(sorted(ended), pa.int64())
            )
            out += _released(waiting.filter(leaving), failed, now_ms)
            waiting = waiting.filter(pc.invert(leaving))
        state = _State(waiting, {b: t for b, t in tokens.items() if b not in ended})
        if state.tokens != self._state.tokens or waiting.num_rows != self._state.waiting.num_rows:
            if self._files is None:
                self._memory[self.batch_id] = state
                for old in sorted(self._memory)[:-2]:
                    del self._memory[old]
            else:
                self._files.write(self.batch_id, state.to_table())
        return pa.concat_tables(out)


def _released(
    waiting: pa.Table, failed: dict[int, tuple[str, str | None]], now_ms: int
) -> list[pa.Table]:
    """The completions of batches whose windows all closed, completed at ``now_ms``:
    each batch's acked, unless a window's output row that held it failed or was
    rejected (then one row per root, with that outcome)."""
    out = []
    for batch in pc.unique(waiting.column(_BATCH)).to_pylist():
        rows = waiting.filter(pc.equal(waiting.column(_BATCH), batch)).drop_columns([_BATCH])
        waited = pc.subtract(now_ms, rows.column("completed_ms"))
        rows = _with(rows, "latency_ms", pc.add(rows.column("latency_ms"), waited).combine_chunks())
        rows = _with(rows, "completed_ms", np.full(rows.num_rows, now_ms, np.int64))
        if batch in failed:  # a run stands for acked offsets only: one row per root
            status, reason = failed[batch]
            rows = expand(rows.cast(COMPLETION_SCHEMA))
            why = "a window that held it " + ("was rejected" if status == REJECTED else "failed")
            rows = _with(rows, "status", [status] * rows.num_rows)
            rows = _with(rows, "reason", [f"{why}: {reason}" if reason else why] * rows.num_rows)
        out.append(rows.cast(COMPLETION_SCHEMA))
    return out


def _with(table: pa.Table, name: str, values: object) -> pa.Table:
    at = table.schema.get_field_index(name)
    return table.set_column(
        at, table.schema.field(name), pa.array(values, table.schema.field(name).type)
    )
