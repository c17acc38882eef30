"""numpy passes the bookkeeping shares.

``np.unique`` of many distinct int64 values (root ids, offsets) hashes them, which on
this numpy costs about fifty times a sort: a batch's hundreds of thousands of roots
took most of a second. These sort instead.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["distinct", "has_duplicates"]


def distinct(values: npt.ArrayLike) -> np.ndarray:
    """The distinct values, sorted.

    >>> distinct([3, 1, 3, 2]).tolist()
    [1, 2, 3]
    """
    ordered = np.sort(np.asarray(values, np.int64).reshape(-1))
    if len(ordered) < 2:
        return ordered
    first = np.ones(len(ordered), dtype=bool)  # the first of each run of equal values
    first[1:] = ordered[1:] != ordered[:-1]
    return ordered[first]


def has_duplicates(values: npt.ArrayLike) -> bool:
    """Whether any value occurs twice.

    >>> has_duplicates([3, 1, 3]), has_duplicates([3, 1])
    (True, False)
    """
    ordered = np.sort(np.asarray(values).reshape(-1))
    return bool((ordered[1:] == ordered[:-1]).any())
