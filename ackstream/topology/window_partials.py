"""Partial aggregates: what a time window holds per window and key instead of raw rows.

Spark's windowed aggregation keeps, per (window, key), the partial state of each
aggregate in its state store; a time window with aggregates that can be merged does
the same. :func:`partials_of` reads each aggregate Column as Spark built it (its
function's name and arguments, asked of the Column's node, not parsed from text) and
gives a :class:`Partial`: the columns one batch's rows reduce to, how those merge
with what was held, and the value emitted when the window closes, cast to the type
Spark's own ``agg`` gives the same Column. Merged: ``count``, ``sum``, ``min``,
``max``, ``avg``/``mean`` (held as a sum and a count), ``first``/``last`` (by the
batch the value came in), ``collect_list`` and ``collect_set``. Anything else (a
``DISTINCT`` aggregate, a percentile, an expression over an aggregate such as
``sort_array(collect_list(x))``) gives None: the window then holds raw rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType

__all__ = ["FIRST_SINCE", "LAST_SINCE", "MERGEABLE", "Partial", "fitted", "partials_of"]

#: the first and the last batch a held partial row has rows of (``first``/``last``)
FIRST_SINCE, LAST_SINCE = "_since_first", "_since_last"


@dataclass(frozen=True)
class Partial:
    """One aggregate as held partials: ``parts`` (alias, Column) reduce a batch's rows
    of a window and key (their types are the partials'); ``merges`` (alias, Column)
    reduce held partial rows and ``rows``' one-row partials to one; ``final`` is the
    value emitted, named ``name``."""

    name: str
    parts: tuple[tuple[str, Column], ...]
    merges: tuple[tuple[str, Column], ...]
    final: Column
    #: per part, what one row contributes as a partial of its own (alias, Column): the
    #: merges take raw rows and held partial rows in one aggregation, one shuffle
    rows: tuple[tuple[str, Column], ...] = ()


def _same(fn: str) -> Callable[[str, list[Column]], tuple[Column, Column]]:
    """An aggregate whose partials merge by itself (min, max)."""
    return lambda p, args: (F.call_function(fn, *args), F.call_function(fn, F.col(p)))


def _summed(fn: str) -> Callable[[str, list[Column]], tuple[Column, Column]]:
    """An aggregate whose partials merge by their sum (count, sum)."""
    return lambda p, args: (F.call_function(fn, *args), F.sum(F.col(p)))


def _collected(distinct: bool) -> Callable[[str, list[Column]], tuple[Column, Column]]:
    def build(p: str, args: list[Column]) -> tuple[Column, Column]:
        merged = F.flatten(F.collect_list(F.col(p)))
        fn = "collect_set" if distinct else "collect_list"
        return F.call_function(fn, *args), F.array_distinct(merged) if distinct else merged

    return build


def _ordered(first: bool) -> Callable[[str, list[Column]], tuple[Column, Column]]:
    """first/last: the value of the earliest (latest) batch that had one."""

    def build(p: str, args: list[Column]) -> tuple[Column, Column]:
        since = F.col(FIRST_SINCE if first else LAST_SINCE)
        pick = F.min_by if first else F.max_by
        # a null value's batch is left out (min_by skips null orderings): with
        # ignorenulls the first non-null value wins, as first(x, true) says
        ordering = F.when(F.col(p).isNotNull(), since) if _ignores_nulls(args) else since
        return F.call_function("first" if first else "last", *args), pick(F.col(p), ordering)

    return build


def _one_row(fn: str, args: list[Column], star: bool) -> Column:
    """What one row contributes to ``fn``'s partial: a count its 1 (0 when an argument
    is null, as ``count`` skips it), a collect its value as a one-element array (none
    when null), any other aggregate the value itself."""
    if fn == "count":
        if star or not args:
            return F.lit(1)
        counted = args[0].isNotNull()
        for arg in args[1:]:
            counted = counted & arg.isNotNull()
        return F.when(counted, 1).otherwise(0)
    if fn in ("collect_list", "collect_set"):
        return F.when(args[0].isNotNull(), F.array(args[0]))
    return args[0]


def _ignores_nulls(args: list[Column]) -> bool:
    return len(args) > 1 and "true" in str(args[1]).lower()


_SIMPLE: dict[str, Callable[[str, list[Column]], tuple[Column, Column]]] = {
    "count": _summed("count"),
    "sum": _summed("sum"),
    "min": _same("min"),
    "max": _same("max"),
    "collect_list": _collected(False),
    "collect_set": _collected(True),
    "first": _ordered(True),
    "first_value": _ordered(True),
    "last": _ordered(False),
    "last_value": _ordered(False),
}
#: the aggregate functions a window holds as partials
MERGEABLE = (*_SIMPLE, "avg", "mean")


def fitted(column: Column, kind: DataType) -> Column:
    """``column`` cast to ``kind``: a sum of decimal sums widens, an average of
    integers is a double; an array is left as it is (its elements' nullability may
    differ, which a cast cannot change)."""
    return column if isinstance(kind, ArrayType) else column.cast(kind)


def _call(column: Column) -> tuple[str | None, str, bool, list[Any]]:
    """The alias (None: none), function name, distinct flag and argument nodes of an
    aggregate Column; ("", ...) when it is not a plain function call."""
    java: Any = column._jc  # noqa: SLF001 - PySpark has no API to read a Column's call
    node = java.node()
    alias = None
    if node.getClass().getSimpleName() == "Alias":
        names = node.name()
        alias = names.apply(0) if names.size() == 1 else None
        node = node.child()
    if node.getClass().getSimpleName() != "UnresolvedFunction":
        return alias, "", False, []
    args = node.arguments()
    return (
        alias,
        node.functionName().lower(),
        node.isDistinct(),
        [args.apply(i) for i in range(args.size())],
    )


def _is_star(node: Any) -> bool:
    return bool(node.getClass().getSimpleName() == "UnresolvedStar")


def partials_of(
    spark: SparkSession, rows: DataFrame, aggs: Sequence[Column]
) -> list[Partial] | None:
    """The aggregates ``aggs`` over ``rows`` as :class:`Partial` s, or None if one of
    them cannot be merged (see the module doc)."""
    jvm = spark._jvm  # noqa: SLF001 - to rebuild an argument Column from its node
    assert jvm is not None
    types = rows.groupBy().agg(*aggs).schema.fields  # Spark's names and types, no job
    partials = []
    for i, (agg, field) in enumerate(zip(aggs, types, strict=True)):
        _, fn, distinct, nodes = _call(agg)
        if distinct or fn not in MERGEABLE:
            return None
        star = any(_is_star(n) for n in nodes)
        if star and fn != "count":
            return None
        args = [] if star else [Column(jvm.org.apache.spark.sql.Column(n)) for n in nodes]
        kind, p = field.dataType, f"_p{i}"
        parts: tuple[tuple[str, Column], ...]
        merges: tuple[tuple[str, Column], ...]
        one: tuple[tuple[str, Column], ...]
        if fn in ("avg", "mean"):
            total, count = f"{p}_sum", f"{p}_count"
            parts = ((total, F.sum(args[0])), (count, F.count(args[0])))
            merges = ((total, F.sum(total)), (count, F.sum(count)))
            one = ((total, args[0]), (count, _one_row("count", args, False)))
            final = F.col(total) / F.col(count)
        else:
            part, merge = _SIMPLE[fn](p, [F.lit(1)] if star else args)
            parts, merges, final = ((p, part),), ((p, merge),), F.col(p)
            one = ((p, _one_row(fn, args, star)),)
        partials.append(Partial(field.name, parts, merges, fitted(final, kind), one))
    return partials
