"""A batch's new offset ranges read by Spark's own Kafka connector, lineage added in SQL.

With ``ackstream.recordReader=spark`` the records stay in the JVM: the source plans
the batch as ever (its offset names every record), its Python read tasks read only
the replays, and the topology's batch reads the new ranges the offset names with
Spark's Kafka connector (:mod:`ackstream.sources.kafka_ranges`), then adds the lineage
columns in SQL, by the same ``xxhash64`` as the Python reader's
(:mod:`ackstream.ids`), so a record gets the same root whichever reader read it. A
value over ``ackstream.maxValueBytes`` is held back as the Python reader holds it
back (``_reason`` set; untracked, or with ``maxValueBytes=none``, nothing is held
back, and the column is left out: a batch without it pays for no count of held rows);
an offset with no record (compaction, transaction markers) has no row at all, which
is its right outcome: a planned root no stage failed completes acked.

Replays stay on the Python reader: they are few, single offsets, and each needs its
own attempt number.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from ackstream import ids
from ackstream.config import SourceConfig
from ackstream.lineage import ATTEMPT, EDGE, REASON, ROOT
from ackstream.sources.kafka_ranges import read_ranges
from ackstream.sources.offsets import new_ranges
from ackstream.sources.rows import too_big_reason

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
    # untracked, or with no size limit, nothing is held back: no column to drop again
    if config.tracking and config.admission.max_value_bytes is not None:
        lineage.append(f"{_held_back(config.admission.max_value_bytes)} AS {REASON}")
    return records.selectExpr("*", *lineage)


def _held_back(limit: int) -> str:
    """``_reason`` of a row, in SQL: why it is held back from the stages, else null."""
    prefix, suffix = (_sql_string(part) for part in too_big_reason("\0", limit).split("\0"))
    return f"CASE WHEN length(value) > {limit} THEN concat({prefix}, length(value), {suffix}) END"


def _sql_string(text: str) -> str:
    """``text`` as a SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
