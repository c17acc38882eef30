"""A batch's new offset ranges read by Spark's own Kafka connector, lineage added in SQL.

With ``ackstream.recordReader=spark`` the records stay in the JVM: the source plans
the batch as ever (its offset names every record), its Python read tasks read only
the replays, and the topology's batch reads the new ranges the offset names with
Spark's Kafka connector (:mod:`ackstream.sources.kafka_ranges`), then adds the lineage
columns in SQL, by the same ``xxhash64`` as the Python reader's
(:mod:`ackstream.ids`), so a record gets the same root whichever reader read it. An
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

Replays stay on the Python reader: they are few, single offsets, and each needs its
own attempt number.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from ackstream import ids
from ackstream.config import SourceConfig
from ackstream.lineage import ATTEMPT, EDGE, ROOT
from ackstream.sources.kafka_ranges import read_ranges
from ackstream.sources.offsets import new_ranges
from ackstream.sources.rows import kafka_columns, too_big_reason

__all__ = ["read_new_ranges"]


def read_new_ranges(spark, config: SourceConfig, offset: dict) -> DataFrame | None:
    """The records of the new ranges ``offset`` names, as the ``ackstream`` source's rows
    (its columns and lineage), or None when it names none."""
    ranges = new_ranges(offset)
    if not ranges:
        return None
    records = read_ranges(spark, config, ranges)
    # one projection in SQL text: each Column built in Python is a call into the JVM,
    # and each further DataFrame call another analysis of the plan
    root = (
        f"xxhash64({_sql_string(offset.get('ids', config.id_namespace))}, topic, "
        "CAST(partition AS BIGINT), offset, 0L)"
    )
    lineage = [
        f"{root} AS {ROOT}",
        f"xxhash64({root}, {ids.SPOUT_STAGE}L, 0L) AS {EDGE}",
        f"0L AS {ATTEMPT}",
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
