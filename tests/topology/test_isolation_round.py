"""A round of isolation computes its sinks' input before writing: which batches are
rounds, and that a stage raising reaches no sink while a clean one is written once."""

import pytest
from pyspark.sql import functions as F

from ackstream.topology.isolation_round import ComputedFirst, is_isolation_round

from helpers import logged_offset

ROUNDS = {
    "round": [[3, 3]],
    "size": [[3, 8]],
    "failed": [[3, 0]],
    "children": [],
    "systematic": [],
    "flying": 3,
}


def test_a_batch_replaying_only_while_rounds_are_under_way_is_a_round():
    assert is_isolation_round(
        [logged_offset(source="t", replays=[["in", 0, 5, 9, 1]], rounds=ROUNDS)]
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"source": "t", "replays": [["in", 0, 5, 9, 1]]},  # no rounds under way
        {"source": "t", "replays": [], "rounds": ROUNDS},  # nothing replayed
        # new records beside the replays: not a group planned on its own
        {
            "source": "t",
            "replays": [["in", 0, 5, 9, 1]],
            "read": {"in": {"0": [9, 20]}},
            "rounds": ROUNDS,
        },
        {"replays": [["in", 0, 5, 9, 1]]},  # untracked
    ],
)
def test_other_batches_are_not_rounds(fields):
    assert not is_isolation_round([logged_offset(**fields)])


class Recording:
    def __init__(self):
        self.written = []

    def write(self, outputs, batch_id):
        self.written.append(sorted(r["value"] for r in outputs.collect()))

    def close(self):
        pass


def test_a_stage_raising_reaches_no_sink(spark):
    sink = Recording()
    rows = spark.range(100).withColumn(
        "value", F.when(F.col("id") == 60, F.raise_error(F.lit("poison"))).otherwise(F.col("id"))
    )
    with pytest.raises(Exception, match="poison"):
        ComputedFirst(sink).write(rows, 7)
    assert sink.written == []


def test_clean_outputs_are_written_once_from_their_cache(spark):
    sink, calls = Recording(), spark.sparkContext.accumulator(0)

    def counted(v):
        calls.add(1)
        return v

    rows = spark.range(50).withColumn("value", F.udf(counted, "long")("id"))
    ComputedFirst(sink).write(rows, 7)
    assert sink.written == [list(range(50))]
    assert calls.value == 50  # the stage ran once: the sink read the cache
