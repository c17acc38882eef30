"""The outcomes of completions, read once per table: statuses as small integers, and the
status and reason of each failed root (what its dead letter says)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Outcomes", "Statuses", "rows_where"]


class Statuses:
    """The ``status`` column of completions, its names encoded once: a mask per status
    is a numpy comparison of small integers, not a string comparison per row."""

    def __init__(self, completions: pa.Table):
        encoded = pc.dictionary_encode(completions.column("status").combine_chunks())
        self.names = encoded.dictionary.to_pylist()
        self.codes = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False)

    def of(self, name: str) -> np.ndarray:
        """Which rows have status ``name``."""
        if name not in self.names:
            return np.zeros(len(self.codes), bool)
        mask: np.ndarray = self.codes == self.names.index(name)
        return mask


def rows_where(table: pa.Table, mask: np.ndarray) -> pa.Table:
    """The rows of ``table`` where ``mask`` holds (the table itself when all do)."""
    return table if mask.all() else table.filter(pa.array(mask))


class Outcomes(NamedTuple):
    """The outcome of each of some failed roots: its status, and where its reason is."""

    status: np.ndarray  # str objects
    row: np.ndarray  # the root's row of ``reasons`` (-1: ``reasons`` holds no row for it)
    reasons: pa.ChunkedArray | pa.Array

    @classmethod
    def of(cls, completions: pa.Table, roots: np.ndarray) -> Outcomes:
        """Each of ``roots``' status and reason in ``completions`` (one row per root,
        every one of ``roots`` among them); reasons are read only for dead letters."""
        keys = pc.fill_null(completions.column("root"), 0).to_numpy()
        order = np.argsort(keys, kind="stable")
        at = order[np.searchsorted(keys[order], roots)]
        status = pc.dictionary_encode(completions.column("status").combine_chunks())
        names = np.array(status.dictionary.to_pylist() + [None], object)
        codes = pc.fill_null(status.indices, len(names) - 1).to_numpy(zero_copy_only=False)
        return cls(names[codes[at]], at, completions.column("reason"))

    @classmethod
    def repeat(cls, status: str, reason: str | None, n: int) -> Outcomes:
        return cls(
            np.full(n, status, object), np.zeros(n, np.int64), pa.array([reason], pa.string())
        )

    def select(self, rows: np.ndarray) -> Outcomes:
        return Outcomes(self.status[rows], self.row[rows], self.reasons)

    @property
    def first_reason(self) -> str | None:
        return self.reasons[int(self.row[0])].as_py() if len(self.row) else None

    def dead_letter_reasons(self) -> list[str]:
        reasons = self.reasons.take(pa.array(self.row)).to_pylist() if len(self.row) else []
        return [_why(s, r) for s, r in zip(self.status.tolist(), reasons)]


def _why(outcome: str, reason: str | None) -> str:
    """A dead letter's reason: the status, then the stage's reason if it gave one."""
    return outcome + (f": {reason}" if reason else "")
