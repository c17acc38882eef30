"""A batch's new offset ranges read by Spark's own Kafka connector, lineage added in SQL.

With ``ackstream.recordReader=spark`` the records stay in the JVM: the source plans
the batch as ever (its offset names every record), its Python read tasks read only
the replays, and the topology's batch reads the new ranges the offset names with
Spark's Kafka connector (:mod:`ackstream.sources.kafka_ranges`), then adds the lineage
columns in SQL, by the same ``xxhash64`` as the Python reader's
(:mod:`ackstream.vocabulary.ids`), so a record gets the same root whichever reader read it. An
offset with no record (compaction, transaction markers) has no row at all, which is
its right outcome: a planned root no stage failed completes acked.

A value over ``ackstream.maxValueBytes`` (tracked) is not held back here, as the
Python reader holds it back: telling the batch about such rows costs a count on
every batch (a Spark ``Observation``, which stops code generation where it
watches), for a record that is rare. Instead a job that reads such a value fails,
naming the record and the option; the batch then fails as a whole, its records are
replayed apart (:mod:`ackstream.topology.batch_failure`), and the Python reader,
which reads replays, holds the record back as rejected. A stage that never reads
the value never pays the check. Untracked, or with ``maxValueBytes=none``, there is
no limit.

Replays are read here too (:func:`~ackstream.sources.offsets.spark_reads_replays`),
each run's attempt in its lineage, a range covering a partition's runs filtered to
them; a record replayed alone is read by the Python reader, which holds back a value
over the limit instead of failing the batch on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ackstream.config.source import SourceConfig
from ackstream.sources.kafka_ranges import read_ranges
from ackstream.sources.offsets import covering
from ackstream.sources.rows import kafka_columns, too_big_reason
from ackstream.vocabulary import ids
from ackstream.vocabulary.batch_offset import BatchOffset
from ackstream.vocabulary.lineage import ATTEMPT, EDGE, ROOT

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["read_new_ranges", "read_replays"]


def read_new_ranges(
    spark: SparkSession, config: SourceConfig, offset: BatchOffset
) -> DataFrame | None:
    """The records of the new ranges ``offset`` names, as the ``ackstream`` source's rows
    (its columns and lineage), or None when it names none."""
    ranges = offset.new_ranges()
    if not ranges:
        return None
    return _with_lineage(read_ranges(spark, config, ranges), config, offset, 0)


def read_replays(
    spark: SparkSession, config: SourceConfig, offset: BatchOffset
) -> DataFrame | None:
    """The records ``offset`` replays, as the source's rows, when Spark's reader reads them
    (``spark_reads_replays``, see :func:`~ackstream.sources.offsets.spark_reads_replays`);
    else None. Per attempt, ranges that cover its runs
    (:func:`~ackstream.sources.offsets.covering`), filtered to them: by their bounds
    when there are a few, else by a join with the offsets replayed."""
    if not offset.spark_reads_replays:
        return None
    by_attempt: dict[int, list[tuple[str, int, int, int]]] = {}
    for topic, partition, start, end, attempt in offset.replays:
        by_attempt.setdefault(attempt, []).append((topic, partition, start, end))
    frames = []
    for attempt, runs in sorted(by_attempt.items()):
        ranges = covering(runs)
        records = read_ranges(spark, config, ranges)
        if len(ranges) < len(runs):  # gaps between some runs: keep the runs' records
            records = _within_runs(spark, records, runs)
        frames.append(_with_lineage(records, config, offset, attempt))
    for frame in frames[1:]:
        frames[0] = frames[0].unionByName(frame)
    return frames[0]


#: Runs of replays filtered by their bounds in SQL up to this many; more by a join.
_BOUNDED_RUNS = 32


def _within_runs(
    spark: SparkSession, records: DataFrame, runs: list[tuple[str, int, int, int]]
) -> DataFrame:
    """The rows of ``records`` whose offsets are in one of ``runs``."""
    if len(runs) <= _BOUNDED_RUNS:
        return records.where(
            " OR ".join(
                f"(topic = {_sql_string(t)} AND partition = {p} AND offset >= {a} AND offset < {b})"
                for t, p, a, b in runs
            )
        )
    sizes = [b - a for _, _, a, b in runs]
    wanted = pd.DataFrame(
        {
            "topic": np.repeat([t for t, *_ in runs], sizes),
            "partition": np.repeat([p for _, p, *_ in runs], sizes).astype(np.int32),
            "offset": np.concatenate([np.arange(a, b) for _, _, a, b in runs]),
        }
    )
    replayed = spark.createDataFrame(wanted, "topic string, partition int, offset long")
    return records.join(F.broadcast(replayed), ["topic", "partition", "offset"], "left_semi")


def _with_lineage(
    records: DataFrame, config: SourceConfig, offset: BatchOffset, attempt: int
) -> DataFrame:
    """``records`` (Spark's Kafka rows) with the source's lineage columns at ``attempt``,
    in one projection of SQL text: each Column built in Python is a call into the JVM,
    and each further DataFrame call another analysis of the plan."""
    root = (
        f"xxhash64({_sql_string(offset.namespace or config.id_namespace)}, topic, "
        f"CAST(partition AS BIGINT), offset, {attempt}L)"
    )
    lineage = [
        f"{root} AS {ROOT}",
        f"xxhash64({root}, {ids.SPOUT_STAGE}L, 0L) AS {EDGE}",
        f"{attempt}L AS {ATTEMPT}",
    ]
    limit = config.value_limit
    if limit is None:
        return records.selectExpr("*", *lineage)
    kafka = kafka_columns(config.kafka.include_headers)
    guarded = [_guarded_value(limit) if name == "value" else name for name in kafka]
    return records.selectExpr(*guarded, *lineage)


def _guarded_value(limit: int) -> str:
    """The ``value`` column in SQL, failing the task that reads a value over ``limit``
    with the Python reader's reason, the record named first."""
    message = _sql_string(f"record %s-%d at offset %d: {too_big_reason('%d', limit)}")
    raised = f"raise_error(format_string({message}, topic, partition, offset, length(value)))"
    return f"CASE WHEN length(value) > {limit} THEN {raised} ELSE value END AS value"


def _sql_string(text: str) -> str:
    """``text`` as a SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
