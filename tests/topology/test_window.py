"""Count windows: tuples held across micro-batches, acked when their window emits.

The batch-level tests run ``Topology.run_batch`` twice on a real session (the held
store in memory) and feed each batch's ack records through the acker's ledger, as
the acker query would; the started tests run the generator source, the topology and
acker queries on a local channel."""

import os

import pytest
from pyspark.sql import functions as F

from ackstream.errors import StageError
from ackstream.sinks.memory import MemorySink
from ackstream.testing import settle, tracked_frame
from ackstream.topology import Topology
from ackstream.topology.bolts import BatchContext
from ackstream.topology.modes import ACK_MODES, TELESCOPED
from ackstream.vocabulary.records import ACKED, FAILED, NOTICES, TIMED_OUT

from helpers import start_on_generator, stop_once_settled
from helpers import through_ledger as ledger

pytestmark = pytest.mark.spark
MODES = pytest.mark.parametrize("ack_mode", sorted(ACK_MODES))


def roots(frame):
    return [r["_root"] for r in frame.orderBy("offset").collect()]


def windowed(spark, ack_mode, sink, fail=None):
    topology = Topology("win", spark, None, ack_mode=ack_mode).window(
        "value", F.sort_array(F.collect_list("offset")).alias("offsets"), count=3, name="w"
    )
    if fail is not None:
        topology = topology.fail_where(fail, "downstream")
    return topology.sink(sink)


@MODES
def test_held_tuples_keep_their_roots_open_until_the_window_emits(spark, ack_mode):
    """Batch 0 brings two "a" (held) and one "b" (held); batch 1 one more "a": the "a"
    window emits offsets from both batches and both batches' "a" roots are acked; the
    "b" root stays pending in the acker, its tuple held."""
    sink = MemorySink()
    topology = windowed(spark, ack_mode, sink)
    first = tracked_frame(spark, ["a", "b", "a"], partition=0)
    second = tracked_frame(spark, ["a"], partition=1)
    records0 = topology.run_batch(first, 0)
    assert set(settle(records0).values()) == {"pending"}  # nothing closes in batch 0
    assert sink.rows() == []
    records1 = topology.run_batch(second, 1)
    assert [r["offsets"] for r in sink.rows()] == [[0, 0, 2]]
    a0, b, a2 = roots(first)
    (a1,) = roots(second)
    outcome, pending = ledger([records0, records1])
    assert outcome == {a0: ACKED, a2: ACKED, a1: ACKED}
    assert pending == {b}


@MODES
@pytest.mark.parametrize(
    "failing_window",
    [
        pytest.param(
            lambda spark, ack_mode, sink: windowed(
                spark, ack_mode, sink, fail=F.size("offsets") == 3
            ),
            id="window",
        ),
        pytest.param(
            lambda spark, ack_mode, sink: after_aggregate(
                spark, ack_mode, sink, fail=F.col("total") == 3
            ),
            id="window after an aggregate",
        ),
    ],
)
def test_a_failed_window_row_fails_every_root_it_was_anchored_to(spark, ack_mode, failing_window):
    """The window's row (of tuples, or of an aggregate's rows) is anchored to tuples of two
    batches; a stage after it fails the row, and all three roots fail (their records
    replay); nothing is written."""
    sink = MemorySink()
    topology = failing_window(spark, ack_mode, sink)
    first = tracked_frame(spark, ["a", "a"], partition=0)
    second = tracked_frame(spark, ["a"], partition=1)
    records = [topology.run_batch(first, 0), topology.run_batch(second, 1)]
    outcome, pending = ledger(records)
    assert outcome == dict.fromkeys(roots(first) + roots(second), FAILED)
    assert pending == set()
    assert sink.rows() == []


@MODES
def test_a_batch_run_again_starts_from_the_held_tuples_before_it(spark, ack_mode):
    """Spark re-runs a batch after a crash: the window must not hold its tuples twice
    (two "a" held, then batch 1 run twice with one more "a": one window each time)."""
    sink = MemorySink()
    topology = windowed(spark, ack_mode, sink)
    topology.run_batch(tracked_frame(spark, ["a", "a"], partition=0), 0)
    again = tracked_frame(spark, ["a"], partition=1)
    topology.run_batch(again, 1)
    topology.run_batch(again, 1)
    assert [r["offsets"] for r in sink.rows()] == [[0, 0, 1], [0, 0, 1]]
    (stage,) = topology.stages
    assert stage.holding.store(None).before(spark, 2).rows.toArrow().num_rows == 0


def test_a_held_tuple_whose_root_has_an_outcome_is_dropped(spark, tmp_path):
    """Two "a" held; the first's root fails elsewhere (a completion on the channel): the
    next batch's "a" does not fill the window with it, as its record is replayed."""
    from ackstream.channels.local import LocalChannel
    from ackstream.vocabulary.records import completion_table

    channel = LocalChannel(str(tmp_path / "channel"))
    channel.prepare()
    sink = MemorySink()
    topology = Topology("win", spark, channel).window(
        "value", F.sort_array(F.collect_list("offset")).alias("offsets"), count=3, name="w"
    )
    topology = topology.sink(sink)
    first = tracked_frame(spark, ["a", "a"], partition=0)
    topology.run_batch(first, 0)
    channel.write_completions(completion_table([roots(first)[0]], FAILED, reason="elsewhere"))
    topology.run_batch(tracked_frame(spark, ["a"], partition=1), 1)
    assert sink.rows() == []
    held = topology.stages[0].holding.store(None).before(spark, 2).rows.toArrow()
    assert sorted(held.column("offset").to_pylist()) == [0, 1]  # offset 1 of p0, 0 of p1


def test_with_tracking_off_a_window_still_holds_across_batches(spark):
    sink = MemorySink()
    topology = (
        Topology("plain", spark, None, tracking=False)
        .window("value", F.sort_array(F.collect_list("offset")).alias("offsets"), count=2)
        .sink(sink)
    )
    assert topology.run_batch(tracked_frame(spark, ["a", "b", "a", "a"]), 0).num_rows == 0
    assert [r["offsets"] for r in sink.rows()] == [[0, 2]]
    topology.run_batch(tracked_frame(spark, ["b", "a"], partition=1), 1)
    # "b" held from offset 1 with the new one at 0; "a" held from 3 with the new one at 1
    assert sorted(r["offsets"] for r in sink.rows()) == [[0, 1], [0, 2], [1, 3]]


def sliding(spark, ack_mode, sink, folder=None, tracking=True):
    """Windows of the last three "value" tuples every two, of (partition, offset)."""
    topology = Topology("slide", spark, None, ack_mode=ack_mode, tracking=tracking)
    topology = topology.window(
        "value",
        F.sort_array(F.collect_list(F.struct("partition", "offset"))).alias("at"),
        count=3,
        slide=2,
        name="w",
    ).sink(sink)
    topology.held_folder = folder
    return topology


def emitted(sink):
    return sorted([(at["partition"], at["offset"]) for at in r["at"]] for r in sink.rows())


@MODES
def test_a_sliding_count_window_emits_every_slide_and_holds_what_later_windows_need(
    spark, ack_mode, tmp_path
):
    """Storm's Count.of(3) sliding by Count.of(2), per key: batch 0's three "a" fill the
    window of the first two (a key's first windows hold fewer, as Storm's do); the
    first is released, acked. Batch 1's three more "a" emit the windows ending at the
    4th and 6th "a", across batches; only the 6th is held for the window of the 8th.
    The "b" stays held, its root pending; a new topology on the same folder (a restart)
    goes on from the places saved."""
    sink = MemorySink()
    folder = str(tmp_path / "held")
    topology = sliding(spark, ack_mode, sink, folder)
    first = tracked_frame(spark, ["a", "a", "a", "b"], partition=0)
    records0 = topology.run_batch(first, 0)
    assert emitted(sink) == [[(0, 0), (0, 1)]]
    a0, a1, a2, b = roots(first)
    assert settle(records0)[a0] == ACKED and settle(records0)[a1] == "pending"

    topology = sliding(spark, ack_mode, sink, folder)  # a restart: only the folder is kept
    second = tracked_frame(spark, ["a", "a", "a"], partition=1)
    records1 = topology.run_batch(second, 1)
    assert emitted(sink) == [
        [(0, 0), (0, 1)],
        [(0, 1), (0, 2), (1, 0)],
        [(1, 0), (1, 1), (1, 2)],
    ]
    outcome, pending = ledger([records0, records1])
    a3, a4, a5 = roots(second)
    assert outcome == dict.fromkeys([a0, a1, a2, a3, a4], ACKED)
    assert pending == {b, a5}
    held = topology.stages[0].holding.store(folder).before(spark, 2).rows.toArrow()
    assert sorted(zip(held.column("value").to_pylist(), held.column("offset").to_pylist())) == [
        ("a", 2),
        ("b", 3),
    ]


def test_a_sliding_count_window_over_uneven_batches_gives_storms_windows(spark, tmp_path):
    """Two keys over four batches of uneven sizes, Count.of(4) sliding by Count.of(3) (a
    slide that does not divide the count): the windows emitted are Storm's, each key's
    window of its last four tuples at every third, computed here from the tuples'
    arrival order alone."""
    sink = MemorySink()
    topology = Topology("uneven", spark, None).window(
        "value",
        F.sort_array(F.collect_list(F.struct("partition", "offset"))).alias("at"),
        count=4,
        slide=3,
    )
    topology = topology.sink(sink)
    topology.held_folder = str(tmp_path / "held")
    batches = [["a"], ["b", "a", "a", "b", "a"], ["a", "a"], ["a", "b", "b", "a", "a"]]
    arrived: dict[str, list[tuple[int, int]]] = {"a": [], "b": []}
    for number, values in enumerate(batches):
        topology.run_batch(tracked_frame(spark, values, partition=number), number)
        for offset, value in enumerate(values):
            arrived[value].append((number, offset))
    storms = sorted(
        tuples[max(0, last - 4) : last]
        for tuples in arrived.values()
        for last in range(3, len(tuples) + 1, 3)
    )
    assert emitted(sink) == storms
    assert len(storms) == 4  # "a" at its 3rd, 6th, 9th; "b" at its 3rd


def test_a_sliding_count_window_run_again_fills_the_same_windows(spark, tmp_path):
    """Spark runs batch 1 again after a crash: the same two windows, the same tuple
    held; untracked the window slides alike."""
    for tracking in (True, False):
        sink = MemorySink()
        folder = str(tmp_path / f"held-{tracking}")
        topology = sliding(spark, "telescoped", sink, folder, tracking=tracking)
        topology.run_batch(tracked_frame(spark, ["a", "a", "a"], partition=0), 0)
        again = tracked_frame(spark, ["a", "a", "a"], partition=1)
        topology.run_batch(again, 1)
        topology.run_batch(again, 1)
        windows = emitted(sink)
        assert windows == sorted(
            [[(0, 0), (0, 1)]] + [[(0, 1), (0, 2), (1, 0)], [(1, 0), (1, 1), (1, 2)]] * 2
        ), tracking
        held = topology.stages[0].holding.store(folder).before(spark, 2).rows.toArrow()
        assert held.column("offset").to_pylist() == [2], tracking


def test_window_arguments_are_checked(spark):
    with pytest.raises(StageError, match="count=0: give a whole number"):
        Topology("w", spark, None).window("value", F.count("*"), count=0)
    with pytest.raises(StageError, match="may not hold '/'"):
        Topology("w", spark, None).window("value", F.count("*"), count=2, name="a/b")
    with pytest.raises(StageError, match="at least one aggregate"):
        Topology("w", spark, None).window("value", count=2)
    for slide in (0, 3, "1s", True):
        with pytest.raises(StageError, match=rf"slide={slide!r}: a count window slides by"):
            Topology("w", spark, None).window("value", F.count("*"), count=2, slide=slide)


def after_aggregate(spark, ack_mode, sink, channel=None, fail=None):
    """Per batch, a count of each value; then a window of two such counts per value."""
    topology = (
        Topology("agg-win", spark, channel, ack_mode=ack_mode)
        .aggregate("value", F.count("*").alias("n"))
        .window("value", F.sum("n").alias("total"), count=2, name="w")
    )
    if fail is not None:
        topology = topology.fail_where(fail, "downstream")
    return topology.sink(sink)


@MODES
def test_a_window_after_an_aggregate_holds_every_root_of_a_count(spark, ack_mode):
    """Batch 0: "a" twice and "b" count as two rows, each held. Batch 1's "a" fills the
    "a" window: the three "a" roots of both batches are acked; "b" stays pending."""
    sink = MemorySink()
    topology = after_aggregate(spark, ack_mode, sink)
    first = tracked_frame(spark, ["a", "b", "a"], partition=0)
    second = tracked_frame(spark, ["a"], partition=1)
    records = [topology.run_batch(first, 0), topology.run_batch(second, 1)]
    assert [(r["value"], r["total"]) for r in sink.rows()] == [("a", 3)]
    a0, b, a2 = roots(first)
    outcome, pending = ledger(records)
    assert outcome == dict.fromkeys([a0, a2, *roots(second)], ACKED)
    assert pending == {b}


@MODES
def test_a_held_count_with_a_failed_root_is_dropped_and_fails_its_other_roots(
    spark, tmp_path, ack_mode
):
    """The held count of two "a" has one root failed elsewhere: the next batch drops it
    (its content comes back with the replays) and fails its other root at once, with a
    reason naming the window; the new "a" is held alone."""
    from ackstream.channels.local import LocalChannel
    from ackstream.vocabulary.records import completion_table

    channel = LocalChannel(str(tmp_path / "channel"))
    channel.prepare()
    sink = MemorySink()
    topology = after_aggregate(spark, ack_mode, sink, channel=channel)
    first = tracked_frame(spark, ["a", "a"], partition=0)
    records = [topology.run_batch(first, 0)]
    failed, other = roots(first)
    channel.write_completions(completion_table([failed], FAILED, reason="elsewhere"))
    records.append(topology.run_batch(tracked_frame(spark, ["a"], partition=1), 1))
    assert sink.rows() == []
    fails = [r for r in records[1].to_pylist() if r["root"] == other]
    assert [r["reason"] for r in fails] == [
        "held in window stage w with a root that failed or timed out"
    ]
    outcome, _ = ledger(records)
    assert outcome[other] == FAILED and failed not in outcome
    held = topology.stages[1].holding.store(None).before(spark, 2).rows.toArrow()
    assert held.num_rows == 1


@MODES
def test_a_window_after_a_window(spark, ack_mode):
    """Two count windows in a row: pairs, then pairs of pairs. Four "a" in two batches
    make one row of the second window; every root is acked once it emits."""
    sink = MemorySink()
    topology = (
        Topology("win-win", spark, None, ack_mode=ack_mode)
        .window("value", F.count("*").alias("n"), count=2, name="pairs")
        .window("value", F.sum("n").alias("total"), count=2, name="quads")
        .sink(sink)
    )
    first = tracked_frame(spark, ["a", "a", "a"], partition=0)
    second = tracked_frame(spark, ["a"], partition=1)
    records = [topology.run_batch(first, 0)]
    assert ledger(records)[0] == {}
    records.append(topology.run_batch(second, 1))
    assert [(r["value"], r["total"]) for r in sink.rows()] == [("a", 4)]
    outcome, pending = ledger(records)
    assert outcome == dict.fromkeys(roots(first) + roots(second), ACKED)
    assert pending == set()


def started(spark, tmp_path, count, timeout_ms=60_000, ack_mode="telescoped", **options):
    """The generator (one partition, ``count`` records) through a count window of 3 over
    one key, with the offsets and attempts of each window, into a memory sink."""
    from ackstream.channels.local import LocalChannel

    channel = LocalChannel(str(tmp_path / "channel"))
    sink = MemorySink()
    topology = (
        Topology("held", spark, channel, message_timeout_ms=timeout_ms, ack_mode=ack_mode)
        .map(lambda df: df.withColumn("k", F.lit("all")))
        .window(
            "k",
            F.sort_array(F.collect_list("offset")).alias("offsets"),
            F.sort_array(F.collect_list("_attempt")).alias("attempts"),
            count=3,
            name="w",
        )
        .sink(sink)
    )
    options = {"ackstream.retryInitialDelay": "50ms", **options}
    return topology, sink, start_on_generator(topology, tmp_path / "ckpt", count, **options)


@pytest.mark.parametrize(
    "ack_mode", ["telescoped", pytest.param("per_stage", marks=pytest.mark.long)]
)
def test_held_tuples_stay_unacked_and_survive_a_restart(spark, tmp_path, ack_mode):
    """Two records held (no completion, nothing committed, status shows them); the query
    stops and starts again from its checkpoint with four more records: the first window
    holds the two from before the restart and one new, the second three new; all six
    roots are acked once and every offset committed."""
    from ackstream.ui.status_sources import held_in, local_status

    from helpers import commits, stop_once_held

    channel_dir, checkpoint = str(tmp_path / "channel"), str(tmp_path / "ckpt")
    topology, sink, running = started(spark, tmp_path, 2, ack_mode=ack_mode)
    stop_once_held(running, "held", channel_dir, checkpoint, "w", 2)
    status = local_status(channel_dir, "held")
    assert (status.acked, status.failed, status.timed_out) == (0, 0, 0)
    assert commits(channel_dir).get("generator/0", 0) == 0
    assert sink.rows() == []
    assert held_in(checkpoint) == {"w": {"tuples": 2, "roots": 2}}

    topology, sink, running = started(spark, tmp_path, 6, ack_mode=ack_mode)
    stop_once_settled(running, 6, timeout_s=120)
    assert commits(channel_dir) == {"generator/0": 6}
    assert sorted((r["offsets"], r["attempts"]) for r in sink.rows()) == [
        ([0, 1, 2], [0, 0, 0]),
        ([3, 4, 5], [0, 0, 0]),
    ]
    done = topology.channel.completions_since(None)[0].to_pylist()
    done = [c for c in done if c["status"] not in NOTICES]
    assert sorted((c["offset"], c["attempt"], c["status"]) for c in done) == [
        (o, 0, ACKED) for o in range(6)
    ]
    assert held_in(checkpoint) == {"w": {"tuples": 0, "roots": 0}}


@pytest.mark.e2e
def test_a_window_that_never_fills_times_its_roots_out_and_they_are_replayed(spark, tmp_path):
    """Two records for a window of three: both time out in the acker (3 s), are replayed
    and held again (not beside their first attempts: that would fill the window), time
    out again and are dead-lettered after one retry. Nothing is written. (The source's
    own timeout is set long, so that every timeout is the acker's, with a completion.)"""
    from ackstream import read_dead_letters

    from helpers import commits

    channel_dir = str(tmp_path / "channel")
    topology, sink, running = started(
        spark,
        tmp_path,
        2,
        timeout_ms=3_000,
        **{"ackstream.maxRetries": "1", "ackstream.sourceTimeout": "120s"},
    )
    stop_once_settled(running, 2, timeout_s=180)
    assert commits(channel_dir) == {"generator/0": 2}
    done = topology.channel.completions_since(None)[0].to_pylist()
    done = [c for c in done if c["status"] not in NOTICES]
    assert sorted((c["offset"], c["attempt"], c["status"]) for c in done) == [
        (o, a, TIMED_OUT) for o in (0, 1) for a in (0, 1)
    ]
    letters = read_dead_letters(os.path.join(channel_dir, "dead_letters")).to_pylist()
    assert sorted((d["offset"], d["attempts"]) for d in letters) == [(0, 2), (1, 2)]
    assert sink.rows() == []


@pytest.mark.e2e
@pytest.mark.broker
def test_on_kafka_a_failed_window_replays_its_roots_from_three_batches(
    spark, broker, new_topic, tmp_path
):
    """Kafka upstream and channel, two records a batch: "a" at offsets 0, 2, 4 and "b"
    at 1, 3, 5 each fill a window only in the third batch. A stage fails the "a" window
    on its first attempt: its three roots, read in three batches, all fail and replay,
    fill the window again and are acked; "b" is acked at once. Every offset committed."""

    from ackstream.channels.kafka import KafkaChannel

    from helpers import new_inbox, run_on_kafka

    inbox, name = new_inbox(broker, new_topic, "win", "ababab")
    channel, sink = KafkaChannel(broker.bootstrap, name), MemorySink()
    topology = (
        Topology(name, spark, channel, message_timeout_ms=60_000)
        .map(lambda df: df.withColumn("v", F.col("value").cast("string")))
        .window(
            "v",
            F.sort_array(F.collect_list("offset")).alias("offsets"),
            F.max("_attempt").alias("attempt"),
            count=3,
        )
        .fail_where((F.col("v") == "a") & (F.col("attempt") == 0), "a: first attempt")
        .sink(sink)
    )
    options = {"ackstream.sourceTimeout": "120s", "ackstream.retryInitialDelay": "50ms"}
    committed = run_on_kafka(topology, broker.bootstrap, inbox, tmp_path / "ckpt", 6, **options)
    assert committed == {0: 6}
    done = channel.completions_since(None)[0].to_pylist()
    assert sorted((c["offset"], c["attempt"], c["status"]) for c in done) == sorted(
        [(o, 0, FAILED) for o in (0, 2, 4)]
        + [(o, 1, ACKED) for o in (0, 2, 4)]
        + [(o, 0, ACKED) for o in (1, 3, 5)]
    )
    assert sorted((r["v"], r["offsets"], r["attempt"]) for r in sink.rows()) == [
        ("a", [0, 2, 4], 1),
        ("b", [1, 3, 5], 0),
    ]


def test_two_equal_tuples_of_one_root_held_get_ids_that_do_not_cancel(spark):
    """A root's XOR would close early if two of its held tuples shared a hold id; a tuple
    without a root gets an id too (the store names it when it is released)."""
    from ackstream.topology.holding import Holding

    rows = spark.createDataFrame([(7, "a"), (7, "a"), (None, "b")], "_root long, v string")
    batch = BatchContext(TELESCOPED, 5, 0, None, 1, None)
    stamped = Holding("w", 2, "window").stamp(rows, ["v"], batch)
    ids = [r["_hold"] for r in stamped.collect()]
    assert None not in ids and len(set(ids)) == 3


@MODES
def test_a_batch_run_again_gives_the_same_hold_ids_and_fills_the_same_windows(spark, ack_mode):
    """Spark runs batch 1 again after a crash, its rows read in another order: the window
    of three "a" takes the same three (the batch's arrival order
    is its offsets'), holds the fourth with the same id, and the batch's ack records are
    the same (a local channel writes them over the first run's, so no
    hold is left that no release will match)."""
    sink = MemorySink()
    topology = windowed(spark, ack_mode, sink)
    topology.run_batch(tracked_frame(spark, ["b"], partition=0), 0, now_ms=1_000_000)
    batch = tracked_frame(spark, ["a", "a", "a", "a", "b"], partition=1)
    store = topology.stages[0].holding.store(None)

    def held():
        rows = store.before(spark, 2).rows.orderBy("_hold").collect()
        return [(r["_hold"], r["value"], r["offset"]) for r in rows]

    def records(frame):  # what a local channel names a file of ack records by: not ts
        records = topology.run_batch(frame, 1, now_ms=1_001_000)
        return records.drop_columns(["ts"]).sort_by("root").to_pylist()

    first = records(batch.coalesce(1))
    held_first = held()
    backwards = batch.toPandas().iloc[::-1]  # the same rows in the reverse order
    assert records(spark.createDataFrame(backwards, batch.schema)) == first
    assert held() == held_first
    assert sorted(h[1:] for h in held_first) == [("a", 3), ("b", 0), ("b", 4)]
    assert [r["offsets"] for r in sink.rows()] == [[0, 1, 2]] * 2


def test_an_aggregate_a_window_reads_collects_its_rows_roots_itself(spark):
    """Telescoped, an aggregate's rows carry ``_group`` (their roots are looked up in
    its input only if one fails); one that a window reads, however far downstream,
    gives them their roots in its own aggregation, so the window never reads the
    aggregate's input again."""
    sink = MemorySink()
    topology = (
        Topology("agg-map-win", spark, None)
        .aggregate("value", F.count("*").alias("n"), name="counts")
        .map(lambda df: df.withColumn("m", F.col("n") * 2), name="doubled")
        .window("value", F.sum("m").alias("total"), count=2, name="w")
        .sink(sink)
    )
    plain = Topology("agg", spark, None).aggregate("value", F.count("*").alias("n"))
    batch = tracked_frame(spark, ["a", "b", "a"])
    telescoped = BatchContext(TELESCOPED, 0, 0, None, 30_000, None)
    counts = topology.stages[0].run(batch, telescoped)
    assert counts.groups is None and "_group" not in counts.tuples.columns
    anchored = {
        r["value"]: sorted(a["root"] for a in r["_anchors"]) for r in counts.tuples.collect()
    }
    a0, b, a2 = roots(batch)
    assert anchored == {"a": sorted([a0, a2]), "b": [b]}
    assert "_group" in plain.stages[0].run(batch, telescoped).tuples.columns
