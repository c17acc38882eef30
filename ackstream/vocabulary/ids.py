"""64-bit root and edge ids, derived by hash so that a re-read gives the same ids.

Storm draws ids at random; we cannot, because ``read()`` may run again for the same
offsets after a restart and must produce the same rows. Every id is Spark's
``xxhash64`` (XXH64, seed 42, columns chained) of the coordinates that make it
unique, and this module computes it both in numpy (for Arrow batches in the source
and the pure ledger) and as a Spark Column (for bolt stages running in the JVM).
The two are equal bit for bit; ``tests/test_ids.py`` holds them to it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = [
    "SEED",
    "hash_longs",
    "hash_text",
    "root_ids",
    "partition_seeds",
    "spout_edges",
    "child_edges",
    "spark_root_id",
    "spark_child_edge",
    "shard_of",
    "content_id",
]

SEED = 42  # Spark's xxhash64 seed

#: A Spark id's input: a Column, a column's name, or a whole number (a literal).
ColumnLike: TypeAlias = "Column | str | int"

_P1 = 0x9E3779B185EBCA87
_P2 = 0xC2B2AE3D27D4EB4F
_P3 = 0x165667B19E3779F9
_P4 = 0x85EBCA77C2B2AE63
_P5 = 0x27D4EB2F165667C5
_M64 = (1 << 64) - 1

#: Stage number reserved for the spout tuple of a root (bolt stages start at 1).
SPOUT_STAGE = 0


def _rotl_in_place(x: np.ndarray, r: int, spare: np.ndarray) -> None:
    np.right_shift(x, np.uint64(64 - r), out=spare)
    x <<= np.uint64(r)
    x |= spare


def _hash_long(values: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """XXH64 of one 8-byte value per row (Spark's ``XXH64.hashLong``), uint64 in and out;
    written in place over two arrays (the rows are millions: each temporary costs)."""
    lane = values * np.uint64(_P2)
    spare = np.empty_like(lane)
    _rotl_in_place(lane, 31, spare)
    lane *= np.uint64(_P1)
    h = seed + np.uint64(_P5 + 8)
    h ^= lane
    _rotl_in_place(h, 27, spare)
    h *= np.uint64(_P1)
    h += np.uint64(_P4)
    for shift, prime in ((33, _P2), (29, _P3), (32, None)):  # the final mix
        np.right_shift(h, np.uint64(shift), out=spare)
        h ^= spare
        if prime is not None:
            h *= np.uint64(prime)
    return h


def hash_longs(*columns: npt.ArrayLike, seed: int | np.ndarray = SEED) -> np.ndarray:
    """``xxhash64(c1, c2, ...)`` over int64 columns (scalars broadcast), as int64.

    ``seed`` may be an int or an int64 array (one seed per row), which is how a
    string hashed by :func:`hash_text` is chained in front of integer columns.
    """
    arrays = [np.asarray(c, dtype=np.int64) for c in columns]
    n = np.broadcast_shapes(*(a.shape for a in arrays), np.shape(seed))
    rows = n or (1,)  # a scalar as one row: hashed in place
    h = np.broadcast_to(np.asarray(seed, dtype=np.int64), rows).view(np.uint64).copy()
    with np.errstate(over="ignore"):
        for a in arrays:
            h = _hash_long(np.broadcast_to(a, rows).view(np.uint64), h)
    return h.view(np.int64).reshape(n)


def _round(acc: int, lane: int) -> int:
    acc = (acc + lane * _P2) & _M64
    acc = ((acc << 31) | (acc >> 33)) & _M64
    return (acc * _P1) & _M64


def _merge(acc: int, val: int) -> int:
    acc ^= _round(0, val)
    return (acc * _P1 + _P4) & _M64


def hash_text(text: str, seed: int = SEED) -> int:
    """``xxhash64(text)`` of a UTF-8 string with the given seed, as a signed int64.

    Scalar and pure Python: it hashes names (sources, topics, stages), never rows.
    """
    data = text.encode("utf-8")
    n = len(data)
    seed &= _M64
    i = 0
    if n >= 32:
        v = [(seed + _P1 + _P2) & _M64, (seed + _P2) & _M64, seed, (seed - _P1) & _M64]
        while i + 32 <= n:
            for lane in range(4):
                v[lane] = _round(v[lane], int.from_bytes(data[i : i + 8], "little"))
                i += 8
        h = 0
        for lane, r in zip(v, (1, 7, 12, 18)):
            h = (h + (((lane << r) | (lane >> (64 - r))) & _M64)) & _M64
        for lane in v:
            h = _merge(h, lane)
    else:
        h = (seed + _P5) & _M64
    h = (h + n) & _M64
    while i + 8 <= n:
        h ^= _round(0, int.from_bytes(data[i : i + 8], "little"))
        h = ((((h << 27) | (h >> 37)) & _M64) * _P1 + _P4) & _M64
        i += 8
    if i + 4 <= n:
        h ^= (int.from_bytes(data[i : i + 4], "little") * _P1) & _M64
        h = ((((h << 23) | (h >> 41)) & _M64) * _P2 + _P3) & _M64
        i += 4
    while i < n:
        h ^= (data[i] * _P5) & _M64
        h = ((((h << 11) | (h >> 53)) & _M64) * _P1) & _M64
        i += 1
    h ^= h >> 33
    h = (h * _P2) & _M64
    h ^= h >> 29
    h = (h * _P3) & _M64
    h ^= h >> 32
    return h - (1 << 64) if h >= 1 << 63 else h


def root_ids(
    source: str,
    topic: str | npt.ArrayLike,
    partition: npt.ArrayLike,
    offset: npt.ArrayLike,
    attempt: npt.ArrayLike,
) -> np.ndarray:
    """Root id of each upstream record: ``xxhash64(source, topic, partition, offset, attempt)``.

    ``topic`` is one string or an array of strings (hashed once per distinct value).
    A replay (attempt + 1) of the same offset gets a new root, as in Storm.
    """
    source_seed = hash_text(source)
    seed: int | np.ndarray
    if isinstance(topic, str):
        seed = hash_text(topic, source_seed)
    else:
        names, codes = np.unique(np.asarray(topic, dtype=object).astype(str), return_inverse=True)
        seeds = np.array([hash_text(t, source_seed) for t in names], dtype=np.int64)
        seed = seeds[codes.reshape(-1)] if len(names) else np.empty(0, np.int64)
    return hash_longs(partition, offset, attempt, seed=seed)


def partition_seeds(source: str, topics: Iterable[str], partitions: npt.ArrayLike) -> np.ndarray:
    """``xxhash64(source, topic, partition)`` of each pair given: what a root id
    (:func:`root_ids`) goes on hashing with its offset and attempt, as
    ``hash_longs(offset, attempt, seed=...)``; so the ids of millions of records of a
    few partitions hash that prefix once a partition."""
    source_seed = hash_text(source)
    seeds = np.array([hash_text(t, source_seed) for t in topics], dtype=np.int64)
    return hash_longs(partitions, seed=seeds)


def spout_edges(roots: npt.ArrayLike) -> np.ndarray:
    """Edge id of the spout tuple of each root (one spout tuple per upstream record)."""
    return child_edges(roots, SPOUT_STAGE, 0)


def child_edges(
    parent_edges: npt.ArrayLike, stage: npt.ArrayLike, ordinal: npt.ArrayLike
) -> np.ndarray:
    """Edge id of a child tuple: ``xxhash64(parent edge, stage, ordinal)``.

    ``ordinal`` numbers the children of one parent within a stage, so that the
    children of an explode are distinct and the same on every re-run.
    """
    return hash_longs(parent_edges, stage, ordinal)


def shard_of(roots: npt.ArrayLike, ackers: int) -> np.ndarray:
    """The acker shard that owns each root, as Spark's ``pmod(root, ackers)``."""
    return np.mod(np.asarray(roots, dtype=np.int64), ackers)


def content_id(*columns: npt.ArrayLike, seed: int | np.ndarray = SEED) -> str:
    """A name for a set of rows: the wrapping sum of their row hashes, as 16 hex digits.

    Order-independent, and unlike XOR a row repeated inside the set still counts, so
    the same rows written again (a batch re-run after a crash) get the same name and
    replace the earlier file instead of duplicating it.
    """
    rows = hash_longs(*columns, seed=seed).view(np.uint64)
    return f"{int(rows.sum(dtype=np.uint64)):016x}"


# --- the same ids as Spark Columns -------------------------------------------------


def spark_root_id(
    source: str,
    topic: ColumnLike = "topic",
    partition: ColumnLike = "partition",
    offset: ColumnLike = "offset",
    attempt: ColumnLike = "attempt",
) -> Column:
    """Spark Column equal to :func:`root_ids` for the named (or given) columns."""
    from pyspark.sql import functions as F

    return F.xxhash64(
        F.lit(source),
        _col(topic),
        _col(partition).cast("long"),
        _col(offset).cast("long"),
        _col(attempt).cast("long"),
    )


def spark_child_edge(
    parent_edge: ColumnLike = "_edge", stage: ColumnLike = 0, ordinal: ColumnLike = 0
) -> Column:
    """Spark Column equal to :func:`child_edges` (stage and ordinal: ints or columns)."""
    from pyspark.sql import functions as F

    return F.xxhash64(
        _col(parent_edge).cast("long"), _col(stage).cast("long"), _col(ordinal).cast("long")
    )


def _col(c: ColumnLike) -> Column:
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    if isinstance(c, Column):
        return c
    if isinstance(c, str):
        return F.col(c)
    return F.lit(int(c))
