"""A time window that holds one partial aggregate per window and key, not raw rows.

What Spark's state store holds for ``groupBy(window(...), key).agg(...)``: each batch
reduces its rows to one partial row per (window, key) (:mod:`ackstream.topology.
window_partials`), merges it with the partial row held for that window and key, emits
the final aggregates of the windows its clock closes and keeps the rest. The held
store (:class:`~ackstream.topology.held_store.HeldStore`) writes the change: the
merged rows of the windows and keys the batch touched, and the ids of the versions
they replace or that closed. A held row's id hashes its key, its window and the last
batch that merged into it, so a batch Spark runs again writes the same ids.

Tracked, the rows' roots are not held at all: the batch holds a token per window its
rows went into, and its roots wait for those windows to close (:mod:`ackstream.
topology.hold_tokens`). An output row carries ``_group``, its window's token root, so
that a failure downstream fails the roots of every batch the window held.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType

from ackstream.topology.anchoring import GroupInput
from ackstream.topology.bolts import BatchContext, StageOutput
from ackstream.topology.held_store import (
    HOLD,
    KEPT,
    OUT,
    PIECE,
    WAS,
    ChangeLog,
    HeldState,
    HeldStore,
)
from ackstream.topology.hold_tokens import BatchTokens
from ackstream.topology.window_closing import WINDOW, Assigned, Closing
from ackstream.topology.window_partials import FIRST_SINCE, LAST_SINCE, Partial, fitted
from ackstream.vocabulary.lineage import GROUP, REASON, ROOT

__all__ = ["held_aggregates"]

_TOUCHED, _END = "_touched", "_window_end"


def held_aggregates(
    df: DataFrame,
    ctx: BatchContext,
    store: HeldStore,
    keys: Sequence[str | Column],
    partials: Sequence[Partial],
    closing: Closing,
    stage: str,
    number: int,
) -> StageOutput | None:
    """The batch ``df`` through window stage ``stage`` (``number``) holding ``partials``
    per window and key (see the module doc), its state in ``store``; None when
    ``closing`` holds rows, or the store holds rows saved before (the window then goes
    on holding rows). Tracked, ``ctx.tokens`` holds the batch's roots."""
    state = store.before(df.sparkSession, ctx.batch_id)
    if state is not None and state.rows is not None and LAST_SINCE not in state.rows.columns:
        return None  # a checkpoint whose window held rows before: it goes on holding rows
    clock = None if state is None else state.clock
    assigned = closing.assign(closing.stamp(df, ctx.now_ms, stage), clock, ctx.now_ms, stage)
    if assigned is None:
        return None
    merged, names, held_cols = _merged(assigned, state, keys, partials, ctx.batch_id)
    closes, after = assigned.closes, assigned.clock
    ends = _window_ends(state, assigned.ends)
    # no window held or written to closes (known on the driver): nothing is handed on,
    # the output is Spark's empty relation, and the sink's job reads nothing
    shut = ends is None or (after is not None and any(end <= after for end in ends))
    piece = F.when(closes, OUT).otherwise(KEPT) if shut else F.lit(KEPT)
    saved = (*(F.col(f"`{c}`") for c in (*held_cols, HOLD, WAS)), piece.alias(PIECE))
    changed = F.col(_TOUCHED) | closes if shut else F.col(_TOUCHED)
    handed = store.save_merged(
        ctx.batch_id,
        merged.select(*saved),
        merged.where(changed).select(*saved),
        HeldState(
            None,
            None if state is None else state.position,
            after,
            ChangeLog() if state is None else state.log,
            ends=None if ends is None else tuple(e for e in ends if after is None or e > after),
        ),
    )
    out = handed.select(
        *(F.col(f"`{n}`") for n in names), WINDOW, *(p.final.alias(p.name) for p in partials)
    )
    if ctx.tokens is None:
        return StageOutput(out)
    late = None if assigned.late is None else assigned.late.select(*df.columns, REASON)
    return _held_by_token(out, ctx.tokens, number, assigned, clock, late)


def _merged(
    assigned: Assigned,
    state: HeldState | None,
    keys: Sequence[str | Column],
    partials: Sequence[Partial],
    batch_id: int,
) -> tuple[DataFrame, list[str], tuple[str, ...]]:
    """The batch's rows merged with the held partials per (keys, window), each with
    the id of the version it replaces (``_was``); the keys' column names and the held
    columns."""
    batch = F.lit(batch_id).cast("long")
    types, names, columns = _shape(assigned.rows, keys, partials)
    held_cols = (*columns, FIRST_SINCE, LAST_SINCE)
    # the batch's rows as one-row partials, merged with the held ones in one
    # aggregation: Spark combines the rows before its one shuffle, as its own does
    rows = assigned.rows.select(
        *keys,
        WINDOW,
        *(fitted(c, types[n]).alias(n) for p in partials for n, c in p.rows),
        batch.alias(FIRST_SINCE),
        batch.alias(LAST_SINCE),
        F.lit(True).alias(_TOUCHED),
        F.lit(None).cast("long").alias(HOLD),
    )
    if state is not None and state.rows is not None:
        held = state.rows.select(*(F.col(f"`{c}`") for c in (*held_cols, HOLD)))
        held = held.withColumn(_TOUCHED, F.lit(False))
        rows = held.unionByName(rows)
    merged = (
        rows.groupBy(*names, WINDOW)
        .agg(
            *(fitted(c, types[n]).alias(n) for p in partials for n, c in p.merges),
            F.min(FIRST_SINCE).alias(FIRST_SINCE),
            F.max(LAST_SINCE).alias(LAST_SINCE),
            F.max(_TOUCHED).alias(_TOUCHED),
            F.max(F.when(~F.col(_TOUCHED), F.col(HOLD))).alias(WAS),
        )
        .withColumn(
            HOLD,
            F.xxhash64(*(F.col(f"`{n}`") for n in names), F.col(WINDOW), F.col(LAST_SINCE)),
        )
    )
    return merged, names, held_cols


_shapes: dict[tuple[str, ...], tuple[dict[str, DataType], list[str], list[str]]] = {}


def _shape(
    rows: DataFrame, keys: Sequence[str | Column], partials: Sequence[Partial]
) -> tuple[dict[str, DataType], list[str], list[str]]:
    """The partials' types, the keys' names and the partial row's columns, as one
    batch's aggregation of ``rows`` gives them: analysed once per input schema (an
    analysis of the batch's whole plan costs the driver more than the batch's rows)."""
    parts = [c.alias(n) for p in partials for n, c in p.parts]
    key = (rows.schema.json(), *map(str, keys), *map(str, parts))
    if key not in _shapes:
        shape = rows.groupBy(*keys, WINDOW).agg(*parts)
        types = {f.name: f.dataType for f in shape.schema.fields}
        _shapes[key] = (types, shape.columns[: len(keys)], shape.columns)
    return _shapes[key]


def _held_by_token(
    out: DataFrame,
    tokens: BatchTokens,
    number: int,
    assigned: Assigned,
    clock: int | None,
    late: DataFrame | None,
) -> StageOutput:
    """Tracked: the batch holds a token per window its rows went into, and the output
    rows of the windows it closes carry their window's token root as ``_group``."""
    tokens.hold(number, assigned.ends)
    closing_ends = tokens.release(number, clock, assigned.clock)
    groups = None  # no window closes: no output row, no frame to ship to the JVM
    if closing_ends:
        # literals in the plan, not Python rows: a frame made from rows is read back
        # through a Python worker in the job that joins it
        rows = ", ".join(f"({r}L, {e}L)" for r, e in tokens.token_frame_rows(number, closing_ends))
        frame = out.sparkSession.sql(f"SELECT * FROM VALUES {rows} AS tokens({ROOT}, {_END})")
        groups = GroupInput(frame, F.col(_END))
    end = F.unix_millis(F.col(f"{WINDOW}.end"))
    group = F.struct(F.lit(number).alias("stage"), end.alias("id"))
    out = out.withColumn(ROOT, F.lit(None).cast("long")).withColumn(GROUP, group)
    return StageOutput(out, rejected=late, groups=groups)


def _window_ends(state: HeldState | None, new: Sequence[int]) -> list[int] | None:
    """The ends of the windows the held rows and the batch's rows may be in, ascending
    (None: a state saved without them, so not known)."""
    if state is not None and state.ends is None:
        return None
    return sorted({*(() if state is None else state.ends or ()), *new})
