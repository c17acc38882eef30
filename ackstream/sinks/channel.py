"""The ack channel and the completion channel, local-directory transport.

Ack records flow from tuple processors (the topology query, or any process) to
the acker query; completions flow from the acker query to the source reader on
the driver. In the embedded setup both are folders of Parquet files:

- ``<dir>/acks/``: one file per write, written under a hidden name and renamed,
  so Spark's file stream never lists a half-written file. The acker query
  reads it as a file stream.
- ``<dir>/done/<batch id>.parquet``: the completions of one acker batch,
  collected in the acker's ``foreachBatch`` (one row per finished root, far fewer than ack
  records), written under a hidden name and renamed; a re-run of the same batch
  after a crash finds the file and skips it, and batches with no completions
  write nothing. The source reads the folder with pyarrow, no Spark session
  needed, resuming after the last batch id it saw.
"""

from __future__ import annotations

import os
import re
import shutil

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ackstream.ids import content_id
from ackstream.records import ACK_RECORD_DDL, ACK_RECORD_SCHEMA, COMPLETION_SCHEMA, as_table

__all__ = ["LocalChannel", "open_channel"]

_DONE_FILE = re.compile(r"^(\d{12})\.parquet$")


class LocalChannel:
    """Ack and completion channels of one topology in a local directory."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = os.fspath(directory)
        self.acks_dir = os.path.join(self.directory, "acks")
        self.done_dir = os.path.join(self.directory, "done")
        self.prepare()

    def prepare(self) -> None:
        """Create the folders (the Kafka channel creates its topics here)."""
        os.makedirs(self.acks_dir, exist_ok=True)
        os.makedirs(self.done_dir, exist_ok=True)

    # --- ack records ------------------------------------------------------------

    def write_acks(self, records: pa.Table | pd.DataFrame) -> None:
        """Append ack records (``ACK_RECORD_SCHEMA`` columns); any process may call this."""
        table = as_table(records, ACK_RECORD_SCHEMA)
        if not table.num_rows:
            return
        # named by content: a re-run batch's records replace its file, so the acker does
        # not see them twice (a duplicate would cancel the tree and cost a replay)
        name = content_id(*(table.column(c).to_numpy(zero_copy_only=False)
                            for c in ("root", "value", "kind"))) + ".parquet"
        hidden = os.path.join(self.acks_dir, "." + name)
        pq.write_table(table, hidden)
        os.replace(hidden, os.path.join(self.acks_dir, name))

    def ack_stream(self, spark, max_files_per_trigger: int | None = None):
        """The ack records as a streaming DataFrame, for the acker query."""
        # a file some other writer got wrong is skipped (and logged by Spark), not fatal;
        # rows with missing columns come as nulls, which the acker reports as invalid
        reader = spark.readStream.schema(ACK_RECORD_DDL).option("ignoreCorruptFiles", "true")
        if max_files_per_trigger:
            reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
        return reader.parquet(self.acks_dir)

    # --- completions ------------------------------------------------------------

    def write_completions(self, table: pa.Table, batch_id: int) -> None:
        """Write one acker batch's completions; idempotent per batch id."""
        final = os.path.join(self.done_dir, f"{batch_id:012d}.parquet")
        if os.path.exists(final):
            return  # written before a restart; a re-run of a batch yields the same rows
        if table.num_rows:
            hidden = os.path.join(self.done_dir, f".{batch_id:012d}.parquet")
            pq.write_table(as_table(table, COMPLETION_SCHEMA), hidden)
            os.replace(hidden, final)

    def completions_since(self, after_batch: int | None = None) -> tuple[pa.Table, int]:
        """Completions of acker batches after ``after_batch`` (None: from the first), and
        the last batch id read: the position to pass next time."""
        after_batch = -1 if after_batch is None else after_batch
        batch_ids = sorted(
            int(m.group(1)) for m in map(_DONE_FILE.match, os.listdir(self.done_dir)) if m
        )
        newer = [b for b in batch_ids if b > after_batch]
        tables = [
            pq.read_table(os.path.join(self.done_dir, f"{b:012d}.parquet"), schema=COMPLETION_SCHEMA)
            for b in newer
        ]
        table = pa.concat_tables(tables) if tables else COMPLETION_SCHEMA.empty_table()
        return table, (newer[-1] if newer else after_batch)

    def end_position(self) -> int:
        """The position after every completion written so far: a new reader starts
        here, because old completions in a reused folder carry the same root ids."""
        return max((int(m.group(1)) for m in map(_DONE_FILE.match, os.listdir(self.done_dir))
                    if m), default=-1)

    def close(self) -> None:
        """Nothing to release (the Kafka channel closes its producer)."""

    def clear(self) -> None:
        """Remove every record of this channel (tests and demos only)."""
        shutil.rmtree(self.directory, ignore_errors=True)
        self.__init__(self.directory)


def open_channel(config):
    """The channel a source's ``SourceConfig`` names: a local folder, or "kafka" for the
    topics ``<topology>.acks``/``.done`` on the upstream's brokers."""
    if config.channel == "kafka":
        from ackstream.sinks.kafka_channel import KafkaChannel

        channel = KafkaChannel(config.bootstrap_servers, config.topology)
        channel.prepare()
        return channel
    return LocalChannel(config.channel)

