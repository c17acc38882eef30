"""The upstream: where the spout's records come from (a Kafka topic, or the generator).

The spout (:mod:`ackstream.sources.spout`) plans batches against this protocol on
the driver; Spark's executors call :meth:`Upstream.read` on a copy made from the
same config. Both implementations pass one contract suite
(``tests/sources/test_upstream_contract.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from ackstream.config.source import SourceConfig, parse
from ackstream.sources.generator import GeneratorUpstream
from ackstream.sources.kafka import KafkaUpstream
from ackstream.sources.rows import ReadTask
from ackstream.vocabulary.partition import Partition

__all__ = ["Upstream", "check_options", "open_upstream"]


@runtime_checkable
class Upstream(Protocol):
    """Partitions with offsets, a consumer group's commits, and the records themselves."""

    def check(self) -> None:
        """Raise :class:`~ackstream.errors.EnvironmentProblem` now, naming the option, if
        the upstream cannot be read (no broker, no topic), rather than inside a query."""

    def partitions(self) -> list[Partition]:
        """Every partition to read, in a stable order."""

    def earliest(self, tps: list[Partition]) -> dict[Partition, int]:
        """The first offset still held per partition (retention moves it up)."""

    def latest(self, tps: list[Partition], positions: dict[Partition, int]) -> dict[Partition, int]:
        """The offset after the last record that may be read now, per partition;
        ``positions`` are the reader's (a rate-limited upstream releases from there)."""

    def committed(self, tps: list[Partition]) -> dict[Partition, tuple[int, str]]:
        """The group's committed offset and metadata per partition (absent: none)."""

    def commit(self, offsets: dict[Partition, tuple[int, str]]) -> None:
        """Commit ``{tp: (offset, metadata)}`` for the group."""

    def fetch(
        self, coords: list[tuple[Partition, int]]
    ) -> dict[tuple[Partition, int], tuple[Any, ...]]:
        """``{(tp, offset): (key, value, timestamp_ms, headers)}`` of single records (dead
        letters); headers a list of ``(key, value)`` pairs, or None."""

    def read(self, task: ReadTask) -> Iterator[pa.RecordBatch]:
        """The source rows of one Spark task (``rows.SOURCE_SCHEMA``); runs on executors."""

    def close(self) -> None:
        """Release clients."""


def check_options(options: Mapping[str, str]) -> SourceConfig:
    """The parsed options of ``format("ackstream")``, every one checked without I/O.

    ``load()`` checks them too, but Spark wraps what a data source raises in its own
    ``AnalysisException``; called first, this raises :class:`ackstream.OptionError`
    itself, naming the option (``Topology.read_stream`` does so)."""
    config = parse(options)
    open_upstream(config).close()  # the Kafka upstream checks its kafka.* settings
    return config


def open_upstream(config: SourceConfig) -> Upstream:
    """The upstream ``config`` names (``ackstream.upstream``); nothing is opened yet."""
    if config.upstream == "generator":
        return GeneratorUpstream(config)
    return KafkaUpstream(config)
