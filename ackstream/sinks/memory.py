"""Output sinks for tests, notebooks and the demo: keep rows in memory, print them, or
append them to a Parquet folder.

All follow :class:`~ackstream.sinks.base.Sink`. ``MemorySink`` and ``ConsoleSink``
act in the process that runs the topology's ``foreachBatch``: the user's own with a
classic session, but a Python process beside the server under Spark Connect, where
a ``MemorySink``'s rows could never be read back; so it refuses to be pickled, and
``Topology.start`` says so. ``ParquetSink`` writes from the executors to a folder that
any session, a Connect client's included, reads back with ``spark.read``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, NoReturn

import pyarrow as pa

from ackstream.sinks.base import Sink
from ackstream.vocabulary.lineage import LINEAGE_COLUMNS

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame

__all__ = ["ConsoleSink", "MemorySink", "ParquetSink"]


class MemorySink(Sink):
    """Collects every output row in this process; ``lineage=False`` drops ``_root``,
    ``_edge`` and ``_anchors`` from what it keeps. Classic sessions only: under Spark
    Connect use :class:`ParquetSink`."""

    def __init__(self, lineage: bool = False):
        self.lineage = lineage
        self._tables: list[pa.Table] = []
        self._lock = threading.Lock()

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            "MemorySink keeps its rows in the process that runs the topology, so it "
            "cannot be pickled: under Spark Connect, where foreachBatch runs beside the "
            "server, its rows could never be read back; use ParquetSink(path) and read "
            "them with spark.read.parquet(path)"
        )

    def write(self, outputs: DataFrame, batch_id: int) -> None:
        if not self.lineage:
            outputs = outputs.drop(*LINEAGE_COLUMNS)
        table = outputs.toArrow()
        if table.num_rows:
            with self._lock:
                self._tables.append(table)

    def table(self) -> pa.Table:
        """Everything written so far, as one Arrow table (empty with no columns: nothing yet)."""
        with self._lock:
            tables = list(self._tables)
        return pa.concat_tables(tables, promote_options="default") if tables else pa.table({})

    def to_pandas(self) -> pd.DataFrame:
        return self.table().to_pandas()

    def rows(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.table().to_pylist()
        return rows

    def clear(self) -> None:
        with self._lock:
            self._tables.clear()

    def close(self) -> None:
        """Nothing to release: the rows stay readable."""


class ConsoleSink(Sink):
    """Prints each batch's outputs (``DataFrame.show``), as Spark's console sink does."""

    def __init__(self, rows: int = 20, truncate: bool = True, lineage: bool = False):
        self.rows, self.truncate, self.lineage = rows, truncate, lineage

    def write(self, outputs: DataFrame, batch_id: int) -> None:
        if not self.lineage:
            outputs = outputs.drop(*LINEAGE_COLUMNS)
        print(f"-------- batch {batch_id} --------")
        outputs.show(self.rows, truncate=self.truncate)

    def close(self) -> None:
        """Nothing to release."""


class ParquetSink(Sink):
    """Writes each batch's outputs from the executors to ``<path>/batch_id=<id>/`` as
    Parquet, replacing that folder when a batch is re-run after a crash, so each batch
    is there once. Read it back from any session, a Spark Connect client's included,
    with ``spark.read.parquet(path)`` (``batch_id`` becomes a column). On a cluster
    ``path`` must be a file system every executor and the reader share (HDFS, S3...).
    ``lineage=False`` drops the lineage columns."""

    def __init__(self, path: str, lineage: bool = False):
        self.path, self.lineage = str(path), lineage

    def write(self, outputs: DataFrame, batch_id: int) -> None:
        if not self.lineage:
            outputs = outputs.drop(*LINEAGE_COLUMNS)
        folder = f"{self.path.rstrip('/')}/batch_id={int(batch_id)}"
        outputs.write.mode("overwrite").parquet(folder)

    def close(self) -> None:
        """Nothing to release: the files stay."""
