"""Exact Kafka offset ranges as a DataFrame, read by Spark's Kafka connector without
planning a read.

``spark.read.format("kafka")`` with exact starting and ending offsets still plans a
read every time a plan holds it: the driver makes an admin client, asks the brokers
for the topics and the offsets it was given, and closes it again, and the tasks take
new consumers under a group id of their own. The topology's batch already knows its
ranges, so this module hands them to the connector's own record RDD as they are and
makes the rows with the connector's own converter: the same columns and values as
Spark's Kafka source, no admin client, and one executor group id per process, so
tasks reuse the consumers the executors pool, as Spark's streaming Kafka source does.

The record RDD and the converter are the connector's internal classes (package-private
in Scala, public to the JVM), so this path has a way back: under Spark Connect (no JVM
to call), with options that split ranges (``minPartitions``,
``maxRecordsPerPartition``), or when the connector has no such classes, the ranges are
read through ``spark.read.format("kafka")``.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame

from ackstream.config.source import SourceConfig
from ackstream.kafka.settings import jvm_client_settings
from ackstream.spark.session import is_connect, kafka_through_v2

if TYPE_CHECKING:
    from py4j.java_gateway import JavaObject, JVMView
    from pyspark.sql import SparkSession

#: ``(topic, partition, from, to)``, ``to`` exclusive
Range = tuple[str, int, int, int]

__all__ = ["read_ranges"]

log = logging.getLogger(__name__)

#: the executors' consumer group for the record RDD: one per process, so that a batch's
#: tasks borrow the consumers earlier batches left in the executors' pool
EXECUTOR_GROUP = f"spark-kafka-ackstream-{uuid.uuid4().hex}"

#: Kafka settings of the executors' consumers unless the source's options name them.
#: Their ranges hold records already written, so a fetch the broker holds back waiting
#: for new ones only delays the next fetch: with pooled consumers, a batch that read a
#: backlog up to the end of its partitions waited out Kafka's default of 500 ms. And
#: the connector asks the brokers for a partition's offsets around each poll: at
#: Kafka's default of 500 records a poll, a range read tens of polls, each with its
#: offset requests, for the one or two fetches that brought its records. A poll hands
#: over what its fetches already hold, so a larger count costs no memory.
EXECUTOR_DEFAULTS = {"fetch.max.wait.ms": "10", "max.poll.records": "100000"}

_unavailable: list[str] = []  # why the record RDD cannot be used in this process


def read_ranges(spark: SparkSession, config: SourceConfig, ranges: list[Range]) -> DataFrame:
    """The records of ``ranges`` (``(topic, partition, from, to)``, ``to`` exclusive) as
    the rows of Spark's Kafka source, headers included when ``config`` asks for them."""
    records = _through_record_rdd(spark, config, ranges)
    return records if records is not None else _through_kafka_source(spark, config, ranges)


def _kafka_params(config: SourceConfig) -> dict[str, str]:
    """The Kafka client settings the source was given (its ``kafka.*`` options), in the
    names Java's client reads."""
    return {
        "bootstrap.servers": config.kafka.bootstrap_servers or "",
        **jvm_client_settings(dict(config.kafka.options)),
    }


def _through_record_rdd(
    spark: SparkSession, config: SourceConfig, ranges: list[Range]
) -> DataFrame | None:
    """The ranges read by the connector's record RDD; None where that path is closed."""
    admission = config.admission
    if _unavailable or is_connect(spark):
        return None
    if admission.min_partitions or admission.max_records_per_partition:
        return None  # Spark's source splits the ranges into tasks as those options say
    try:
        reader = RecordRdd.of(spark, config)
        frame = reader.read(spark, ranges)
    except Exception as error:  # a connector without these classes, or none at all
        _unavailable.append(f"{type(error).__name__}: {error}")
        log.info(
            "Spark's Kafka record RDD is not usable here (%s); batches read their ranges "
            'through spark.read.format("kafka")',
            _unavailable[0].splitlines()[0],
        )
        return None
    return DataFrame(frame, spark)


class RecordRdd:
    """What the record RDD path needs of the JVM, made once per process and settings:
    each piece is a call into the JVM, and a batch should make only its ranges."""

    _made: dict[tuple[Any, ...], RecordRdd] = {}

    def __init__(self, spark: SparkSession, config: SourceConfig):
        # never None here: a Spark Connect session (no JVM) is turned away before
        jvm: JVMView = spark._jvm  # noqa: SLF001 - no Python API reads exact ranges
        self.kafka = jvm.org.apache.spark.sql.kafka010
        self.utils = jvm.org.apache.spark.api.python.PythonUtils
        self.partitions: dict[tuple[str, int], object] = {}
        self.unplaced = jvm.scala.Option.empty()
        settings = {**EXECUTOR_DEFAULTS, **_kafka_params(config)}
        self.params = self.kafka.KafkaSourceProvider.kafkaParamsForExecutors(
            self.utils.toScalaMap(settings), EXECUTOR_GROUP
        )
        self.context = spark._jsc.sc()  # noqa: SLF001
        # Spark's Kafka source's default poll timeout (ackstream takes no pollTimeoutMs)
        self.poll_timeout_ms = self.context.conf().getTimeAsMs("spark.network.timeout", "120s")
        self.fail_on_data_loss = config.kafka.fail_on_data_loss
        converter = self.kafka.KafkaRecordToRowConverter()
        headers = config.kafka.include_headers
        self.to_row = (
            converter.toInternalRowWithHeaders()
            if headers
            else converter.toInternalRowWithoutHeaders()
        )
        row_type = jvm.java.lang.Class.forName("org.apache.spark.sql.catalyst.InternalRow")
        self.row_tag = jvm.scala.reflect.ClassTag.apply(row_type)
        self.schema = self.kafka.KafkaRecordToRowConverter.kafkaSchema(headers)
        self.topic_partition = jvm.org.apache.kafka.common.TopicPartition

    @classmethod
    def of(cls, spark: SparkSession, config: SourceConfig) -> RecordRdd:
        # the JVM objects live as long as the gateway; the settings are the Kafka options
        key = (spark._sc._gateway, config.kafka)  # noqa: SLF001
        made = cls._made.get(key)
        if made is None:
            made = cls._made[key] = cls(spark, config)
        return made

    def read(self, spark: SparkSession, ranges: list[Range]) -> JavaObject:
        """The JVM DataFrame of ``ranges``."""
        offset_ranges = self.utils.toSeq(
            [
                self.kafka.KafkaOffsetRange(
                    self._partition(topic, partition), start, end, self.unplaced
                )
                for topic, partition, start, end in ranges
            ]
        )
        records = self.kafka.KafkaSourceRDD(
            self.context, self.params, offset_ranges, self.poll_timeout_ms, self.fail_on_data_loss
        )
        rows = records.map(self.to_row, self.row_tag)
        return spark._jsparkSession.internalCreateDataFrame(rows, self.schema, False)  # noqa: SLF001

    def _partition(self, topic: str, partition: int) -> JavaObject:
        key = (topic, partition)
        if key not in self.partitions:
            self.partitions[key] = self.topic_partition(topic, partition)
        return self.partitions[key]


def _through_kafka_source(
    spark: SparkSession, config: SourceConfig, ranges: list[Range]
) -> DataFrame:
    """The ranges read by ``spark.read.format("kafka")`` with exact offsets."""
    assign: dict[str, list[int]] = {}
    starts: dict[str, dict[str, int]] = {}
    ends: dict[str, dict[str, int]] = {}
    for topic, partition, start, end in ranges:
        assign.setdefault(topic, []).append(partition)
        starts.setdefault(topic, {})[str(partition)] = start
        ends.setdefault(topic, {})[str(partition)] = end
    settings = {**EXECUTOR_DEFAULTS, **_kafka_params(config)}
    options = {
        **{f"kafka.{key}": value for key, value in settings.items()},
        "assign": json.dumps(assign),
        "startingOffsets": json.dumps(starts),
        "endingOffsets": json.dumps(ends),
        "failOnDataLoss": str(config.kafka.fail_on_data_loss).lower(),
        "includeHeaders": str(config.kafka.include_headers).lower(),
    }
    if config.admission.min_partitions:
        options["minPartitions"] = str(config.admission.min_partitions)
    if config.admission.max_records_per_partition:
        options["maxRecordsPerPartition"] = str(config.admission.max_records_per_partition)
    with kafka_through_v2(spark):  # not version 1: a nested SQL execution per read
        return spark.read.format("kafka").options(**options).load()
