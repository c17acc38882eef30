"""Rows the source held back (an offset with no record, a value over
``ackstream.maxValueBytes``) are settled by the batch before any stage sees them."""

import pytest
from pyspark.sql import functions as F

from ackstream.acker.ledger import Pending, step
from ackstream.lineage import NO_RECORD, REASON
from ackstream.sinks.memory import MemorySink
from ackstream.sources.offsets import planned_inits
from ackstream.testing import tracked_frame
from ackstream.topology import Topology

pytestmark = pytest.mark.spark

TOO_BIG = "value of 99 bytes is over ackstream.maxValueBytes (10); raise that option to process it"


@pytest.mark.parametrize(
    "ack_mode, planned", [("telescoped", True), ("telescoped", False), ("per_stage", False)]
)
def test_held_back_rows_are_rejected_or_acked_and_no_stage_sees_them(spark, ack_mode, planned):
    values = ["a", None, None, "d"]
    offset = F.col("offset")
    batch = tracked_frame(spark, values).withColumn(
        REASON, F.when(offset == 1, TOO_BIG).when(offset == 2, NO_RECORD)
    )
    sink = MemorySink()
    topology = (
        Topology("held", spark, None, ack_mode=ack_mode)
        .reject_where(F.col("value").isNull(), "value is null")  # what a stage would say
        .sink(sink)
    )
    inits = planned_inits({"read": {"t": {"0": [0, 4]}}, "source": "test"}, 0) if planned else None
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
