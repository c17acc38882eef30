"""Output sinks for tests, notebooks and the demo: keep rows in memory, or print them.

Both follow :class:`~ackstream.sinks.base.Sink`.
"""

from __future__ import annotations

import threading

import pyarrow as pa

from ackstream.lineage import LINEAGE_COLUMNS

__all__ = ["MemorySink", "ConsoleSink"]


class MemorySink:
    """Collects every output row in this process; ``lineage=False`` drops ``_root``,
    ``_edge`` and ``_anchors`` from what it keeps."""

    def __init__(self, lineage: bool = False):
        self.lineage = lineage
        self._tables: list[pa.Table] = []
        self._lock = threading.Lock()

    def write(self, outputs, batch_id: int):
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

    def to_pandas(self):
        return self.table().to_pandas()

    def rows(self) -> list[dict]:
        return self.table().to_pylist()

    def clear(self) -> None:
        with self._lock:
            self._tables.clear()

    def close(self) -> None:
        """Nothing to release: the rows stay readable."""


class ConsoleSink:
    """Prints each batch's outputs (``DataFrame.show``), as Spark's console sink does."""

    def __init__(self, rows: int = 20, truncate: bool = True, lineage: bool = False):
        self.rows, self.truncate, self.lineage = rows, truncate, lineage

    def write(self, outputs, batch_id: int):
        if not self.lineage:
            outputs = outputs.drop(*LINEAGE_COLUMNS)
        print(f"-------- batch {batch_id} --------")
        outputs.show(self.rows, truncate=self.truncate)

    def close(self) -> None:
        """Nothing to release."""
