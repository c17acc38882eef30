"""Rows the source held back (an offset with no record, a value over
``ackstream.maxValueBytes``) are settled by the batch before any stage sees them."""

import pytest
from pyspark.sql import functions as F

from ackstream.acker.ledger import Pending, step
from ackstream.sinks.memory import MemorySink
from ackstream.sources.offsets import PlannedRoots
from ackstream.testing import tracked_frame
from ackstream.topology import Topology
from ackstream.topology.held_watch import HeldWatch
from ackstream.vocabulary.lineage import NO_RECORD, REASON

from helpers import logged_offset

pytestmark = pytest.mark.spark

TOO_BIG = "value of 99 bytes is over ackstream.maxValueBytes (10); raise that option to process it"


class PeekingSink(MemorySink):
    """A sink whose first Spark job reads part of the batch (as ``if df.isEmpty()``
    does in many a foreachBatch): a count of held-back rows from it would be short."""

    def write(self, outputs, batch_id: int):
        if not outputs.isEmpty():
            super().write(outputs, batch_id)


def with_held_rows(spark, values):
    """``values`` at offsets 0, 1, ...; offset 1 held back as too big, 2 as no record."""
    offset = F.col("offset")
    return tracked_frame(spark, values).withColumn(
        REASON, F.when(offset == 1, TOO_BIG).when(offset == 2, NO_RECORD)
    )


@pytest.mark.parametrize(
    "ack_mode, planned, sink",
    [
        ("telescoped", True, MemorySink),
        ("telescoped", True, PeekingSink),
        ("telescoped", False, MemorySink),
        ("per_stage", False, MemorySink),
    ],
)
def test_held_back_rows_are_rejected_or_acked_and_no_stage_sees_them(
    spark, ack_mode, planned, sink
):
    values = ["a", None, None, "d"]
    batch = with_held_rows(spark, values)
    sink = sink()
    topology = (
        Topology("held", spark, None, ack_mode=ack_mode)
        .reject_where(F.col("value").isNull(), "value is null")  # what a stage would say
        .sink(sink)
    )
    inits = (
        PlannedRoots.of_offsets([logged_offset(read={"t": {"0": [0, 4]}}, source="test")], 0).inits
        if planned
        else None
    )
    records = topology.run_batch(batch, inits=inits)

    _, done = step(Pending.empty(0), records.to_pandas(), 0, 60_000)
    roots = {r["offset"]: r["_root"] for r in batch.collect()}
    outcome = {row["root"]: (row["status"], row["reason"]) for row in done.to_dict("records")}
    assert outcome == {
        roots[0]: ("acked", None),
        roots[1]: ("rejected", TOO_BIG),
        roots[2]: ("acked", None),
        roots[3]: ("acked", None),
    }
    assert sorted(r["value"] for r in sink.rows()) == ["a", "d"]
    assert all(REASON not in row for row in sink.rows())


def test_the_watch_counts_held_back_rows_only_from_a_job_that_read_every_row(spark):
    batch = with_held_rows(spark, ["a", None, None, "d", "e", "f"]).repartition(3)
    unread = HeldWatch(batch, planned=6)
    assert unread.held() is None  # no job yet: unknown, never a wait

    whole = HeldWatch(batch, planned=6)
    whole.frame.where(f"{REASON} IS NULL").toArrow()
    assert whole.held() == 2

    part = HeldWatch(batch, planned=6)
    part.frame.limit(1).collect()
    assert part.held() is None  # a job that saw part of the batch does not count

    other = HeldWatch(batch, planned=7)  # rows planned that the job did not see
    other.frame.toArrow()
    assert other.held() is None

    assert HeldWatch(batch.limit(0), planned=0).held() == 0  # nothing planned, nothing read
