"""The source's own checkpointed state: the unfinished records behind each offset.

A Spark offset is written to the query's offset log every batch, so it must stay
small whatever is in flight. It names each partition's read position and
watermark and a sequence number; the records between the two that are not done
(in flight, scheduled for a replay, or dead and waiting for their letter) are
written here, as numpy columns, one file per sequence number::

    <ackstream.stateDir>/<query's owner id>/<seq>.npz

Rows that continue each other (the next offset of the same partition, everything
else equal: the usual batch in flight) are written as one row with a ``length``,
so a file costs per run of offsets, not per record.

A file is written whole (hidden name, then renamed) before the offset that names
it is returned to Spark, and never changed afterwards: a number is written again
only when the offset that first named it was never logged (a crash in between),
so the file an offset names reads back as it was when that offset was logged.
Files older than the offset of the last batch Spark committed are deleted: a
restart resumes from that offset or a later one. A missing file (the folder was
lost) costs replays, never a record: every offset between the watermark and the
read position is in flight again, at attempt 0.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from typing import NamedTuple

import numpy as np

from ackstream.files import write_atomically
from ackstream.sources.rows import TP

__all__ = ["SourceState", "Unfinished"]

log = logging.getLogger(__name__)

_FILE = re.compile(r"^(\d+)\.npz$")


class Unfinished(NamedTuple):
    """Records not done, one row each; ``part`` indexes ``tps``; ``due`` is when a
    scheduled replay is due (ms), or -1 for a record in flight (or dead, unwritten);
    ``uncharged`` counts its attempts not charged to its retries, ``group`` the group
    a scheduled replay belongs to, or -1 (see :mod:`ackstream.sources.tracking`)."""

    tps: list[TP]
    part: np.ndarray
    offset: np.ndarray
    attempt: np.ndarray
    due: np.ndarray
    uncharged: np.ndarray
    group: np.ndarray


#: the per-record columns of :class:`Unfinished`
_ROWS = Unfinished._fields[1:]


def _runs(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``columns`` with each row that continues the one before it (next offset, same
    partition, the rest equal) folded into it, and a ``length`` column."""
    offset = columns["offset"]
    starts = np.ones(len(offset), bool)
    if len(offset):
        same = offset[1:] == offset[:-1] + 1
        for name in _ROWS:
            if name != "offset":
                same &= columns[name][1:] == columns[name][:-1]
        starts[1:] = ~same
    first = np.flatnonzero(starts)
    return {
        **{k: v[first] for k, v in columns.items()},
        "length": np.diff(np.append(first, len(offset))),
    }


def _rows(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The rows :func:`_runs` folded, one per record again."""
    length = columns.pop("length")
    out = {k: np.repeat(v, length) for k, v in columns.items()}
    step = np.arange(len(out["offset"])) - np.repeat(np.cumsum(length) - length, length)
    out["offset"] = out["offset"] + step
    return out


class SourceState:
    """The numbered :class:`Unfinished` files of one query (see the module doc)."""

    def __init__(self, directory: str):
        self.directory = directory

    def path(self, seq: int) -> str:
        return os.path.join(self.directory, f"{seq}.npz")

    def write(self, seq: int, unfinished: Unfinished) -> None:
        """Write the state of offset ``seq``, whole, before the offset is returned."""
        os.makedirs(self.directory, exist_ok=True)
        columns = {
            "topics": np.array([t for t, _ in unfinished.tps], dtype=np.str_),
            "partitions": np.array([p for _, p in unfinished.tps], dtype=np.int64),
            **_runs({k: np.asarray(getattr(unfinished, k), np.int64) for k in _ROWS}),
        }

        def save(hidden: str) -> None:
            with open(hidden, "wb") as f:
                np.savez(f, allow_pickle=False, **columns)

        write_atomically(self.path(seq), save)

    def read(self, seq: int) -> Unfinished | None:
        """The state offset ``seq`` was logged with, or None (logged) if it is missing."""
        try:
            with np.load(self.path(seq), allow_pickle=False) as f:
                tps = list(zip(f["topics"].tolist(), f["partitions"].tolist()))
                columns = {k: f[k] for k in (*_ROWS, "length")}
                return Unfinished(tps, **_rows(columns))
        except FileNotFoundError:
            log.warning(
                "ackstream source state %s is missing (option ackstream.stateDir): the "
                "records between each watermark and read position are in flight again at "
                "attempt 0; those not acked replay after ackstream.sourceTimeout",
                self.path(seq),
            )
            return None

    def forget_before(self, seq: int) -> None:
        """Delete the files of offsets before ``seq`` (Spark committed the batch ``seq``
        ends: no restart goes back further)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return
        for name in names:
            match = _FILE.match(name)
            if match and int(match.group(1)) < seq:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(self.directory, name))
