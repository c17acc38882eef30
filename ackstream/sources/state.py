"""The source's own checkpointed state: the unfinished records behind each offset.

A Spark offset is written to the query's offset log every batch, so it must stay
small whatever is in flight. It names each partition's read position and
watermark and a sequence number; the records between the two that are not done
(in flight, scheduled for a replay, or dead and waiting for their letter) are
written here, one file per sequence number::

    <ackstream.stateDir>/<query's owner id>/<seq>.npz

A file is *whole* (every record not done) or holds the *changes* since a whole file
of the same writer (its ``base``): the records put in flight and taken out since,
and the few scheduled, dead and uncharged ones in full. A steady batch with a
million records in flight writes a few kilobytes; a whole file is written again once
the changes hold more runs than a quarter of the records in flight, and first of all
after a start. Records in flight are written as runs of offsets (as the in-flight
table gives them, :class:`ackstream.sources.spans.Spans`), with small numbers
(steps between runs) in the narrowest integers that hold them: a byte or two a run.

A file is written whole (hidden name, then renamed) before the offset that names
it is returned to Spark, and never changed afterwards: a number is written again
only when the offset that first named it was never logged (a crash in between),
so the file an offset names reads back as it was when that offset was logged.
Files older than the offset of the last batch Spark committed are deleted, but for
the whole file a later one is written against: a restart resumes from that offset
or a later one. A missing file (the folder was lost) costs replays, never a record:
every offset between the watermark and the read position is in flight again, at
attempt 0.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypeVar

import numpy as np

from ackstream.sources.spans import EMPTY_SPANS, Changes, Spans
from ackstream.storage.files import write_atomically
from ackstream.vocabulary.partition import Partition

if TYPE_CHECKING:
    from numpy.lib.npyio import NpzFile

__all__ = ["DEAD", "SourceState", "Uncharged", "Unfinished", "Waiting"]

log = logging.getLogger(__name__)

_FILE = re.compile(r"^(\d+)\.npz$")
#: ``due`` of a dead record: its letter is not written yet (in flight again after a restore)
DEAD = -2
#: changes below this many runs never call for a whole file
_FEW_CHANGES = 10_000


class Waiting(NamedTuple):
    """Records scheduled for a replay (``due``: when, in ms) or dead (``due`` is
    :data:`DEAD`); ``group``: the group a scheduled replay belongs to, or -1 (see
    :mod:`ackstream.sources.isolation`)."""

    part: np.ndarray
    offset: np.ndarray
    attempt: np.ndarray
    due: np.ndarray
    group: np.ndarray


class Uncharged(NamedTuple):
    """Per record not done, its attempts not charged to its retries (as a suspect)."""

    part: np.ndarray
    offset: np.ndarray
    attempts: np.ndarray


_Rows = TypeVar("_Rows", Waiting, Uncharged)


class Unfinished(NamedTuple):
    """Every record between a watermark and its read position that is not done;
    ``part`` columns index ``tps``."""

    tps: list[Partition]
    flying: Spans
    waiting: Waiting
    uncharged: Uncharged


class Recorded(Protocol):
    """What the state asks of the source's bookkeeping (the tracker)."""

    @property
    def in_flight(self) -> int: ...

    def unfinished(self, flying: bool = True) -> Unfinished:
        """Every record not done; without those in flight if not ``flying``."""
        ...

    def changes(self) -> Changes:
        """The in-flight records added and taken out since :meth:`mark`."""
        ...

    def mark(self) -> None:
        """A whole file was written: changes count from now."""
        ...


class SourceState:
    """The numbered files of one query's source (see the module doc)."""

    def __init__(self, directory: str):
        self.directory = directory
        self.base: int | None = None  # the whole file this writer's changes go against

    def path(self, seq: int) -> str:
        return os.path.join(self.directory, f"{seq}.npz")

    def write(self, seq: int, source: Recorded) -> None:
        """Write the state of offset ``seq`` (whole, or the changes since the last whole
        file) before the offset is returned."""
        changes = None if self.base is None else source.changes()
        if changes is None or changes.runs > max(_FEW_CHANGES, source.in_flight // 4):
            self._save(seq, _whole(source.unfinished()))
            source.mark()
            self.base = seq
            return
        self._save(
            seq,
            {
                **_header(source.unfinished(flying=False)),
                "base": np.array([self.base], np.int64),
                **_runs("added", changes.added),
                **_runs("removed", changes.removed),
            },
        )

    def _save(self, seq: int, columns: dict[str, np.ndarray]) -> None:
        os.makedirs(self.directory, exist_ok=True)

        def save(hidden: str) -> None:
            with open(hidden, "wb") as f:
                np.savez(f, allow_pickle=False, **columns)

        write_atomically(self.path(seq), save)

    def read(self, seq: int) -> Unfinished | None:
        """The state offset ``seq`` was logged with, or None (logged) if it is missing."""
        try:
            with np.load(self.path(seq), allow_pickle=False) as f:
                unfinished = _unfinished(f)
                if "base" not in f.files:
                    return unfinished
                base_seq = int(f["base"][0])
                added, removed = _spans_of_runs(f, "added"), _spans_of_runs(f, "removed")
            with np.load(self.path(base_seq), allow_pickle=False) as f:
                base = _unfinished(f)
        except FileNotFoundError as e:
            log.warning(
                "ackstream source state %s is missing (option ackstream.stateDir): the "
                "records between each watermark and read position are in flight again at "
                "attempt 0; those not acked replay after ackstream.sourceTimeout",
                e.filename,
            )
            return None
        index = {tp: i for i, tp in enumerate(unfinished.tps)}  # the base's names a prefix
        renumber = np.array([index[tp] for tp in base.tps], np.int64)
        flying = base.flying
        if len(renumber):
            flying = flying._replace(part=renumber[flying.part])
        rows = flying.rows()
        left = ~_member(rows, removed.rows())
        kept_and_added = (np.concatenate([c[left], a]) for c, a in zip(rows, added.rows()))
        return unfinished._replace(flying=Spans.of_rows(*kept_and_added))

    def forget_before(self, seq: int) -> None:
        """Delete the files of offsets before ``seq`` (Spark committed the batch ``seq``
        ends: no restart goes back further), but the whole files that later ones hold
        changes against."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return
        numbers = [int(m.group(1)) for m in map(_FILE.match, names) if m]
        bases = set() if self.base is None else {self.base}
        for number in numbers:
            if number >= seq:
                with (
                    contextlib.suppress(OSError, KeyError, ValueError),
                    np.load(self.path(number), allow_pickle=False) as f,
                ):
                    if "base" in f.files:
                        bases.add(int(f["base"][0]))
        for number in numbers:
            if number < seq and number not in bases:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self.path(number))


def _header(unfinished: Unfinished) -> dict[str, np.ndarray]:
    """The columns every file has: partition names, waiting and uncharged records."""
    return {
        "topics": np.array([t for t, _ in unfinished.tps], dtype=np.str_),
        "partitions": np.array([p for _, p in unfinished.tps], dtype=np.int64),
        **_columns("waiting", unfinished.waiting),
        **_columns("uncharged", unfinished.uncharged),
    }


def _whole(unfinished: Unfinished) -> dict[str, np.ndarray]:
    """A whole file's columns: the records in flight as runs (:func:`_runs`)."""
    return {**_header(unfinished), **_runs("flying", unfinished.flying)}


def _runs(name: str, spans: Spans) -> dict[str, np.ndarray]:
    """``spans`` as columns of small numbers, in their order: per stretch of runs of one
    partition and attempt its first offset and number of runs, per run its step from
    the run before in its stretch and its length; each in the narrowest integers that
    hold them."""
    part, attempt, start, end = spans
    other = np.ones(len(start), bool)  # another (partition, attempt) stretch starts
    other[1:] = (part[1:] != part[:-1]) | (attempt[1:] != attempt[:-1])
    step = np.diff(start, prepend=0)
    step[other] = 0
    stretches = np.flatnonzero(other)
    return _narrow(
        {
            f"{name}.part": part[stretches],
            f"{name}.attempt": attempt[stretches],
            f"{name}.first": start[stretches],
            f"{name}.runs": np.diff(np.append(stretches, len(start))),
            f"{name}.step": step,
            f"{name}.length": end - start,
        }
    )


def _spans_of_runs(f: NpzFile, name: str) -> Spans:
    """The runs :func:`_runs` wrote."""
    part, attempt, first, runs, step, length = (
        f[f"{name}.{k}"].astype(np.int64)
        for k in ("part", "attempt", "first", "runs", "step", "length")
    )
    total = np.cumsum(step)
    stretch_total = np.repeat(total[np.cumsum(runs) - runs] if len(runs) else total, runs)
    start = np.repeat(first, runs) + total - stretch_total
    return Spans(np.repeat(part, runs), np.repeat(attempt, runs), start, start + length)


def _unfinished(f: NpzFile) -> Unfinished:
    """What a file holds, but for the changes of a file that has a base."""
    tps = list(zip(f["topics"].tolist(), f["partitions"].tolist()))
    waiting, uncharged = _rows_of(f, "waiting", Waiting), _rows_of(f, "uncharged", Uncharged)
    if "flying.length" not in f.files:
        return Unfinished(tps, EMPTY_SPANS, waiting, uncharged)
    return Unfinished(tps, _spans_of_runs(f, "flying"), waiting, uncharged)


def _columns(name: str, rows: Waiting | Uncharged) -> dict[str, np.ndarray]:
    return _narrow({f"{name}.{k}": np.asarray(v, np.int64) for k, v in rows._asdict().items()})


def _rows_of(f: NpzFile, name: str, kind: type[_Rows]) -> _Rows:
    return kind(*(f[f"{name}.{k}"].astype(np.int64) for k in kind._fields))


def _narrow(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each column in the narrowest signed integer type that holds its values."""
    out = {}
    for name, col in columns.items():
        col = np.asarray(col, np.int64)
        lo, hi = (int(col.min()), int(col.max())) if len(col) else (0, 0)
        for dtype in (np.int8, np.int16, np.int32, np.int64):
            info = np.iinfo(dtype)
            if info.min <= lo and hi <= info.max:
                out[name] = col.astype(dtype)
                break
    return out


def _member(rows: tuple[np.ndarray, ...], of: tuple[np.ndarray, ...]) -> np.ndarray:
    """Mask of ``rows`` (``part``, ``offset``, ``attempt``; distinct) that are also in ``of``."""
    size, other = len(rows[1]), len(of[1])
    if not size or not other:
        return np.zeros(size, bool)
    cols = [np.concatenate(pair) for pair in zip(rows, of)]
    tag = np.concatenate([np.zeros(size, np.int8), np.ones(other, np.int8)])
    order = np.lexsort((tag, cols[2], cols[1], cols[0]))
    part, offset, attempt, tag = (c[order] for c in (*cols, tag))
    same = (part[1:] == part[:-1]) & (offset[1:] == offset[:-1]) & (attempt[1:] == attempt[:-1])
    hit = np.append((tag[:-1] == 0) & (tag[1:] == 1) & same, False)
    mask = np.zeros(size, bool)
    mask[order[hit]] = True
    return mask
