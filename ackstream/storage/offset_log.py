"""The one reader of Spark's offset log: which records a topology batch holds.

Spark writes ``<checkpoint>/offsets/<batch id>`` before it runs a batch: a
version line, a metadata line, then one line per source of the query (``-`` for
a source with none). An ``ackstream`` source's offset names every record of its
batch (see :mod:`ackstream.sources.offsets`), so a topology knows the batch's
roots without reading its rows a second time, and which topology, channel and
message timeout the source was given.
"""

from __future__ import annotations

import json
import os
import re
from typing import TYPE_CHECKING, Any

from ackstream.errors import AckstreamError
from ackstream.storage.checkpoint_files import is_url, list_names, read_text, remove
from ackstream.vocabulary.batch_offset import BatchOffset

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "batch_timestamp_ms",
    "clear_unfinished_first_entry",
    "logged_offsets",
    "source_offsets",
]

#: The hidden file Spark writes an entry to before renaming it into place (and its checksum).
_UNFINISHED_ENTRY = re.compile(r"^\.+\d+\..+\.tmp(\.crc)?$")


def logged_offsets(spark: SparkSession, checkpoint: str, batch_id: int) -> list[BatchOffset]:
    """The ``ackstream`` offsets Spark logged for ``batch_id`` of the query whose
    checkpoint is ``checkpoint`` (one per ackstream source of the query).

    A plain path is read directly; a URL (``file:``, ``hdfs:``, ``s3a:``...) through
    Spark's Hadoop file system, which costs about ten times as much (calls into the JVM);
    under Spark Connect, which has no JVM in this process, a URL is read as a text file
    with ``spark.read`` (a small Spark job per batch). An ``ackstream`` offset this
    version cannot read raises :class:`~ackstream.vocabulary.batch_offset.BatchOffsetError`."""
    return [
        BatchOffset.from_json(offset)
        for offset in source_offsets(spark, checkpoint, batch_id)
        if BatchOffset.is_ours(offset)
    ]


def source_offsets(spark: SparkSession, checkpoint: str, batch_id: int) -> list[Any]:
    """Every source's end offset for ``batch_id`` as JSON, in the query's source order
    (None for a source without one)."""
    out = []
    for line in _logged(spark, checkpoint, batch_id).splitlines()[2:]:
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append(None)  # "-": no offset
    return out


def batch_timestamp_ms(spark: SparkSession, checkpoint: str, batch_id: int) -> int:
    """The time Spark gave ``batch_id`` when it planned it (its processing time, the same
    when the batch runs again after a crash)."""
    metadata = _logged(spark, checkpoint, batch_id).splitlines()[1]
    return int(json.loads(metadata)["batchTimestampMs"])


def clear_unfinished_first_entry(spark: SparkSession, checkpoint: str) -> None:
    """Remove what a query stopped while it wrote its first offset log entry left behind.

    Spark writes an entry to a hidden temporary file and renames it into place; a stop
    that lands between the two leaves the temporary file. A query whose log holds no
    entry starts at batch 0, and Spark refuses to start it when the log's folder holds
    any file at all (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``): without this, a
    query stopped in its first planning could never start again from its checkpoint.
    Once the log holds an entry, Spark passes over such leftovers. (Under Spark Connect
    a checkpoint at a URL cannot be listed from here and is left as it is.)"""
    folder = f"{checkpoint.rstrip('/')}/offsets"
    names = list_names(spark, folder) or []
    if any(name.isdigit() for name in names):
        return
    for name in names:
        if _UNFINISHED_ENTRY.match(name):
            remove(spark, f"{folder}/{name}")


def _logged(spark: SparkSession, checkpoint: str, batch_id: int) -> str:
    """The text of the offset log's entry for ``batch_id``."""
    path = f"{checkpoint.rstrip('/')}/offsets/{batch_id}"
    if not is_url(path):
        _check_not_deleted(checkpoint)
    text = read_text(spark, path)
    if text is None:
        raise FileNotFoundError(f"Spark's offset log has no batch {batch_id}: {path}")
    return text


def _check_not_deleted(checkpoint: str) -> None:
    """Spark writes ``<checkpoint>/metadata`` once, when the query first starts, and
    re-creates the rest of a deleted checkpoint as it goes: without this check the
    query would run on, and a restart would not know where it was."""
    if not os.path.exists(os.path.join(checkpoint, "metadata")):
        raise AckstreamError(
            f"the checkpoint {checkpoint} was deleted while the query ran (its metadata "
            "file is gone). Start the query again from a new checkpoint: the source "
            "resumes from its consumer group's commits (startingOffsets=committed)"
        )
