"""``spark.readStream.format("ackstream")``: upstream records as tracked spout tuples.

This module only adapts the spout to Spark's Python data source API. Three
processes are involved (see ``docs/architecture.md``): options are parsed where
the DataFrame is created, so a bad one fails at ``load()``; the reader's planning
methods run in one long-lived Python process beside the driver, which owns a
:class:`~ackstream.sources.spout.Spout`; ``read()`` runs in executor workers on a
fresh, pickled reader and gets everything it needs from its
:class:`~ackstream.sources.rows.ReadTask`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from ackstream.channels import open_channel
from ackstream.channels.local import SOURCE_METRICS_FILE
from ackstream.config.source import SourceConfig
from ackstream.sources.offsets import read_tasks
from ackstream.sources.rows import ReadTask, source_ddl
from ackstream.sources.spout import Spout, open_spout
from ackstream.sources.starting import initial_offset
from ackstream.sources.upstream import check_options, open_upstream
from ackstream.storage.files import write_atomically
from ackstream.vocabulary.batch_offset import BatchOffset

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.datasource import ReadLimit
    from pyspark.sql.types import StructType

__all__ = ["AckstreamDataSource", "AckstreamStreamReader", "register"]


def register(spark: SparkSession) -> None:
    """Make ``spark.readStream.format("ackstream")`` available in this session."""
    spark.dataSource.register(AckstreamDataSource)


class AckstreamDataSource(DataSource):
    """The ``ackstream`` source; options are parsed (and checked) on construction."""

    def __init__(self, options: MutableMapping[str, str]) -> None:
        super().__init__(options)
        self.config = check_options(options)
        open_upstream(self.config).check()  # brokers up, topics there: say so before the start

    @classmethod
    def name(cls) -> str:
        return "ackstream"

    def schema(self) -> str:
        return source_ddl(self.config.kafka.include_headers)

    def streamReader(self, schema: StructType) -> AckstreamStreamReader:
        return AckstreamStreamReader(self.config)


@dataclass
class TaskPartition(InputPartition):
    """One Spark task of a batch: what :meth:`Upstream.read` needs, and nothing else."""

    task: ReadTask


class AckstreamStreamReader(DataSourceStreamReader):
    """Plans micro-batches with a spout on the driver, reads them on executors (nothing
    opened eagerly: the executors' copy is constructed too)."""

    def __init__(self, config: SourceConfig):
        self.config = config
        self._spout: Spout | None = None

    # --- driver side ----------------------------------------------------------------

    def _spout_from(self, offset: dict[str, Any]) -> Spout:
        """The spout; on the first call, rebuilt from ``offset`` (a restart), which is
        read only then: Spark's offsets enter as :class:`BatchOffset` at this door, and
        in :meth:`partitions` and :meth:`commit`."""
        if self._spout is None:
            self._spout = open_spout(
                self.config,
                open_upstream(self.config),
                open_channel(self.config),
                BatchOffset.from_json(offset),
            )
        return self._spout

    def initialOffset(self) -> dict[str, Any]:
        upstream, channel = open_upstream(self.config), open_channel(self.config)
        try:
            return initial_offset(self.config, upstream, channel).to_json()
        finally:
            upstream.close()
            channel.close()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.config.admission.max_offsets_per_trigger:
            return ReadMaxRows(self.config.admission.max_offsets_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        offset = self._spout_from(start).next_offset(max_rows)
        return start if offset is None else offset.to_json()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The spout's :meth:`~ackstream.sources.spout.Spout.metrics`, shown by Spark as
        the source's ``latestOffset`` in every ``StreamingQueryProgress``: pyspark's
        Python data source has no custom metrics, and this is the one dict of the
        planner's that reaches the progress (``ackstream.ui.status.source_metrics`` reads
        it). A local channel keeps the latest in its folder too, for ``ackstream status``."""
        if self._spout is None:
            return None
        metrics = self._spout.metrics()
        if self.config.channel != "kafka" and os.path.isdir(self.config.channel):
            path = os.path.join(self.config.channel, SOURCE_METRICS_FILE)
            write_atomically(path, lambda hidden: _write_json(hidden, metrics))
        return metrics

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[TaskPartition]:
        if self.config.tracking:
            self._spout_from(end)  # a restart re-running its last batch starts here
        tasks = read_tasks(
            BatchOffset.from_json(end),
            self.config.admission.min_partitions,
            self.config.admission.max_records_per_partition,
        )
        return [TaskPartition(task) for task in tasks]

    def commit(self, end: dict[str, Any]) -> None:
        if self._spout is not None:
            self._spout.on_spark_commit(BatchOffset.from_json(end))

    def stop(self) -> None:
        if self._spout is not None:
            self._spout.close()
            self._spout = None

    # --- executor side --------------------------------------------------------------

    def read(self, partition: TaskPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]  # ours, from partitions()
        yield from open_upstream(self.config).read(partition.task)


def _write_json(path: str, value: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(value, f)
