"""A batch's records from its offset alone: the read tasks, the roots a topology settles
without reading the batch, and the offsets read back from Spark's offset log."""

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ackstream.config.source import parse
from ackstream.sources import offsets
from ackstream.sources.datasource import AckstreamStreamReader
from ackstream.storage.offset_log import logged_offsets
from ackstream.vocabulary.batch_offset import BatchOffset
from ackstream.vocabulary.records import INIT

from helpers import logged_offset, wait_for

GENERATOR = {
    "ackstream.upstream": "generator",
    "ackstream.topology": "plans",
    "ackstream.generator.partitions": "2",
    "ackstream.generator.count": "40",
}


def rows_read(reader, start, end):
    """``(root, topic, partition, offset, attempt)`` of every row ``read()`` yields."""
    out = set()
    for part in reader.partitions(start, end):
        for batch in reader.read(part):
            cols = batch.to_pydict()
            out |= set(
                zip(
                    cols["_root"],
                    cols["topic"],
                    cols["partition"],
                    cols["offset"],
                    cols["_attempt"],
                )
            )
    return out


def test_the_planned_roots_are_the_roots_the_batch_reads(tmp_path, monkeypatch):
    """Replays included, and over several tasks: what the topology acks from the offset
    is exactly what read() hands the stages."""
    monkeypatch.setattr(offsets, "ROWS_PER_TASK", 7)
    config = parse({**GENERATOR, "ackstream.channel": str(tmp_path)})
    reader = AckstreamStreamReader(config)
    start = reader.initialOffset()
    end = dict(reader.latestOffset(start, None), replays=[["generator", 1, 3, 2]])
    assert len(reader.partitions(start, end)) == 3 + 3 + 1
    inits = offsets.PlannedRoots.of_offsets([BatchOffset.from_json(end)], 1234).inits
    planned = set(
        zip(
            *(
                inits.column(c).to_pylist()
                for c in ("root", "topic", "partition", "offset", "attempt")
            )
        )
    )
    assert planned == rows_read(reader, start, end)
    assert len(planned) == 40 + 1
    assert set(inits.column("kind").to_pylist()) == {INIT}
    assert set(inits.column("value").to_pylist()) == {0}  # telescoped: the batch acks it all
    assert set(inits.column("ts").to_pylist()) == {1234}


def test_with_tracking_off_no_root_is_planned(tmp_path):
    config = parse({**GENERATOR, "ackstream.channel": str(tmp_path), "ackstream.tracking": "false"})
    reader = AckstreamStreamReader(config)
    end = reader.latestOffset(reader.initialOffset(), None)
    planned = offsets.PlannedRoots.of_offsets([BatchOffset.from_json(end)], 0)
    assert end["read"] and planned.inits.num_rows == 0


@pytest.mark.spark
def test_the_offset_logged_under_a_batch_id_names_that_batch_s_rows(spark, tmp_path):
    """Spark's offset log, read back under foreachBatch's batch id (directly and through
    the JVM), plans exactly the rows of that batch, batch after batch."""
    checkpoint = str(tmp_path / "checkpoint")
    stream = (
        spark.readStream.format("ackstream")
        .options(
            **{
                **GENERATOR,
                "ackstream.generator.count": "60",
                "ackstream.channel": str(tmp_path / "channel"),
                "maxOffsetsPerTrigger": "20",
            }
        )
        .load()
    )
    compared = []

    def check(batch, batch_id):
        rows = {r["_root"] for r in batch.select("_root").collect()}
        logged = logged_offsets(spark, checkpoint, batch_id)
        through_jvm = logged_offsets(
            spark, "file://" + os.path.abspath(checkpoint), batch_id
        )  # a URL: read by Hadoop in the JVM
        planned = offsets.PlannedRoots.of_offsets([logged[0]], 0).inits.column("root").to_numpy()
        compared.append((batch_id, rows == set(planned.tolist()), logged == through_jvm, len(rows)))

    query = (
        stream.writeStream.foreachBatch(check)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        wait_for(
            lambda: sum(n for *_, n in compared) >= 60 or query.exception(),
            timeout=120,
            what="every generated record in a batch",
        )
    finally:
        query.stop()
    assert query.exception() is None
    assert [c[:3] for c in compared] == [(i, True, True) for i in range(len(compared))]
    assert len(compared) >= 3 and np.sum([n for *_, n in compared]) == 60


def test_min_partitions_cuts_big_ranges_in_proportion_as_sparks_kafka_source():
    end = logged_offset(read={"t": {"0": [0, 900], "1": [0, 100]}}, replays=[["t", 1, 5, 1]])
    assert len(offsets.read_tasks(end)) == 3  # a range per partition, the replays
    tasks = offsets.read_tasks(end, min_partitions=10)
    ranges = [(t.partition, t.start, t.end) for t in tasks if not t.replays]
    assert [r for r in ranges if r[0] == 0] == [(0, 100 * i, 100 * i + 100) for i in range(9)]
    assert [r for r in ranges if r[0] == 1] == [(1, 0, 100)]
    assert tasks[-1].replays == ((5, 1),)  # replays are not cut
    # never a task without an offset, whatever the minimum
    tiny = offsets.read_tasks(logged_offset(read={"t": {"0": [7, 10]}}), min_partitions=50)
    assert [(t.start, t.end) for t in tiny] == [(7, 8), (8, 9), (9, 10)]


def test_max_records_per_partition_cuts_ranges_and_replays_as_sparks_kafka_source():
    replays = [["t", 1, off, 1] for off in range(5)]
    end = logged_offset(read={"t": {"0": [0, 900], "1": [0, 100]}}, replays=replays)
    tasks = offsets.read_tasks(end, max_records_per_partition=300)
    ranges = [(t.partition, t.start, t.end) for t in tasks if not t.replays]
    assert ranges == [(0, 0, 300), (0, 300, 600), (0, 600, 900), (1, 0, 100)]
    assert [len(t.replays) for t in tasks if t.replays] == [5]
    tasks = offsets.read_tasks(end, min_partitions=10, max_records_per_partition=2)
    assert max(t.end - t.start for t in tasks if not t.replays) == 2
    assert [t.replays for t in tasks if t.replays] == [
        ((0, 1), (1, 1)),
        ((2, 1), (3, 1)),
        ((4, 1),),
    ]


def test_the_source_plans_its_tasks_with_max_records_per_partition(tmp_path):
    options = {**GENERATOR, "ackstream.channel": str(tmp_path), "maxRecordsPerPartition": "7"}
    reader = AckstreamStreamReader(parse(options))
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)
    sizes = [p.task.end - p.task.start for p in reader.partitions(start, end)]
    assert sorted(sizes) == [6, 6, 7, 7, 7, 7]  # 20 offsets on each of 2 partitions


@settings(deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b"]), st.integers(0, 2), st.integers(0, 60), st.integers(0, 3)
        ),
        unique_by=lambda r: (r[0], r[1], r[2]),
        max_size=80,
    )
)
def test_replays_logged_as_runs_plan_the_same_roots_as_one_entry_each(replays):
    """A batch replaying a whole failed batch logs a run per partition, not an entry per
    record (a batch of 100,000 replays made an offset of megabytes); the runs name
    exactly the records, and an offset logged with an entry each still reads alike."""
    runs = offsets.runs_of(replays)
    assert len(runs) <= len(replays)
    expanded = [
        (t, p, off, att)
        for t, p, lo, hi, att in logged_offset(replays=runs).replays
        for off in range(lo, hi)
    ]
    assert sorted(expanded) == sorted(replays)
    roots = [
        sorted(
            offsets.PlannedRoots.of_offsets([logged_offset(ids="s", replays=r)], 5)
            .inits.column("root")
            .to_pylist()
        )
        for r in (runs, [list(x) for x in replays])
    ]
    assert roots[0] == roots[1]
    contiguous = [("a", 0, off, 2) for off in range(10, 20_010)]
    assert offsets.runs_of(contiguous) == [["a", 0, 10, 20_010, 2]]


def test_replays_of_many_runs_plan_each_offset_once_with_its_root():
    """Scattered failures replay as many runs (topics, partitions and attempts mixed):
    every offset of every run is planned once, with the root of its own coordinates."""
    from ackstream.vocabulary import ids

    runs = [["a", 0, 5, 8, 1], ["b", 1, 100, 101, 2], ["a", 0, 20, 21, 1], ["a", 2, 0, 4, 3]]
    end = logged_offset(source="s", ids="ns", replays=runs)
    inits = offsets.PlannedRoots.of_offsets([end], 7).inits
    names = ("root", "topic", "partition", "offset", "attempt")
    planned = list(zip(*(inits.column(c).to_pylist() for c in names)))
    expected = [
        (int(ids.root_ids("ns", t, p, [off], [att])[0]), t, p, off, att)
        for t, p, lo, hi, att in runs
        for off in range(lo, hi)
    ]
    assert sorted(planned) == sorted(expected) and len(planned) == 3 + 1 + 1 + 4
