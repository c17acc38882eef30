"""Pre-combine ack records per root in the JVM before they leave a batch.

XOR is associative, so all records of one root in a batch fold into one: values
by ``bit_xor``, fail/reset bits by ``bit_or``, and the init bit by parity (XOR),
so that a record delivered twice still cancels itself after combination. The
init's coordinates and timestamp survive because they are taken from the init row.
(An init delivered twice in one batch cancels, and with it the coordinates: that
root times out, and the source, which knows its roots, replays it.)
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ackstream.records import INIT

__all__ = ["precombine"]


def precombine(records: DataFrame) -> DataFrame:
    """One ack record per root of ``records`` (``ACK_RECORD_DDL`` columns, any order)."""
    init_bit = F.col("kind").bitwiseAND(F.lit(INIT))
    combined = records.groupBy("root").agg(
        F.bit_xor("value").alias("value"),
        F.bit_or(F.col("kind").bitwiseAND(F.lit(~INIT & 0x7F))).alias("_other"),
        F.bit_xor(init_bit).alias("_init"),
        F.max("topic").alias("topic"),
        F.max("partition").alias("partition"),
        F.max("offset").alias("offset"),
        F.max("attempt").alias("attempt"),
        # the init's ts is the start of the complete latency; others only when none
        F.coalesce(F.max(F.when(init_bit != 0, F.col("ts"))), F.max("ts")).alias("ts"),
        F.max("reason").alias("reason"),  # one of the fails' reasons, the same on a re-run
    )
    return combined.select(
        "root",
        "value",
        F.col("_other").bitwiseOR(F.col("_init")).cast("byte").alias("kind"),
        "topic", "partition", "offset", "attempt", "ts", "reason",
    )
