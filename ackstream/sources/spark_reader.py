"""A batch's new offset ranges read by Spark's own Kafka source, lineage added in SQL.

With ``ackstream.recordReader=spark`` the records stay in the JVM: the source plans
the batch as ever (its offset names every record), its Python read tasks read only
the replays, and the topology's batch reads the new ranges the offset names with
``spark.read.format("kafka")`` (exact starting and ending offsets per partition), then
adds the lineage columns as Spark expressions equal to the Python reader's
(:func:`ackstream.ids.spark_root_id`: the same ``xxhash64``), so a record gets the same
root whichever reader read it. A value over ``ackstream.maxValueBytes`` is held back
as the Python reader holds it back (``_reason`` set); an offset with no record
(compaction, transaction markers) has no row at all, which is its right outcome: a
planned root no stage failed completes acked.

Replays stay on the Python reader: they are few, single offsets, and each needs its
own attempt number.
"""

from __future__ import annotations

import json

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ackstream import ids
from ackstream.config import SourceConfig
from ackstream.lineage import ATTEMPT, EDGE, REASON, ROOT
from ackstream.sources.offsets import new_ranges
from ackstream.sources.rows import too_big_reason

__all__ = ["has_connector", "read_new_ranges"]


def has_connector(spark) -> bool:
    """Whether ``spark`` can load Spark's Kafka source (``spark-sql-kafka-0-10`` on its
    class path, e.g. by ``spark.jars.packages``). Asked by resolving a batch read's
    schema, which touches no broker, so it works under Spark Connect too."""
    try:
        reader = spark.read.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:9")
        reader.option("subscribe", "ackstream-probe").load().schema  # noqa: B018
    except Exception:  # not found (or refused): the Python reader reads
        return False
    return True


def read_new_ranges(spark, config: SourceConfig, offset: dict) -> DataFrame | None:
    """The records of the new ranges ``offset`` names, as the ``ackstream`` source's rows
    (its columns and lineage), or None when it names none."""
    ranges = new_ranges(offset)
    if not ranges:
        return None
    assign: dict[str, list[int]] = {}
    starts: dict[str, dict[str, int]] = {}
    ends: dict[str, dict[str, int]] = {}
    for topic, partition, start, end in ranges:
        assign.setdefault(topic, []).append(partition)
        starts.setdefault(topic, {})[str(partition)] = start
        ends.setdefault(topic, {})[str(partition)] = end
    options = {
        "kafka.bootstrap.servers": config.bootstrap_servers,
        **{f"kafka.{key}": value for key, value in config.kafka_options},
        "assign": json.dumps(assign),
        "startingOffsets": json.dumps(starts),
        "endingOffsets": json.dumps(ends),
        "failOnDataLoss": str(config.fail_on_data_loss).lower(),
        "includeHeaders": str(config.include_headers).lower(),
    }
    if config.min_partitions:
        options["minPartitions"] = str(config.min_partitions)
    if config.max_records_per_partition:
        options["maxRecordsPerPartition"] = str(config.max_records_per_partition)
    records = spark.read.format("kafka").options(**options).load()
    root = ids.spark_root_id(offset.get("ids", config.id_namespace), attempt=0)
    return (
        records.withColumn(ROOT, root)
        .withColumn(EDGE, ids.spark_child_edge(ROOT, ids.SPOUT_STAGE, 0))
        .withColumn(ATTEMPT, F.lit(0).cast("long"))
        .withColumn(REASON, _held_back(config))
    )


def _held_back(config: SourceConfig):
    """``_reason`` of a row: why it is held back from the stages, else null."""
    if not config.tracking:  # nothing is held back untracked, as in the Python reader
        return F.lit(None).cast("string")
    prefix, suffix = too_big_reason("\0", config.max_value_bytes).split("\0")
    size = F.length("value")
    return F.when(size > config.max_value_bytes, F.concat(F.lit(prefix), size, F.lit(suffix)))
