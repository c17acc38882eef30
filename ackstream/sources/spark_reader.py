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

Replays are read here too when they come in a few long runs (a batch that failed
whole, an outage: :func:`~ackstream.sources.offsets.spark_reads_replays`), each run's
attempt in its lineage; records replayed here and there, and a record replayed
alone, are read by the Python reader.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from ackstream import ids
from ackstream.config import SourceConfig
from ackstream.lineage import ATTEMPT, EDGE, ROOT
from ackstream.sources.kafka_ranges import read_ranges
from ackstream.sources.offsets import new_ranges, replay_runs
from ackstream.sources.rows import kafka_columns, too_big_reason

__all__ = ["read_new_ranges", "read_replays"]


def read_new_ranges(spark, config: SourceConfig, offset: dict) -> DataFrame | None:
    """The records of the new ranges ``offset`` names, as the ``ackstream`` source's rows
    (its columns and lineage), or None when it names none."""
    ranges = new_ranges(offset)
    if not ranges:
        return None
    return _with_lineage(read_ranges(spark, config, ranges), config, offset, 0)


def read_replays(spark, config: SourceConfig, offset: dict) -> DataFrame | None:
    """The records ``offset`` replays, as the source's rows, when Spark's reader reads them
    (``"replays_by": "spark"``, see :func:`~ackstream.sources.offsets.spark_reads_replays`);
    else None. Per attempt, one range per partition covers its runs, filtered to them."""
    if offset.get("replays_by") != "spark":
        return None
    by_attempt: dict[int, list[tuple[str, int, int, int]]] = {}
    for topic, partition, start, end, attempt in replay_runs(offset):
        by_attempt.setdefault(attempt, []).append((topic, partition, start, end))
    frames = []
    for attempt, runs in sorted(by_attempt.items()):
        cover: dict[tuple[str, int], list[int]] = {}
        for topic, partition, start, end in runs:
            span = cover.setdefault((topic, partition), [start, end])
            span[0], span[1] = min(span[0], start), max(span[1], end)
        records = read_ranges(spark, config, [(*tp, lo, hi) for tp, (lo, hi) in cover.items()])
        if len(cover) < len(runs):  # some partition's runs have gaps between them
            records = records.where(
                " OR ".join(
                    f"(topic = {_sql_string(t)} AND partition = {p} AND offset >= {a} "
                    f"AND offset < {b})"
                    for t, p, a, b in runs
                )
            )
        frames.append(_with_lineage(records, config, offset, attempt))
    for frame in frames[1:]:
        frames[0] = frames[0].unionByName(frame)
    return frames[0]


def _with_lineage(records: DataFrame, config: SourceConfig, offset: dict, attempt: int):
    """``records`` (Spark's Kafka rows) with the source's lineage columns at ``attempt``,
    in one projection of SQL text: each Column built in Python is a call into the JVM,
    and each further DataFrame call another analysis of the plan."""
    root = (
        f"xxhash64({_sql_string(offset.get('ids', config.id_namespace))}, topic, "
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
