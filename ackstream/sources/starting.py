"""Where a new query's source starts: each partition's first offset, from the options.

``startingOffsets`` (``earliest``, ``latest``, ``committed`` or offsets per partition),
``startingTimestamp`` and ``startingOffsetsByTimestamp`` as Spark's Kafka source reads
them; a start outside what a partition holds is refused, naming its range.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from ackstream.channels.base import Channel
from ackstream.config.source import SourceConfig
from ackstream.errors import OptionError
from ackstream.sources.claim import new_owner
from ackstream.sources.tracking import Tracker
from ackstream.sources.upstream import Upstream
from ackstream.vocabulary.batch_offset import BatchOffset
from ackstream.vocabulary.partition import Partition

if TYPE_CHECKING:
    from ackstream.sources.kafka import KafkaUpstream

__all__ = ["initial_offset", "new_tracker"]


def initial_offset(config: SourceConfig, upstream: Upstream, channel: Channel) -> BatchOffset:
    """The offset a new query starts from: every partition at its starting position,
    and the completion channel read from its end."""
    tps = upstream.partitions()
    starts = _starting_positions(config, upstream, tps)
    tracker = new_tracker(config)
    for tp in tps:
        tracker.add_partition(tp, starts[tp])
    return BatchOffset(tracker.snapshot(), done=channel.end_position(), owner=new_owner())


def new_tracker(config: SourceConfig) -> Tracker:
    """The bookkeeping of a source with ``config``, empty."""
    return Tracker(
        config.id_namespace, config.retry, config.source_timeout_ms, config.admission.max_pending
    )


def _starting_positions(
    config: SourceConfig, upstream: Upstream, tps: list[Partition]
) -> dict[Partition, int]:
    earliest, latest = upstream.earliest(tps), upstream.latest(tps, {})
    explicit = config.kafka.starting_map()
    if explicit is not None:
        out = {}
        for tp in tps:
            off = explicit.get(tp[0], {}).get(tp[1], -1)
            out[tp] = earliest[tp] if off == -2 else latest[tp] if off == -1 else off
            if not earliest[tp] <= out[tp] <= latest[tp]:
                raise OptionError(
                    "startingOffsets",
                    config.kafka.starting_offsets,
                    f"offsets the partitions hold: {_holds(tp, earliest, latest)}, and "
                    f"{off} is {'past its end' if off > latest[tp] else 'before its earliest'}"
                    " (-2: its earliest, -1: its end)",
                )
    elif config.kafka.starting_offsets == "earliest":
        out = dict(earliest)
    elif config.kafka.starting_offsets == "latest":
        out = dict(latest)
    else:
        committed = upstream.committed(tps)  # "committed": the group's offset, else earliest
        out = {tp: committed[tp][0] if tp in committed else earliest[tp] for tp in tps}
    out.update(_positions_by_time(config, upstream, tps, earliest, latest))
    return out


def _holds(tp: Partition, earliest: dict[Partition, int], latest: dict[Partition, int]) -> str:
    """What partition ``tp`` holds, for an error: a start may be any offset from its
    earliest to its end."""
    return f"{tp[0]}[{tp[1]}] starts at {earliest[tp]} and ends at {latest[tp]}"


def _positions_by_time(
    config: SourceConfig,
    upstream: Upstream,
    tps: list[Partition],
    earliest: dict[Partition, int],
    latest: dict[Partition, int],
) -> dict[Partition, int]:
    """Where ``startingTimestamp`` (every partition) or ``startingOffsetsByTimestamp``
    (the partitions it names; the others start as ``startingOffsets`` says) start."""
    by_partition = config.kafka.timestamp_map() or {}
    asked = {
        tp: config.kafka.starting_timestamp
        if config.kafka.starting_timestamp is not None
        else by_partition.get(tp[0], {}).get(tp[1])
        for tp in tps
    }
    times = {tp: ms for tp, ms in asked.items() if ms is not None}
    if not times:
        return {}
    out = {}
    option, given = (
        ("startingTimestamp", config.kafka.starting_timestamp)
        if config.kafka.starting_timestamp is not None
        else ("startingOffsetsByTimestamp", config.kafka.starting_timestamps)
    )
    # only a Kafka upstream gets here: the options that set times are Kafka-only
    # (config/source.py), and the Upstream protocol declares no offsets_for_times
    by_time = cast("KafkaUpstream", upstream).offsets_for_times(times)
    for tp, offset in by_time.items():
        if offset is None and config.kafka.starting_timestamp_strategy == "error":
            raise OptionError(
                option,
                given,
                f"a time each partition has a record at or after: {_holds(tp, earliest, latest)}"
                f", with no record at or after {times[tp]} ms; give an earlier time, or set "
                "startingOffsetsByTimestampStrategy=latest to start at its end",
            )
        out[tp] = latest[tp] if offset is None else offset
    return out
