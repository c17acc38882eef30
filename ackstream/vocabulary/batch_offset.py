"""The batch offset: the source planner's one message to its batch, and its JSON.

The driver-side reader returns an offset from ``latestOffset``; Spark writes it to
the query's offset log as JSON before the batch runs and hands it back parsed (to
``partitions``, ``commit``, a restarted reader, the topology's batch), its integer
keys turned to strings. :class:`BatchOffset` is that message with typed fields:
:meth:`BatchOffset.from_json` is the one door in (the version and every field are
checked there, an error names the one that is wrong) and :meth:`BatchOffset.to_json`
the one way out. The JSON is version 1, as written since offsets had a version::

    {"v": 1,
     "parts": {"<topic>": {"<partition>": {"end": <read position>, "wm": <watermark>}}},
     "read": {"<topic>": {"<partition>": [from, to]}},   # new offsets of this batch
     "replays": [[topic, partition, from, to, attempt], ...],  # runs replayed in it
     "done": <position in the completion channel>,   # the channel's own JSON
     "owner": "<query id>",               # the query's claim on its consumer group
     "idle": <ms>,                        # only in a batch planned with nothing new
     "reader": "spark",                   # only when Spark's Kafka connector reads "read"
     "replays_by": "spark",               # ... and the replays too
     # with tracking on only (:class:`Tracked`):
     "source": "<topology>", "channel": "<ackstream.channel>",
     "timeout": <message timeout ms>, "ids": "<id namespace>",
     "seq": <state file number>, "counts": {"acked": n, ...},
     "rounds": {...}}                     # isolation of failed batches in progress

A replay of one offset logged as ``[topic, partition, offset, attempt]`` (offsets
written before replays were runs) reads as a run of one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ackstream.vocabulary.partition import Partition

__all__ = [
    "VERSION",
    "BatchOffset",
    "BatchOffsetError",
    "Position",
    "ReplayRun",
    "Tracked",
]

#: The version of the offset's JSON this ackstream writes and reads.
VERSION = 1

#: ``(topic, partition, from, to, attempt)``: a run of offsets replayed at one attempt,
#: ``to`` exclusive
ReplayRun = tuple[str, int, int, int, int]

_T = TypeVar("_T")


class BatchOffsetError(ValueError):
    """An offset this ackstream cannot read: another version, or a field malformed."""


@dataclass(frozen=True)
class Position:
    """A partition's place in the source: every offset below ``end`` was read, every
    one below ``watermark`` is acked or dead-lettered."""

    end: int
    watermark: int


@dataclass(frozen=True)
class Tracked:
    """What only a tracked source's offset carries: the terms the topology reading it
    checks against its own, and what a restarted source resumes from."""

    #: the topology's name (``ackstream.topology``)
    topology: str
    #: the completion channel (``ackstream.channel``)
    channel: str
    #: the message timeout, ms
    timeout_ms: int
    #: what root ids hash (``SourceConfig.id_namespace``)
    namespace: str
    #: the source's state file of the records not done (``ackstream.sources.state``)
    seq: int
    #: outcomes counted up to the channel position ``done``
    counts: Mapping[str, int] = field(default_factory=dict)
    #: rounds of isolation in progress (``Rounds.snapshot``'s own JSON), or None
    rounds: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class BatchOffset:
    """One offset of the ``ackstream`` source: where each partition stands, and every
    record the batch ending here reads (its new ranges and its replays)."""

    parts: Mapping[Partition, Position]
    #: position in the completion channel read up to, the channel's own JSON value (a
    #: file number for the local channel, ``{partition: next offset}`` for Kafka's)
    done: Any = -1
    #: the query's claim on its consumer group (None in an offset from before claims)
    owner: str | None = None
    #: ``[from, to)`` each partition reads anew (attempt 0), as planned
    read: Mapping[Partition, tuple[int, int]] = field(default_factory=dict)
    replays: tuple[ReplayRun, ...] = ()
    #: when a batch with nothing new was planned (so that Spark runs it), else None
    idle_ms: int | None = None
    #: Spark's Kafka connector reads ``read`` (in the topology's batch)
    spark_reads_new: bool = False
    #: ... and ``replays`` too
    spark_reads_replays: bool = False
    #: None with tracking off
    tracked: Tracked | None = None

    def new_ranges(self) -> list[tuple[str, int, int, int]]:
        """``(topic, partition, from, to)`` of each partition that advances in the batch
        (none in a query's initial offset)."""
        return [(tp[0], tp[1], lo, hi) for tp, (lo, hi) in self.read.items() if hi > lo]

    @property
    def new_records(self) -> int:
        """How many offsets the batch reads anew."""
        return sum(hi - lo for *_, lo, hi in self.new_ranges())

    @property
    def replayed_records(self) -> int:
        """How many offsets the batch replays."""
        return sum(run[3] - run[2] for run in self.replays)

    @property
    def namespace(self) -> str | None:
        """What the batch's root ids hash (None with tracking off)."""
        return None if self.tracked is None else self.tracked.namespace

    @staticmethod
    def is_ours(value: object) -> bool:
        """Whether ``value`` (a parsed offset of some source of a query) is an
        ``ackstream`` source's, of any version: other sources' offsets are not."""
        return isinstance(value, Mapping) and "v" in value and "parts" in value

    @classmethod
    def from_json(cls, value: str | Mapping[str, Any]) -> BatchOffset:
        """The offset ``value`` (its JSON text, or that parsed) holds; raises
        :class:`BatchOffsetError` naming the version or the field that is wrong."""
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as error:
                raise BatchOffsetError(f"ackstream offset: not JSON ({error})") from None
        if not cls.is_ours(value):
            raise BatchOffsetError(
                f"ackstream offset: no 'v' and 'parts' in {_short(value)}: not an "
                "ackstream source's offset"
            )
        assert isinstance(value, Mapping)  # is_ours says so
        if value["v"] != VERSION:
            raise BatchOffsetError(
                f"ackstream offset: version {value['v']!r}, and this ackstream reads "
                f"version {VERSION}: run the ackstream that wrote the checkpoint, or "
                "start the query from a new checkpoint"
            )
        return cls(
            parts=_field(value, "parts", _parts),
            done=_field(value, "done", _position, -1),
            owner=_field(value, "owner", str, None),
            read=_field(value, "read", _read, {}),
            replays=_field(value, "replays", _replays, ()),
            idle_ms=_field(value, "idle", int, None),
            spark_reads_new=_field(value, "reader", _is_spark, False),
            spark_reads_replays=_field(value, "replays_by", _is_spark, False),
            tracked=_tracked(value) if "source" in value else None,
        )

    def to_json(self) -> dict[str, Any]:
        """The offset as JSON-ready values, in the version-1 format."""
        out: dict[str, Any] = {
            "v": VERSION,
            "parts": _by_topic(
                {tp: {"end": at.end, "wm": at.watermark} for tp, at in self.parts.items()}
            ),
            "read": _by_topic({tp: list(span) for tp, span in self.read.items()}),
            "replays": [list(run) for run in self.replays],
            "done": self.done,
        }
        if self.owner is not None:
            out["owner"] = self.owner
        if self.idle_ms is not None:
            out["idle"] = self.idle_ms
        if self.spark_reads_new:
            out["reader"] = "spark"
        if self.spark_reads_replays:
            out["replays_by"] = "spark"
        tracked = self.tracked
        if tracked is not None:
            out.update(
                source=tracked.topology,
                channel=tracked.channel,
                timeout=tracked.timeout_ms,
                ids=tracked.namespace,
                seq=tracked.seq,
                counts=dict(tracked.counts),
            )
            if tracked.rounds is not None:
                out["rounds"] = dict(tracked.rounds)
        return out


def _field(
    value: Mapping[str, Any],
    name: str,
    parse: Callable[[Any], Any],
    default: Any = None,
) -> Any:
    """Field ``name`` of ``value`` parsed, or ``default`` when it is absent (``parts``,
    whose default is None, is required); a malformed one raises, named."""
    if name not in value:
        if default is None and name in _REQUIRED:
            raise BatchOffsetError(f"ackstream offset: no field {name!r} in {_short(value)}")
        return default
    try:
        return parse(value[name])
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
        raise BatchOffsetError(
            f"ackstream offset: field {name!r} is malformed ({type(error).__name__}: "
            f"{error}) in {_short(value)}"
        ) from None


#: Fields without which an offset (or its tracked part) cannot be read.
_REQUIRED = frozenset({"parts", "source", "channel", "timeout", "ids"})


def _tracked(value: Mapping[str, Any]) -> Tracked:
    return Tracked(
        topology=_field(value, "source", str),
        channel=_field(value, "channel", str),
        timeout_ms=_field(value, "timeout", int),
        namespace=_field(value, "ids", str),
        seq=_field(value, "seq", int, 0),
        counts=_field(value, "counts", _counts, {}),
        rounds=_field(value, "rounds", _rounds, None),
    )


def _parts(value: Mapping[str, Mapping[str, Mapping[str, int]]]) -> dict[Partition, Position]:
    return {
        (topic, int(p)): Position(int(at["end"]), int(at["wm"]))
        for topic, parts in value.items()
        for p, at in parts.items()
    }


def _read(value: Mapping[str, Mapping[str, list[int]]]) -> dict[Partition, tuple[int, int]]:
    out = {}
    for topic, parts in value.items():
        for p, (lo, hi) in parts.items():
            out[(topic, int(p))] = (int(lo), int(hi))
    return out


def _replays(value: list[list[Any]]) -> tuple[ReplayRun, ...]:
    runs = []
    for run in value:
        if len(run) == 4:  # one offset, logged before replays were runs
            topic, p, offset, attempt = run
            runs.append((str(topic), int(p), int(offset), int(offset) + 1, int(attempt)))
        else:
            topic, p, start, end, attempt = run
            runs.append((str(topic), int(p), int(start), int(end), int(attempt)))
    return tuple(runs)


def _position(value: Any) -> Any:
    if not isinstance(value, int | dict) or isinstance(value, bool):
        raise TypeError(f"{type(value).__name__}, not a channel position")
    return value


def _counts(value: Mapping[str, int]) -> dict[str, int]:
    return {str(k): int(n) for k, n in value.items()}


def _rounds(value: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    if value is not None and not isinstance(value, Mapping):
        raise TypeError(f"{type(value).__name__}, not an object")
    return value


def _is_spark(value: object) -> bool:
    if value not in ("spark", "python"):
        raise ValueError(f'{value!r}, not "spark"')
    return value == "spark"


def _by_topic(values: Mapping[Partition, _T]) -> dict[str, dict[str, _T]]:
    """``{(topic, p): v}`` as JSON holds it: ``{topic: {"p": v}}``."""
    out: dict[str, dict[str, _T]] = {}
    for (topic, p), v in values.items():
        out.setdefault(topic, {})[str(p)] = v
    return out


def _short(value: object) -> str:
    """``value`` as text for an error, cut short."""
    text = json.dumps(value, default=str) if isinstance(value, Mapping) else repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
