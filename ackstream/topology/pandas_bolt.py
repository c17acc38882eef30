"""Pandas bolts: a Python function over chunks of a stage's rows, as a Storm bolt in
Python, with Storm's collector calls to fail or reject rows without raising.

The function runs in ``mapInPandas`` on the executors, the stage's only Python; its
output rows are anchored to their parent rows by index (Storm's ``emit(anchor,
values)``). A raised exception, or output that does not fit the declared schema, is
isolated to the rows at fault by calling the function again on parts of the chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ackstream.errors import StageError
from ackstream.sinks.continued import UpstreamResets
from ackstream.topology.anchoring import is_multi_anchored
from ackstream.topology.bolts import BatchContext, Stage, StageOutput
from ackstream.topology.modes import Mode
from ackstream.vocabulary.lineage import (
    EDGE,
    GROUP,
    LINEAGE_COLUMNS,
    REASON,
    REASON_LIMIT,
    ROOT,
)

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["BoltOutput", "BoltOutputError", "Collector", "PandasBoltStage"]

_ORDINAL, _ERROR, _REJECT, _DECLARED = "_ordinal", "_error", "_rejected", "_declared"


class Collector:
    """What a pandas bolt declared with ``collector=True`` is given beside its chunk, as
    a Storm bolt is given its ``OutputCollector``: emits are its output; the collector
    adds :meth:`fail` and :meth:`reject` (the way to fail records in Python: no
    exception, so no isolation) and :meth:`reset_timeout`.

    ``rows`` names rows of the chunk the call was given: a boolean mask of its length
    (``frame["n"] < 0``) or the chunk's index labels, which are its positions (an int,
    a list or array of them, ``frame.index[mask]``)."""

    def __init__(
        self,
        size: int,
        roots: pd.Series | None = None,
        resets: UpstreamResets | None = None,
        stage: str = "",
    ):
        self._size, self._roots, self._resets, self._stage = size, roots, resets, stage
        #: per row of the chunk: 0 goes on, FAILED or REJECTED (reject wins over fail)
        self.verdicts = np.zeros(size, np.int8)
        self.reasons = np.full(size, None, dtype=object)

    def fail(self, rows: npt.ArrayLike, reason: str) -> None:
        """Storm's ``collector.fail``: the roots of ``rows`` fail (replayed after a
        backoff, a retry counted; after the last retry dead-lettered with ``reason``,
        after the stage's name). Their outputs are dropped; the rest of the chunk goes
        on. Untracked (``tracking=False``) nothing replays: the rows' outputs are
        dropped, as ``fail_where`` drops its rows."""
        self._mark(rows, reason, _FAILED)

    def reject(self, rows: npt.ArrayLike, reason: str) -> None:
        """Dead-letter the roots of ``rows`` at once with ``reason``, without replays
        (as ``reject_where``): the records themselves are at fault. Their outputs are
        dropped; untracked, only that."""
        self._mark(rows, reason, _REJECTED)

    def _mark(self, rows: npt.ArrayLike, reason: str, verdict: int) -> None:
        at = self._positions(rows)
        self.verdicts[at] = np.maximum(self.verdicts[at], verdict)
        self.reasons[at] = f"{self._stage}: {reason}"[:REASON_LIMIT]

    def _positions(self, rows: npt.ArrayLike) -> np.ndarray:
        """The positions ``rows`` names (see the class doc), checked."""
        given = np.atleast_1d(np.asarray(rows))
        if given.dtype == bool and given.shape == (self._size,):
            return np.flatnonzero(given)
        if not given.size:
            return np.empty(0, np.int64)
        integers = given.ndim == 1 and given.dtype.kind in "iu"
        if integers and given.min() >= 0 and given.max() < self._size:
            return given.astype(np.int64)
        raise ValueError(
            f"collector rows must be a boolean mask of the chunk's {self._size} rows or "
            f"positions in 0..{self._size - 1} (its index), not {given[:5].tolist()!r}"
        )

    def reset_timeout(self, rows: npt.ArrayLike | None = None) -> int:
        """Storm's ``collector.resetTimeout``: restart the message timeout of the trees of
        ``rows`` (see the class doc; None: every row), for work that outlasts the
        timeout. Call it more often than the timeout. Returns how many trees were reset.

        Only trees that an upstream topology keeps open can time out while a batch
        runs (``Topology(..., continue_trees=True)``): a topology's own records wait
        for its batch, whose deadline bounds it instead (``batch_deadline_ms``), so
        elsewhere this resets nothing and returns 0."""
        if self._resets is None or self._roots is None:
            return 0
        roots = self._roots if rows is None else self._roots.iloc[np.atleast_1d(rows)]
        return self._resets.reset(int(r) for r in roots.dropna())

    def kept(self, parent: np.ndarray) -> np.ndarray:
        """Mask of output rows (by ``parent`` position, -1: unanchored) that go on: those
        of rows neither failed nor rejected."""
        going = parent < 0
        going[~going] = self.verdicts[parent[~going]] == 0
        return going


#: :attr:`Collector.verdicts` of a failed row and of a rejected one.
_FAILED, _REJECTED = 1, 2


class PandasBoltStage(Stage):
    """A bolt in pandas: ``fn(frame) -> frame`` gets a chunk of input rows (payload
    columns only, index 0..n-1) and returns the output rows, each indexed by the
    position of the row it is anchored to (Storm's ``emit(anchor, values)``): pandas
    operations such as ``explode``, boolean masks and ``assign`` keep that index by
    themselves. Index -1 emits an unanchored row. ``schema`` is the DDL of the output
    columns. With ``collector``, ``fn(frame, collector)`` is also given a
    :class:`Collector` for its chunk.

    The way to fail rows is the collector's :meth:`Collector.fail` and
    :meth:`Collector.reject`: those rows' roots fail or are dead-lettered, the rest of
    the chunk goes on, and ``fn`` is called once a chunk.

    Raising costs more. A failure is per row, as a Storm bolt fails single tuples: if
    ``fn`` raises, or returns output that does not fit ``schema`` (other columns, an
    index that is not a parent position, a value of another type), the chunk is split
    (``fn`` called again on its parts) until the rows at fault are found; only their
    roots fail, with a reason naming the stage and what was wrong, and the rest of the
    chunk goes on. An error every row meets (a service the bolt calls is down) fails
    the chunk's rows together after a few levels of parts, instead of calling ``fn``
    twice a row (see ``_run_bolt``)."""

    kind = "pandas_bolt"

    def __init__(
        self,
        number: int,
        fn: Callable[..., pd.DataFrame],
        schema: str,
        collector: bool = False,
        name: str | None = None,
    ):
        super().__init__(number, name)
        self.fn, self.schema, self.collector = fn, schema, collector
        self._output: BoltOutput | None = None  # the schema's columns, found on first use

    def declared_output(self, frame: DataFrame, mode: Mode) -> DataFrame:
        """The declared schema's columns beside ``frame``'s lineage: the function runs
        in a batch only."""
        lineage = [c for c in frame.columns if c in LINEAGE_COLUMNS]
        declared = F.from_json(F.lit(None).cast("string"), self.schema).alias(_DECLARED)
        return frame.select(*lineage, declared).select(*lineage, f"{_DECLARED}.*")

    def run(self, df: DataFrame, ctx: BatchContext) -> StageOutput:
        if is_multi_anchored(df) or GROUP in df.columns:
            raise StageError(self.name, "pandas bolts after an aggregation are not supported yet")
        payload = [c for c in df.columns if c not in LINEAGE_COLUMNS]
        fn, name, collector = self.fn, self.name, self.collector
        if self._output is None:  # once: each DataFrame call is a trip to the JVM
            self._output = BoltOutput.of(df.sparkSession.createDataFrame([], self.schema).schema)
        output = self._output
        if not ctx.mode.makes_ack_records:  # no fail record: bad output stops the query

            def plain(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
                for frame in frames:
                    marks = Collector(len(frame), stage=name)
                    given = (marks,) if collector else ()
                    out = fn(frame[payload].reset_index(drop=True), *given)
                    try:
                        out, parent = output.checked(out, len(frame))
                    except BoltOutputError as error:
                        raise StageError(name, str(error)) from None
                    yield out[marks.kept(parent)] if marks.verdicts.any() else out

            return StageOutput(df.mapInPandas(plain, self.schema))

        resets = ctx.resets if collector else None
        schema = (
            f"{self.schema}, {ROOT} long, {EDGE} long, {_ORDINAL} long, {_ERROR} string, "
            f"{_REJECT} boolean"
        )

        def tracked(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            try:
                for frame in frames:
                    chunk = frame.reset_index(drop=True)
                    yield _run_bolt(fn, chunk, payload, name, output, collector, resets)
            finally:
                if resets is not None:
                    resets.close()  # the channel's client, if a reset made one

        out = df.mapInPandas(tracked, schema).persist()  # the bolt runs once per batch
        caught = out.where(F.col(_ERROR).isNotNull()).withColumnRenamed(_ERROR, REASON)
        failed = caught.where(~F.col(_REJECT)).drop(_ORDINAL, _REJECT)
        rejected = caught.where(F.col(_REJECT)).drop(_ORDINAL, _REJECT)
        good = out.where(F.col(_ERROR).isNull())
        good = ctx.mode.anchoring.children(good, self.number, F.col(_ORDINAL))
        good = good.drop(_ORDINAL, _ERROR, _REJECT)
        return StageOutput(good, failed=failed, rejected=rejected, cached=(out,))


class BoltOutputError(ValueError):
    """A pandas bolt's output does not fit its declared schema; its rows fail."""


#: Arrow types of the Spark types whose values are checked before Spark converts them.
#: Other types (temporal, decimal, nested) are left to Spark's own conversion.
_CHECKED_TYPES = {
    "long": pa.int64(),
    "integer": pa.int32(),
    "short": pa.int16(),
    "byte": pa.int8(),
    "double": pa.float64(),
    "float": pa.float32(),
    "boolean": pa.bool_(),
    "string": pa.string(),
    "binary": pa.binary(),
}


@dataclass(frozen=True)
class BoltOutput:
    """The columns a pandas bolt declared, and the Arrow type of those whose values are
    checked (see :data:`_CHECKED_TYPES`): a value Spark could not convert would fail the
    whole task, and with it the batch, instead of the rows that made it."""

    columns: tuple[str, ...]
    types: tuple[tuple[str, pa.DataType], ...]

    @classmethod
    def of(cls, schema: StructType) -> BoltOutput:
        types = [(f.name, _CHECKED_TYPES.get(f.dataType.typeName())) for f in schema.fields]
        return cls(tuple(schema.names), tuple((c, t) for c, t in types if t is not None))

    def checked(self, out: pd.DataFrame, rows: int) -> tuple[pd.DataFrame, np.ndarray]:
        """``out`` and the parent position of each of its rows (-1: unanchored), or a
        :class:`BoltOutputError` saying what does not fit, for a chunk of ``rows`` rows."""
        if not isinstance(out, pd.DataFrame):
            raise BoltOutputError(f"returned a {type(out).__name__}, not a pandas DataFrame")
        extra = [c for c in out.columns if c not in self.columns]
        missing = [c for c in self.columns if c not in out.columns]
        if extra or missing:
            raise BoltOutputError(
                f"returned columns {list(out.columns)}, its schema has {list(self.columns)}"
                + (f": not in the schema {extra}" if extra else "")
                + (f": missing {missing}" if missing else "")
            )
        try:
            parent = np.asarray(out.index, dtype=np.int64)
        except (TypeError, ValueError):
            parent = np.array([-2])
        if len(parent) and (parent.min() < -1 or parent.max() >= rows):
            raise BoltOutputError(
                "the output rows must be indexed by the position of their parent row "
                "in the input chunk (or -1: unanchored)"
            )
        for column, arrow_type in self.types:
            values = out[column]
            if values.dtype != object and pa.from_numpy_dtype(values.dtype) == arrow_type:
                continue  # already of the declared type
            try:
                pa.Array.from_pandas(values, type=arrow_type, safe=False)
            except (pa.ArrowException, TypeError, ValueError) as error:
                raise BoltOutputError(
                    f"column {column!r} is declared {arrow_type}: " + str(error).splitlines()[0]
                ) from None
        return out, parent


def _run_bolt(
    fn: Callable[..., pd.DataFrame],
    frame: pd.DataFrame,
    payload: list[str],
    name: str,
    output: BoltOutput,
    collector: bool = False,
    resets: UpstreamResets | None = None,
) -> pd.DataFrame:
    """Run ``fn`` on ``frame`` (with ``collector``, and a :class:`Collector` of the rows
    it is given, resetting with ``resets``); isolate the rows it fails on (it raises,
    or its output does not fit the schema), eight parts of a failing chunk at a time;
    attach lineage. Every returned frame has the schema's columns, the failed and
    rejected rows' set to null, with ``_error`` their reason and ``_rejected`` which
    they are. Rows the collector failed or rejected in a call that returned are
    marked so at once, their outputs dropped: no isolation.

    Once every part has failed three levels deep, the error is taken to be every
    row's (a service every row calls is down): the chunk's rows fail together with
    it, in some 600 calls of ``fn`` for 10,000 rows where isolating each row took
    20,000. Rows at fault here and there (a few in a hundred) leave some part whole at
    one of those levels, so they are still found one by one."""
    calls = _BoltCalls(fn, frame, payload, name, output, collector, resets)
    if len(frame) and (error := calls.call(0, len(frame))) is not None:
        calls.isolate(0, len(frame), error, 0)
    roots = pd.array(frame[ROOT], dtype="Int64")  # null: an unanchored input row
    edges = pd.array(frame[EDGE], dtype="Int64")
    pieces = [] if not calls.outputs else [_anchored(calls, roots, edges)]
    empty = (np.empty(0, np.int64), np.empty(0, object), np.empty(0, bool))
    rows, errors, rejects = [
        np.concatenate([e, *(m[i] for m in calls.marked)]) for i, e in enumerate(empty)
    ]
    if len(rows) or not pieces:  # Spark wants the schema's columns in every frame
        # beside the failed rows' nulls the output's columns are objects (Arrow converts
        # them to the schema's types), as pandas will make them: it warns of the change
        pieces = [p.astype(dict.fromkeys(output.columns, object)) for p in pieces]
        failed = {ROOT: roots[rows], EDGE: edges[rows], _ORDINAL: np.zeros(len(rows), np.int64)}
        lineage = {**failed, _ERROR: errors, _REJECT: rejects}
        pieces.append(pd.DataFrame({**dict.fromkeys(output.columns), **lineage}))
    return pd.concat(pieces, ignore_index=True)


class _BoltCalls:
    """The calls of a pandas bolt on one chunk and its parts: the outputs of those that
    returned, with their rows' parent positions in the chunk, and the rows failed (by
    a raise, or by the collector) as (positions, reasons, rejected)."""

    def __init__(
        self,
        fn: Callable[..., pd.DataFrame],
        frame: pd.DataFrame,
        payload: list[str],
        name: str,
        output: BoltOutput,
        collector: bool,
        resets: UpstreamResets | None,
    ):
        self.fn, self.frame, self.name, self.output = fn, frame, name, output
        self.collector, self.resets = collector, resets
        self.given_columns = frame[payload]
        self.outputs: list[tuple[pd.DataFrame, np.ndarray]] = []
        self.marked: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def call(self, lo: int, hi: int) -> Exception | None:
        """``fn`` on rows ``[lo, hi)``: its output kept, or its error."""
        chunk = self.given_columns.iloc[lo:hi].reset_index(drop=True)
        roots = self.frame[ROOT].iloc[lo:hi].reset_index(drop=True) if self.collector else None
        marks = Collector(hi - lo, roots, self.resets, self.name)
        try:
            given = [marks] if self.collector else []
            out, parent = self.output.checked(self.fn(chunk, *given), hi - lo)
        except Exception as error:  # a user bolt's error fails its rows' roots
            return error
        if marks.verdicts.any():
            keep = marks.kept(parent)
            out, parent = out[keep], parent[keep]
            at = np.flatnonzero(marks.verdicts)
            self.marked.append((at + lo, marks.reasons[at], marks.verdicts[at] == _REJECTED))
        self.outputs.append((out, np.where(parent >= 0, parent + lo, -1)))
        return None

    def isolate(self, lo: int, hi: int, error: Exception, whole_levels: int) -> None:
        """Rows ``[lo, hi)`` failed together with ``error``; ``whole_levels``: how many
        levels above every part failed too."""
        if hi - lo == 1 or whole_levels >= EVERY_ROW_LEVELS:
            reasons = np.full(hi - lo, _reason(self.name, error), dtype=object)
            self.marked.append((np.arange(lo, hi), reasons, np.zeros(hi - lo, bool)))
            return
        cuts = np.linspace(lo, hi, min(CHUNK_SPLIT_PARTS, hi - lo) + 1).astype(int).tolist()
        parts = [(a, b, self.call(a, b)) for a, b in zip(cuts, cuts[1:])]
        every = all(e is not None for _, _, e in parts)
        for a, b, e in parts:
            if e is not None:
                self.isolate(a, b, e, whole_levels + 1 if every else 0)


def _anchored(
    calls: _BoltCalls,
    roots: pd.api.extensions.ExtensionArray,
    edges: pd.api.extensions.ExtensionArray,
) -> pd.DataFrame:
    """The outputs of the calls that returned, put together once (isolating rows makes a
    thousand outputs a chunk), each row with its parent's root and edge and its ordinal
    among its siblings."""
    made = [o for o, _ in calls.outputs]
    if calls.marked and len({tuple(o.dtypes.items()) for o in made}) > 1:
        # beside failed rows each call's values stay as it made them (see below):
        # concatenated first, a column of ints and floats would be floats
        made = [o.astype(dict.fromkeys(calls.output.columns, object)) for o in made]
    out = pd.concat(made, ignore_index=True)
    parent = np.concatenate([p for _, p in calls.outputs])
    anchored = parent >= 0
    # a row's children are numbered from 0; the unanchored rows of each call apart
    call_of = np.repeat(np.arange(len(calls.outputs)), [len(p) for _, p in calls.outputs])
    siblings = np.where(anchored, parent, -1 - call_of)
    ordinal = pd.Series(siblings).groupby(siblings).cumcount().to_numpy(np.int64)
    safe = np.where(anchored, parent, 0)
    root, edge = roots[safe].copy(), edges[safe].copy()
    root[~anchored] = pd.NA
    edge[~anchored] = pd.NA
    return out.assign(**{ROOT: root, EDGE: edge, _ORDINAL: ordinal, _ERROR: None, _REJECT: False})


#: A failing chunk of a pandas bolt is tried again in this many parts.
CHUNK_SPLIT_PARTS = 8
#: Levels of parts that all failed after which a bolt's error is every row's.
EVERY_ROW_LEVELS = 3


def _reason(name: str, error: Exception) -> str:
    """The reason a row fails with: the stage, then what went wrong."""
    what = str(error) if isinstance(error, BoltOutputError) else f"{type(error).__name__}: {error}"
    return f"{name}: {what}"[:REASON_LIMIT]
