"""The ack records of one micro-batch of a local channel, read on the driver with pyarrow.

The acker's ``foreachBatch`` could ask Spark for a batch's rows (``toArrow``), but
then the JVM decodes every Parquet file into rows and re-encodes them as Arrow,
one row at a time: about ten times the ledger's own time. Spark's file stream
already names the files of each batch in the checkpoint, so the acker reads them
itself and Spark never touches their contents:

- ``<checkpoint>/offsets/<batch id>`` ends with the file source's offset,
  ``{"logOffset": n}``; the batch holds the files the source logged after the
  previous batch's ``n`` up to its own;
- ``<checkpoint>/sources/0/<n>`` lists the files logged as ``n``, one JSON line
  each (``{"path": ..., "batchId": n}``) after a version line; every tenth log is
  compacted into ``<m>.compact``, which holds the entries of every log up to ``m``.

A file is read as Spark's reader with the acker's schema and ``ignoreCorruptFiles``
would: a missing column is null, an unreadable file is logged and skipped.
:func:`batch_records` returns None where it cannot tell the files (a checkpoint at
a URL, a log it does not recognise); the acker then asks Spark.
"""

from __future__ import annotations

import json
import logging
import os
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq

from ackstream.vocabulary.records import ACK_RECORD_SCHEMA

__all__ = ["batch_records"]

log = logging.getLogger(__name__)


def batch_records(checkpoint: str, batch_id: int) -> pa.Table | None:
    """Every ack record of micro-batch ``batch_id`` of the acker query whose checkpoint
    is ``checkpoint`` (a plain path), or None if the batch's files cannot be told."""
    if urlparse(checkpoint).scheme:
        return None
    end = _log_offset(checkpoint, batch_id)
    start = _log_offset(checkpoint, batch_id - 1) if batch_id > 0 else -1
    if end is None or start is None:
        return None
    paths = []
    for n in range(start + 1, end + 1):
        logged = _logged_files(checkpoint, n)
        if logged is None:
            return None
        paths += logged
    tables = [ACK_RECORD_SCHEMA.empty_table()] + [t for t in map(_read, paths) if t is not None]
    return pa.concat_tables(tables)


def _log_offset(checkpoint: str, batch_id: int) -> int | None:
    try:
        with open(os.path.join(checkpoint, "offsets", str(batch_id)), encoding="utf-8") as f:
            lines = f.read().splitlines()
        return int(json.loads(lines[2])["logOffset"])
    except (OSError, IndexError, KeyError, TypeError, ValueError):
        return None


def _logged_files(checkpoint: str, n: int) -> list[str] | None:
    """Local paths of the files the source logged as ``n`` (None if not found)."""
    folder = os.path.join(checkpoint, "sources", "0")
    name = str(n)
    if not os.path.exists(os.path.join(folder, name)):
        compacted = sorted(
            int(f.split(".")[0])
            for f in os.listdir(folder)
            if f.endswith(".compact") and f.split(".")[0].isdigit()
        )
        later = [m for m in compacted if m >= n]
        if not later:
            return None
        name = f"{later[0]}.compact"
    paths = []
    with open(os.path.join(folder, name), encoding="utf-8") as f:
        for line in f.read().splitlines()[1:]:
            entry = json.loads(line)
            if entry.get("batchId", n) != n:
                continue
            url = urlparse(entry["path"])
            if url.scheme not in ("", "file"):
                return None
            paths.append(unquote(url.path))
    return paths


def _read(path: str) -> pa.Table | None:
    try:
        table = pq.read_table(path)
        columns = [
            table.column(f.name).cast(f.type)
            if f.name in table.column_names
            else pa.nulls(table.num_rows, f.type)
            for f in ACK_RECORD_SCHEMA
        ]
    except (pa.ArrowException, OSError) as problem:
        log.warning("ackstream acker: skipped unreadable ack file %s: %s", path, problem)
        return None
    return pa.Table.from_arrays(columns, schema=ACK_RECORD_SCHEMA)
