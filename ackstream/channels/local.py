"""The channel as a local folder: embedded mode, one host.

Ack records flow from tuple processors (the topology query, or any process) to
the acker query; completions flow from the acker query, and from topology
batches that settle their own trees, to the source reader on the driver. In
the embedded setup both are folders of Parquet files:

- ``<dir>/acks/``: one file per write, written under a hidden name and renamed,
  so Spark's file stream never lists a half-written file. The acker query
  reads it as a file stream.
- ``<dir>/done/<n>-<content id>.parquet``: completions, numbered in the order
  the files appear. Writers are the acker query (one file per batch with
  completions) and the topology's batches (the trees they settle themselves).
  A writer writes under a hidden name, then hard-links the file to the next
  free number, which fails if another writer took it first (then it tries the
  next): number n + 1 never exists before n, so a reader that resumes after the
  last number it read misses nothing, whatever the writers' batch ids. The same
  rows written again (an acker batch re-run after a crash) are found by their
  content id and skipped. The source reads the folder with pyarrow, no Spark
  session needed.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Mapping
from typing import TYPE_CHECKING

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ackstream.storage.files import hidden_path, write_atomically
from ackstream.vocabulary.ids import content_id
from ackstream.vocabulary.ranges import expand
from ackstream.vocabulary.records import (
    ACK_RECORD_DDL,
    ACK_RECORD_SCHEMA,
    COMPLETION_SCHEMA,
    RESET,
    as_table,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["SOURCE_METRICS_FILE", "LocalChannel"]

log = logging.getLogger(__name__)

#: The source's latest metrics (``Spout.metrics``), JSON, in a local channel's folder,
#: where ``ackstream status`` reads them.
SOURCE_METRICS_FILE = "source-metrics.json"

_DONE_FILE = re.compile(r"^(\d{12})-([0-9a-f]{16})\.parquet$")


class LocalChannel:
    """Ack and completion channels of one topology in a local directory.

    The folder is one host's unless ``shared=True`` declares it on a file system that
    every host of the cluster mounts at the same path: the source's read tasks write
    to it from the executors, so on a non-local master an undeclared folder is refused
    (see :func:`ackstream.channels.check_reach`)."""

    def __init__(self, directory: str | os.PathLike[str], *, shared: bool = False):
        # absolute: a relative folder would move with the working folder (Spark's
        # file source and the acker resolve it against theirs)
        self.directory, self.shared = os.path.abspath(os.fspath(directory)), bool(shared)
        self.acks_dir = os.path.join(self.directory, "acks")
        self.done_dir = os.path.join(self.directory, "done")
        self.prepare()

    def prepare(self) -> None:
        """Create the folders (the Kafka channel creates its topics here)."""
        os.makedirs(self.acks_dir, exist_ok=True)
        os.makedirs(self.done_dir, exist_ok=True)

    ack_files = True  # Parquet files, read by Spark's file source
    ack_shards: None = None  # one folder of files, whose records the acker reads on the driver

    @property
    def one_host(self) -> bool:
        return not self.shared

    def source_options(self) -> dict[str, str]:
        return {
            "ackstream.channel": os.path.abspath(self.directory),
            "ackstream.channelShared": str(self.shared).lower(),  # one host's, or all
        }

    def agreeing_with(self, source_options: Mapping[str, str]) -> LocalChannel:
        """A folder needs nothing of the source's settings: itself."""
        return self

    # --- ack records ------------------------------------------------------------

    def write_acks(self, records: pa.Table | pd.DataFrame) -> None:
        """Append ack records (``ACK_RECORD_SCHEMA`` columns); any process may call this."""
        table = as_table(records, ACK_RECORD_SCHEMA)
        if not table.num_rows:
            return
        # named by content: a re-run batch's records replace its file, so the acker does
        # not see them twice (a duplicate would cancel the tree and cost a replay). A
        # reset says "still alive" each time it is sent: its time is part of its content.
        named_by = ["root", "value", "kind"]
        if pc.any(pc.not_equal(pc.bit_wise_and(table.column("kind"), RESET), 0)).as_py():
            named_by.append("ts")
        name = (
            content_id(*(pc.fill_null(table.column(c), 0).to_numpy() for c in named_by))
            + ".parquet"
        )
        write_atomically(
            os.path.join(self.acks_dir, name), lambda path: pq.write_table(table, path)
        )

    def ack_stream(
        self, spark: SparkSession, max_files_per_trigger: int | None = None
    ) -> DataFrame:
        """The ack records as a streaming DataFrame, for the acker query."""
        # a file some other writer got wrong is skipped (and logged by Spark), not fatal;
        # rows with missing columns come as nulls, which the acker reports as invalid
        reader = spark.readStream.schema(ACK_RECORD_DDL).option("ignoreCorruptFiles", "true")
        if max_files_per_trigger:
            reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
        return reader.parquet(self.acks_dir)

    def ack_records(self) -> pa.Table:
        """Every ack record in the folder; a file that cannot be read is logged and
        skipped, as the acker query does (``ignoreCorruptFiles``)."""
        tables = [ACK_RECORD_SCHEMA.empty_table()]
        for name in sorted(os.listdir(self.acks_dir)):
            if name.startswith(".") or not name.endswith(".parquet"):
                continue  # hidden: still being written
            try:
                tables.append(
                    as_table(pq.read_table(os.path.join(self.acks_dir, name)), ACK_RECORD_SCHEMA)
                )
            except (pa.ArrowException, OSError, KeyError) as problem:
                log.warning("ackstream: skipped unreadable ack file %s: %s", name, problem)
        return pa.concat_tables(tables)

    # --- completions ------------------------------------------------------------

    def write_completions(self, table: pa.Table, batch_id: int | None = None) -> None:
        """Append completions; any writer may call this (``batch_id`` is not needed here).
        Rows written before, as a whole, are not written again (see the module doc)."""
        if not table.num_rows:
            return
        table = as_table(table, COMPLETION_SCHEMA)
        tag = content_id(
            *(
                pc.fill_null(table.column(c), 0).to_numpy()  # invalid: no root
                for c in ("root", "completed_ms")
            )
        )
        numbers = self._done_files()
        if tag in numbers.values():
            return  # written before a restart; a re-run of an acker batch yields the same rows
        hidden = hidden_path(os.path.join(self.done_dir, f"{tag}.parquet"))
        pq.write_table(table, hidden)
        number = max(numbers, default=-1) + 1
        while True:
            try:
                os.link(hidden, os.path.join(self.done_dir, f"{number:012d}-{tag}.parquet"))
                break
            except FileExistsError:  # another writer took it: the next one is free
                number += 1
        os.remove(hidden)

    def answering(self) -> bool:
        """Always: a folder read either works or raises."""
        return True

    def completions_since(
        self, after: int | None = None, *, runs: bool = False
    ) -> tuple[pa.Table, int]:
        """Completions in files numbered after ``after`` (None: from the first), and the
        last number read: the position to pass next time (``runs``: see
        :meth:`~ackstream.channels.base.Channel.completions_since`)."""
        after = -1 if after is None else after
        files = sorted((n, tag) for n, tag in self._done_files().items() if n > after)
        tables = [
            pq.read_table(
                os.path.join(self.done_dir, f"{n:012d}-{tag}.parquet"), schema=COMPLETION_SCHEMA
            )
            for n, tag in files
        ]
        table = pa.concat_tables(tables) if tables else COMPLETION_SCHEMA.empty_table()
        return (table if runs else expand(table)), (files[-1][0] if files else after)

    def end_position(self) -> int:
        """The position after every completion written so far: a new reader starts
        here, because old completions in a reused folder carry the same root ids."""
        return max(self._done_files(), default=-1)

    def _done_files(self) -> dict[int, str]:
        """{number: content id} of the completion files there now."""
        return {
            int(m.group(1)): m.group(2)
            for m in map(_DONE_FILE.match, os.listdir(self.done_dir))
            if m
        }

    def close(self) -> None:
        """Nothing to release (the Kafka channel closes its producer)."""

    def clear(self) -> None:
        """Remove every record of this channel (tests and demos only)."""
        shutil.rmtree(self.directory, ignore_errors=True)
        self.prepare()
