"""Time windows: tuples held by time, across micro-batches, acked when their last window
closes; the source's idle batches close a processing-time window with no new records.

The batch-level tests run ``Topology.run_batch`` with the batch's time given, and feed
each batch's ack records through the acker's ledger; the started test runs the
generator source, the topology and the acker on a local channel."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import functions as F

from ackstream.errors import StageError
from ackstream.sinks.memory import MemorySink
from ackstream.testing import tracked_frame
from ackstream.topology import Topology
from ackstream.topology.modes import ACK_MODES
from ackstream.vocabulary.records import ACKED, FAILED, REJECTED

from helpers import spark_examples, start_on_generator, stop_once_settled, through_ledger

pytestmark = pytest.mark.spark
MODES = pytest.mark.parametrize("ack_mode", sorted(ACK_MODES))
T = 1_000_000_000_000  # a multiple of every window below: window starts are plain


def roots(frame):
    return [r["_root"] for r in frame.orderBy("offset").collect()]


def empty(spark):
    return tracked_frame(spark, ["x"], partition=9).where("false")


def by_time(spark, ack_mode, sink, fail=None, agg=None, **window):
    agg = F.sort_array(F.collect_list("offset")).alias("offsets") if agg is None else agg
    topology = Topology("tw", spark, None, ack_mode=ack_mode).window(
        "value", agg, name="w", **window
    )
    if fail is not None:
        topology = topology.fail_where(fail, "downstream")
    return topology.sink(sink)


def emitted(sink):
    """(key, window start and end in ms from T, offsets) per output row."""
    return sorted(
        (
            r["value"],
            int(r["window"]["start"].timestamp() * 1000) - T,
            int(r["window"]["end"].timestamp() * 1000) - T,
            r["offsets"],
        )
        for r in sink.rows()
    )


@MODES
def test_a_tumbling_window_closes_when_its_time_has_passed(spark, ack_mode):
    """Tuples of two batches inside one second are held; a batch with no new tuples after
    the second ends closes the window: one row per key, every root acked."""
    sink = MemorySink()
    topology = by_time(spark, ack_mode, sink, duration="1s")
    first = tracked_frame(spark, ["a", "b", "a"], partition=0)
    second = tracked_frame(spark, ["a"], partition=1)
    records = [topology.run_batch(first, 0, now_ms=T + 100)]
    records.append(topology.run_batch(second, 1, now_ms=T + 900))
    outcome, pending = through_ledger(records)
    assert outcome == {} and sink.rows() == []
    assert pending == set(roots(first) + roots(second))
    records.append(topology.run_batch(empty(spark), 2, now_ms=T + 1000))
    assert emitted(sink) == [("a", 0, 1000, [0, 0, 2]), ("b", 0, 1000, [1])]
    outcome, pending = through_ledger(records)
    assert outcome == dict.fromkeys(roots(first) + roots(second), ACKED)
    assert pending == set()


@MODES
def test_a_tuple_in_two_sliding_windows_is_held_until_the_second_closes(spark, ack_mode):
    """Windows of 1 s every 500 ms: a tuple at 250 ms is in [-500, 500) and [0, 1000).
    The first window's row leaves its root pending; the second's acks it."""
    sink = MemorySink()
    topology = by_time(spark, ack_mode, sink, duration=1000, slide=500)
    first = tracked_frame(spark, ["a"], partition=0)
    records = [topology.run_batch(first, 0, now_ms=T + 250)]
    records.append(topology.run_batch(empty(spark), 1, now_ms=T + 500))
    assert emitted(sink) == [("a", -500, 500, [0])]
    outcome, pending = through_ledger(records)
    assert outcome == {} and pending == set(roots(first))
    records.append(topology.run_batch(empty(spark), 2, now_ms=T + 1000))
    assert emitted(sink) == [("a", -500, 500, [0]), ("a", 0, 1000, [0])]
    outcome, pending = through_ledger(records)
    assert outcome == dict.fromkeys(roots(first), ACKED) and pending == set()


@MODES
def test_a_failed_row_of_one_sliding_window_fails_the_roots_in_it(spark, ack_mode):
    """A stage after the window fails the rows of the window that starts at 0: the tuple
    in it fails, though its other window's row was written."""
    sink = MemorySink()
    topology = by_time(
        spark,
        ack_mode,
        sink,
        fail=F.col("window.start") == F.timestamp_millis(F.lit(T)),
        duration=1000,
        slide=500,
    )
    first = tracked_frame(spark, ["a", "b"], partition=0)
    records = [topology.run_batch(first, 0, now_ms=T + 250)]
    records.append(topology.run_batch(empty(spark), 1, now_ms=T + 2000))
    assert emitted(sink) == [("a", -500, 500, [0]), ("b", -500, 500, [1])]
    outcome, pending = through_ledger(records)
    assert outcome == dict.fromkeys(roots(first), FAILED) and pending == set()


@MODES
def test_event_time_windows_close_on_the_watermark_and_late_tuples_are_rejected(spark, ack_mode):
    """Event time from a column of ms, watermark 100 ms behind the largest seen. A tuple
    at 1200 ms moves the watermark to 1100: the window [0, 1000) closes, [1000, 2000)
    stays. Then a tuple at 500 ms is late: rejected with a reason, never held."""
    sink = MemorySink()
    topology = by_time(spark, ack_mode, sink, duration="1s", time="ts", delay="100ms")

    def at(values, times, partition):
        frame = tracked_frame(spark, values, partition=partition)
        stamps = F.element_at(
            F.array(*(F.lit(T + t) for t in times)), F.col("offset").cast("int") + 1
        )
        return frame.withColumn("ts", stamps)

    first = at(["a", "a"], [100, 950], 0)
    second = at(["a"], [1200], 1)
    late = at(["a"], [500], 2)
    records = [topology.run_batch(first, 0), topology.run_batch(second, 1)]
    assert [(k, s, e, o) for k, s, e, o in emitted(sink)] == [("a", 0, 1000, [0, 1])]
    records.append(topology.run_batch(late, 2))
    outcome, pending = through_ledger(records)
    assert outcome == {
        **dict.fromkeys(roots(first), ACKED),
        **dict.fromkeys(roots(late), REJECTED),
    }
    assert pending == set(roots(second))  # its window waits for the watermark
    reasons = [r["reason"] for r in records[2].to_pylist() if r["reason"]]
    assert reasons and all("late for window stage w" in r for r in reasons)


@MODES
def test_the_clock_survives_in_the_held_store(spark, ack_mode, tmp_path):
    """A topology made again over the same held folder (a restart) goes on from the
    held tuples and the clock saved: the window closes once, with the tuple held
    before the restart."""
    sinks = [MemorySink(), MemorySink()]
    tops = [by_time(spark, ack_mode, s, duration="1s") for s in sinks]
    for t in tops:
        t.held_folder = str(tmp_path / "held")
    first = tracked_frame(spark, ["a"], partition=0)
    records = [tops[0].run_batch(first, 0, now_ms=T + 100)]
    records.append(tops[1].run_batch(empty(spark), 1, now_ms=T + 1000))
    records.append(tops[1].run_batch(empty(spark), 2, now_ms=T + 2000))
    assert sinks[0].rows() == [] and emitted(sinks[1]) == [("a", 0, 1000, [0])]
    assert through_ledger(records)[0] == dict.fromkeys(roots(first), ACKED)


def test_time_window_arguments_are_checked(spark, tmp_path):
    from ackstream.channels.local import LocalChannel

    channel = LocalChannel(str(tmp_path / "channel"))

    def window(**kw):
        return Topology("w", spark, channel, message_timeout_ms=10_000).window(
            "value", F.count("*"), name="w", **kw
        )

    with pytest.raises(StageError, match="either count= .* or duration="):
        window(count=2, duration="1s")
    with pytest.raises(StageError, match="either count="):
        window()
    with pytest.raises(StageError, match="time= and delay= go with duration="):
        window(count=2, time="t")
    with pytest.raises(StageError, match="duration='soon': expected a duration"):
        window(duration="soon")
    with pytest.raises(StageError, match="slide 2000 ms is longer than the window"):
        window(duration="1s", slide="2s")
    with pytest.raises(StageError, match="longer than the message timeout"):
        window(duration="8s", slide="4s")
    with pytest.raises(StageError, match="delay= is the watermark"):
        window(duration="1s", delay="1s")
    with pytest.raises(StageError, match=r"window plus its slide \(12000 ms\)"):
        window(duration="8s", slide="4s", time="ts")  # event time too, as Storm refuses
    with pytest.raises(StageError, match=r"slide and delay \(10500 ms\), longer"):
        window(duration="5s", time="ts", delay="500ms")
    window(duration="4s", slide="2s", time="ts", delay="4s")  # 10 s: it fits
    untracked = Topology("w", spark, None, message_timeout_ms=10_000, tracking=False)
    untracked.window("value", F.count("*"), duration="8s", slide="4s")  # nothing times out
    topology = window(duration="1s", slide="250ms")
    assert topology.source_options()["ackstream.idleBatchInterval"] == "250ms"
    assert "ackstream.idleBatchInterval" not in window(count=2).source_options()


def test_idle_batches_close_a_processing_time_window_after_the_records_stop(spark, tmp_path):
    """Six generator records, then none: the source runs batches with nothing new while
    their roots are in flight, so the 1 s windows close and every root is acked and
    committed; each record is in exactly one window row."""
    from ackstream.channels.local import LocalChannel

    from helpers import commits

    channel_dir = str(tmp_path / "channel")
    sink = MemorySink()
    topology = (
        Topology("timed", spark, LocalChannel(channel_dir), message_timeout_ms=20_000)
        .map(lambda df: df.withColumn("k", F.lit("all")))
        .window("k", F.sort_array(F.collect_list("offset")).alias("offsets"), duration="1s")
        .sink(sink)
    )
    stop_once_settled(start_on_generator(topology, tmp_path / "ckpt", 6), 6, timeout_s=120)
    assert commits(channel_dir) == {"generator/0": 6}
    offsets = sorted(o for r in sink.rows() for o in r["offsets"])
    assert offsets == [0, 1, 2, 3, 4, 5]


@pytest.mark.e2e
@pytest.mark.broker
def test_on_kafka_a_time_window_after_a_count_acks_every_record_once(
    spark, broker, new_topic, tmp_path
):
    """Kafka upstream and channel, two records a batch: each batch's count per value
    goes into 1 s windows, held with every root it counts. The windows close (the last
    on an idle batch): the sums over all window rows are the counts of the input, every
    record is acked once at its first attempt and every offset committed."""

    from ackstream.channels.kafka import KafkaChannel
    from ackstream.vocabulary.records import NOTICES

    from helpers import new_inbox, run_on_kafka

    inbox, name = new_inbox(broker, new_topic, "tw", "abaabb")
    channel, sink = KafkaChannel(broker.bootstrap, name), MemorySink()
    topology = (
        Topology(name, spark, channel, message_timeout_ms=30_000)
        .map(lambda df: df.withColumn("v", F.col("value").cast("string")))
        .aggregate("v", F.count("*").alias("n"))
        .window("v", F.sum("n").alias("n"), duration="1s")
        .sink(sink)
    )
    assert run_on_kafka(topology, broker.bootstrap, inbox, tmp_path / "ckpt", records=6) == {0: 6}
    totals: dict = {}
    for row in sink.rows():
        totals[row["v"]] = totals.get(row["v"], 0) + row["n"]
    assert totals == {"a": 3, "b": 3}
    done = [c for c in channel.completions_since(None)[0].to_pylist() if c["status"] not in NOTICES]
    assert sorted((c["offset"], c["attempt"], c["status"]) for c in done) == [
        (o, 0, ACKED) for o in range(6)
    ]


@st.composite
def timed_arrivals(draw):
    """A slide and a duration (in units of 100 ms), and up to three batches: each a
    time after the one before and the keys of its tuples."""
    slide = draw(st.integers(1, 3))
    duration = slide * draw(st.integers(1, 3))
    times = sorted(draw(st.sets(st.integers(0, 12), min_size=1, max_size=3)))
    keys = [draw(st.lists(st.sampled_from("ab"), max_size=3)) for _ in times]
    return slide * 100, duration * 100, [(t * 100, k) for t, k in zip(times, keys)]


@spark_examples(6)
@given(case=timed_arrivals(), ack_mode=st.sampled_from(sorted(ACK_MODES)))
def test_sliding_windows_emit_every_window_and_ack_a_root_after_its_last(spark, case, ack_mode):
    """Against a model of Spark's window(): each (key, window) that holds a tuple is
    emitted once with exactly its tuples, and after every batch a root is acked iff
    the last window holding its tuple has ended by the batch's time."""
    slide, duration, batches = case
    base = 999_999_999_600  # a multiple of every slide drawn (600 ms)
    sink = MemorySink()
    tuples = F.collect_list(F.struct("partition", "offset")).alias("tuples")
    topology = by_time(spark, ack_mode, sink, agg=tuples, duration=duration, slide=slide)
    frames = [tracked_frame(spark, keys, partition=i) for i, (_, keys) in enumerate(batches)]
    last_end = {}  # root -> the end of its last window
    expected = set()
    records = []
    for i, ((t, keys), frame) in enumerate(zip(batches, frames)):
        records.append(topology.run_batch(frame, i, now_ms=base + t))
        for offset, root in enumerate(roots(frame)):
            last_end[root] = t - t % slide + duration
            first = t - t % slide - duration + slide
            for start in range(first, t + 1, slide):
                expected.add((keys[offset], start, start + duration, (i, offset)))
        outcome, pending = through_ledger(records)
        assert {r for r, e in last_end.items() if e <= t} == set(outcome)
        assert set(outcome.values()) <= {ACKED}
        assert pending == {r for r, e in last_end.items() if e > t}
    far = batches[-1][0] + 2 * duration
    records.append(topology.run_batch(empty(spark), len(batches), now_ms=base + far))
    outcome, pending = through_ledger(records)
    assert outcome == dict.fromkeys(last_end, ACKED) and pending == set()
    got = set()
    for row in sink.rows():
        start = int(row["window"]["start"].timestamp() * 1000) - base
        end = int(row["window"]["end"].timestamp() * 1000) - base
        for held in row["tuples"]:
            got.add((row["value"], start, end, (held["partition"], held["offset"])))
    assert got == expected
    assert len(sink.rows()) == len({(k, s) for k, s, _, _ in expected})
