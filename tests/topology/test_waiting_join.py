"""A join that waits for its other side: tuples held across micro-batches until their
match arrives, then acked, the joined rows anchored to both inputs.

The batch-level tests run ``Topology.run_batch`` on a real session (the held store in
memory) and feed each batch's ack records through the acker's ledger, as the acker
query would; the started tests run the generator source, the topology and acker
queries on a local channel, and one runs on Kafka."""

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import functions as F

from ackstream.errors import StageError
from ackstream.sinks.memory import MemorySink
from ackstream.testing import tracked_frame
from ackstream.topology import Topology
from ackstream.topology.modes import ACK_MODES
from ackstream.vocabulary.records import ACKED, FAILED, NOTICES, TIMED_OUT

from helpers import spark_examples, start_on_generator, stop_once_settled
from helpers import through_ledger as ledger

pytestmark = pytest.mark.spark
MODES = pytest.mark.parametrize("ack_mode", sorted(ACK_MODES))


def roots(frame):
    return [r["_root"] for r in frame.orderBy("offset").collect()]


def joined(spark, ack_mode, sink, fail=None, channel=None):
    """Clicks and views, both read from the spout (``key`` says which), joined on
    ``value``."""
    topology = (
        Topology("join", spark, channel, ack_mode=ack_mode)
        .filter("key = 'click'", name="clicks")
        .filter("key = 'view'", name="views", after="spout")
        .join("clicks", "views", on="value", name="j")
    )
    if fail is not None:
        topology = topology.fail_where(fail, "downstream")
    return topology.sink(sink)


def pairs(sink):
    """Per joined row: the key, and the (partition, offset) of its click and its view."""
    return sorted(
        (r["value"], (r["partition"], r["offset"]), (r["partition_right"], r["offset_right"]))
        for r in sink.rows()
    )


@MODES
def test_a_held_tuple_keeps_its_root_open_until_its_match_arrives(spark, ack_mode):
    """Batch 0: a click "a" and a view "b", no match: both held, both roots pending.
    Batch 1: a view "a", a click "b" and a click "c": two pairs, each of a held tuple
    and a new one; the four roots are acked, the "c" click's stays pending."""
    sink = MemorySink()
    topology = joined(spark, ack_mode, sink)
    first = tracked_frame(spark, ["a", "b"], keys=["click", "view"], partition=0)
    second = tracked_frame(spark, ["a", "b", "c"], keys=["view", "click", "click"], partition=1)
    records0 = topology.run_batch(first, 0)
    outcome, pending = ledger([records0])
    assert outcome == {} and pending == set(roots(first))
    assert sink.rows() == []
    records1 = topology.run_batch(second, 1)
    assert pairs(sink) == [("a", (0, 0), (1, 0)), ("b", (1, 1), (0, 1))]
    outcome, pending = ledger([records0, records1])
    a_click, b_view = roots(first)
    a_view, b_click, c_click = roots(second)
    assert outcome == dict.fromkeys([a_click, b_view, a_view, b_click], ACKED)
    assert pending == {c_click}
    held = topology.stages[-1].holding.store(None).before(spark, 2).rows.toArrow()
    assert held.column("_root").to_pylist() == [c_click]


@MODES
def test_a_match_releases_every_tuple_of_its_key_once(spark, ack_mode):
    """Two clicks "a" held; two views "a" come: four pairs, all four roots acked. A third
    view "a" in the next batch finds no click (they were released) and is held."""
    sink = MemorySink()
    topology = joined(spark, ack_mode, sink)
    first = tracked_frame(spark, ["a", "a"], keys=["click", "click"], partition=0)
    second = tracked_frame(spark, ["a", "a"], keys=["view", "view"], partition=1)
    third = tracked_frame(spark, ["a"], keys=["view"], partition=2)
    records = [topology.run_batch(first, 0), topology.run_batch(second, 1)]
    assert pairs(sink) == sorted(("a", (0, c), (1, v)) for c in (0, 1) for v in (0, 1))
    records.append(topology.run_batch(third, 2))
    assert len(sink.rows()) == 4
    outcome, pending = ledger(records)
    assert outcome == dict.fromkeys(roots(first) + roots(second), ACKED)
    assert pending == set(roots(third))


@MODES
def test_a_failed_joined_row_fails_the_roots_of_both_inputs(spark, ack_mode):
    """A click "a" held in batch 0, its view in batch 1; a stage after the join fails the
    row: both roots fail (the held one from the earlier batch too); the pair "b" of
    batch 1 is written and its roots acked."""
    sink = MemorySink()
    topology = joined(spark, ack_mode, sink, fail=F.col("value") == "a")
    first = tracked_frame(spark, ["a"], keys=["click"], partition=0)
    second = tracked_frame(spark, ["a", "b", "b"], keys=["view", "click", "view"], partition=1)
    outcome, pending = ledger([topology.run_batch(first, 0), topology.run_batch(second, 1)])
    (a_click,) = roots(first)
    a_view, b_click, b_view = roots(second)
    assert outcome == {a_click: FAILED, a_view: FAILED, b_click: ACKED, b_view: ACKED}
    assert pending == set()
    assert pairs(sink) == [("b", (1, 1), (1, 2))]


@MODES
def test_a_failed_joined_row_in_a_union_downstream_fails_both_roots(spark, ack_mode):
    """The joined rows (anchored to two roots) and a plain branch of the spout meet in one
    stage, which fails every row of "a": the roots of the join's inputs fail as well as
    the plain branch's own "a" rows (their roots are in one place after the union). The
    view "b" is written by the plain branch and held by the join: pending."""
    sink = MemorySink()
    topology = (
        joined(spark, ack_mode, MemorySink())
        .map(lambda df: df.select("*"), name="plain", after="spout")
        .fail_where(F.col("value") == "a", "downstream", name="both", after=("j", "plain"))
        .sink(sink)
    )
    batch = tracked_frame(spark, ["a", "a", "b"], keys=["click", "view", "view"])
    outcome, pending = ledger([topology.run_batch(batch, 0)])
    a_click, a_view, b_view = roots(batch)
    assert outcome == {a_click: FAILED, a_view: FAILED}
    assert pending == {b_view}
    assert [r["value"] for r in sink.rows()] == ["b"]


@MODES
def test_a_tuple_with_a_null_key_is_acked_at_once(spark, ack_mode):
    """A null key never matches: the tuple is dropped as a filter drops a row, and its
    root is acked in its batch; nothing is held."""
    sink = MemorySink()
    topology = joined(spark, ack_mode, sink)
    batch = tracked_frame(spark, [None, None], keys=["click", "view"])
    outcome, pending = ledger([topology.run_batch(batch, 0)])
    assert outcome == dict.fromkeys(roots(batch), ACKED) and pending == set()
    assert topology.stages[-1].holding.store(None).before(spark, 1).rows.toArrow().num_rows == 0
    assert sink.rows() == []


@MODES
def test_a_batch_run_again_starts_from_the_tuples_held_before_it(spark, ack_mode):
    """Spark re-runs a batch after a crash: the join must not hold its tuples twice, nor
    lose the held ones (a click held, then batch 1 with its view run twice: one pair
    each time, the first batch's click in both)."""
    sink = MemorySink()
    topology = joined(spark, ack_mode, sink)
    topology.run_batch(tracked_frame(spark, ["a", "z"], keys=["click", "click"]), 0)
    again = tracked_frame(spark, ["a", "y"], keys=["view", "view"], partition=1)
    topology.run_batch(again, 1)
    topology.run_batch(again, 1)
    assert pairs(sink) == [("a", (0, 0), (1, 0))] * 2
    held = topology.stages[-1].holding.store(None).before(spark, 2).rows.toArrow()
    assert sorted(zip(held.column("value").to_pylist(), held.column("_side").to_pylist())) == [
        ("y", 1),
        ("z", 0),
    ]


def test_a_held_tuple_whose_root_has_an_outcome_is_dropped(spark, tmp_path):
    """A click "a" held; its root fails elsewhere (a completion on the channel): the next
    batch's view "a" does not meet it (its record is replayed), and is held itself."""
    from ackstream.channels.local import LocalChannel
    from ackstream.vocabulary.records import completion_table

    channel = LocalChannel(str(tmp_path / "channel"))
    channel.prepare()
    sink = MemorySink()
    topology = joined(spark, "telescoped", sink, channel=channel)
    first = tracked_frame(spark, ["a"], keys=["click"])
    topology.run_batch(first, 0)
    channel.write_completions(completion_table(roots(first), FAILED, reason="elsewhere"))
    second = tracked_frame(spark, ["a"], keys=["view"], partition=1)
    topology.run_batch(second, 1)
    assert sink.rows() == []
    held = topology.stages[-1].holding.store(None).before(spark, 2).rows.toArrow()
    assert held.column("_root").to_pylist() == roots(second)


def test_with_tracking_off_a_join_still_waits_across_batches(spark):
    sink = MemorySink()
    topology = Topology("plain", spark, None, tracking=False)
    topology = (
        topology.filter("key = 'click'", name="clicks")
        .filter("key = 'view'", name="views", after="spout")
        .join("clicks", "views", on=["value"])
        .sink(sink)
    )
    assert (
        topology.run_batch(tracked_frame(spark, ["a", "b"], keys=["click", "click"]), 0).num_rows
        == 0
    )
    assert sink.rows() == []
    topology.run_batch(tracked_frame(spark, ["b"], keys=["view"], partition=1), 1)
    assert pairs(sink) == [("b", (0, 1), (1, 0))]
    assert "_root" not in sink.rows()[0]


def test_the_output_has_the_keys_once_and_suffixes_the_right_sides_names(spark):
    sink = MemorySink()
    topology = (
        Topology("cols", spark, None)
        .map(lambda df: df.select("*", F.lit(1).alias("n")), name="left")
        .map(lambda df: df.select("*", F.lit(2).alias("m")), name="right", after="spout")
        .join("left", "right", on="value", suffix="_r")
        .sink(sink)
    )
    topology.run_batch(tracked_frame(spark, ["a"]), 0)
    (row,) = sink.rows()
    assert list(row) == [
        "value",
        *("key", "topic", "partition", "offset", "_attempt", "n"),
        *("key_r", "topic_r", "partition_r", "offset_r", "_attempt_r", "m"),
    ]
    assert (row["n"], row["m"]) == (1, 2)


def test_join_arguments_are_checked(spark):
    def topology():
        return (
            Topology("j", spark, None)
            .map(lambda df: df.withColumn("k", F.col("value")), name="a")
            .map(lambda df: df.withColumn("k", F.length("value")), name="b", after="spout")
        )

    with pytest.raises(StageError, match="with itself"):
        topology().join("a", "a", on="k")
    with pytest.raises(StageError, match="name each stream it reads once"):
        topology().join("a", "nowhere", on="k")
    with pytest.raises(StageError, match="give the key column"):
        topology().join("a", "b", on=[])
    with pytest.raises(StageError, match="may not hold '/'"):
        topology().join("a", "b", on="k", name="x/y")
    batch = tracked_frame(spark, ["a"])
    with pytest.raises(StageError, match=r"stream 'a' has no key column\(s\) \['nope'\]"):
        topology().join("a", "b", on=["value", "nope"]).sink(MemorySink()).run_batch(batch)
    with pytest.raises(StageError, match="key types differ .k: string, int"):
        topology().join("a", "b", on="k").sink(MemorySink()).run_batch(batch)
    clash = topology().map(lambda df: df.withColumn("key_right", F.lit(1)), name="c", after="a")
    with pytest.raises(StageError, match=r"\['key_right'\] that exist already"):
        clash.join("c", "b", on="value").sink(MemorySink()).run_batch(batch)


def started(spark, tmp_path, count, timeout_ms=60_000, ack_mode="telescoped", **options):
    """The generator (one partition, ``count`` records) split by offset: even offsets
    are the left side, odd ones the right, key ``offset div 2`` (so 0 meets 1, 2 meets
    3); the offsets and attempts of each pair go to a memory sink."""
    from ackstream.channels.local import LocalChannel

    channel = LocalChannel(str(tmp_path / "channel"))
    sink = MemorySink()
    topology = (
        Topology("waits", spark, channel, message_timeout_ms=timeout_ms, ack_mode=ack_mode)
        .map(lambda df: df.withColumn("k", F.expr("offset div 2")), name="keyed")
        .filter("offset % 2 = 0", name="left")
        .filter("offset % 2 = 1", name="right", after="keyed")
        .join("left", "right", on="k", name="j")
        .sink(sink)
    )
    options = {"ackstream.retryInitialDelay": "50ms", **options}
    return topology, sink, start_on_generator(topology, tmp_path / "ckpt", count, **options)


def outcomes(channel):
    done = channel.completions_since(None)[0].to_pylist()
    done = [c for c in done if c["status"] not in NOTICES]
    return sorted((c["offset"], c["attempt"], c["status"]) for c in done)


@pytest.mark.parametrize(
    "ack_mode", ["telescoped", pytest.param("per_stage", marks=pytest.mark.long)]
)
def test_a_held_tuple_survives_a_restart_and_is_acked_with_its_match(spark, tmp_path, ack_mode):
    """One record (left, key 0) is held: its root pending, nothing committed; the query
    stops and starts again from its checkpoint with three records: offset 1 meets the
    held offset 0 from before the restart, 2 and 3 meet each other; all four roots are
    acked once, every offset committed, nothing held."""
    from ackstream.ui.status_sources import held_in

    from helpers import commits, stop_once_held

    channel_dir, checkpoint = str(tmp_path / "channel"), str(tmp_path / "ckpt")
    topology, sink, running = started(spark, tmp_path, 1, ack_mode=ack_mode)
    stop_once_held(running, "waits", channel_dir, checkpoint, "j", 1)
    assert commits(channel_dir).get("generator/0", 0) == 0
    assert sink.rows() == []
    assert held_in(checkpoint) == {"j": {"tuples": 1, "roots": 1}}

    topology, sink, running = started(spark, tmp_path, 4, ack_mode=ack_mode)
    stop_once_settled(running, 4, timeout_s=120)
    assert commits(channel_dir) == {"generator/0": 4}
    assert sorted((r["k"], r["offset"], r["offset_right"]) for r in sink.rows()) == [
        (0, 0, 1),
        (1, 2, 3),
    ]
    assert outcomes(topology.channel) == [(o, 0, ACKED) for o in range(4)]
    assert held_in(checkpoint) == {"j": {"tuples": 0, "roots": 0}}


@pytest.mark.e2e
def test_a_tuple_that_never_finds_its_match_times_out_and_is_replayed(spark, tmp_path):
    """One record, left side, whose right never comes: its root times out in the acker
    (3 s), the record is replayed and held again (its first attempt's row dropped),
    times out again and is dead-lettered after one retry. Nothing is written. (The
    source's own timeout is long, so that every timeout is the acker's.)"""
    from ackstream import read_dead_letters
    from ackstream.topology.held_store import FOLDER, HeldStore

    from helpers import commits

    channel_dir = str(tmp_path / "channel")
    topology, sink, running = started(
        spark,
        tmp_path,
        1,
        timeout_ms=3_000,
        **{"ackstream.maxRetries": "1", "ackstream.sourceTimeout": "120s"},
    )
    stop_once_settled(running, 1, timeout_s=180)
    assert commits(channel_dir) == {"generator/0": 1}
    assert outcomes(topology.channel) == [(0, 0, TIMED_OUT), (0, 1, TIMED_OUT)]
    letters = read_dead_letters(os.path.join(channel_dir, "dead_letters")).to_pylist()
    assert [(d["offset"], d["attempts"]) for d in letters] == [(0, 2)]
    assert sink.rows() == []
    # the first attempt's row was dropped when its root timed out: never held twice
    state = HeldStore(os.path.join(str(tmp_path / "ckpt"), "topology", FOLDER, "j")).latest(spark)
    assert {r["_attempt"] for r in state.rows.collect()} <= {1}


@pytest.mark.e2e
@pytest.mark.broker
def test_on_kafka_a_failed_joined_row_replays_both_roots_from_two_batches(
    spark, broker, new_topic, tmp_path
):
    """Kafka upstream and channel, two records a batch: "L1" and "R2" are held in the
    first batch, "R1" and "L2" meet them in the second. A stage fails the key 1 pair on
    its first attempt: both of its roots, read in two batches, fail and replay, meet
    again and are acked; the key 2 pair is acked at once. Every offset committed."""

    from ackstream.channels.kafka import KafkaChannel

    from helpers import new_inbox, run_on_kafka

    inbox, name = new_inbox(broker, new_topic, "join", ["L1", "R2", "R1", "L2"])
    channel, sink = KafkaChannel(broker.bootstrap, name), MemorySink()
    first_attempts = (F.col("_attempt") == 0) & (F.col("_attempt_right") == 0)
    topology = (
        Topology(name, spark, channel, message_timeout_ms=60_000)
        .map(lambda df: df.withColumn("v", F.col("value").cast("string")), name="text")
        .map(lambda df: df.withColumn("k", F.substring("v", 2, 1)), name="keyed")
        .filter(F.col("v").startswith("L"), name="left")
        .filter(F.col("v").startswith("R"), name="right", after="keyed")
        .join("left", "right", on="k")
        .fail_where((F.col("k") == "1") & first_attempts, "1: first attempt")
        .sink(sink)
    )
    options = {"ackstream.sourceTimeout": "120s", "ackstream.retryInitialDelay": "50ms"}
    committed = run_on_kafka(topology, broker.bootstrap, inbox, tmp_path / "ckpt", 4, **options)
    assert committed == {0: 4}
    assert outcomes(channel) == sorted(
        [(o, 0, FAILED) for o in (0, 2)]
        + [(o, 1, ACKED) for o in (0, 2)]
        + [(o, 0, ACKED) for o in (1, 3)]
    )
    assert sorted((r["k"], r["offset"], r["offset_right"], r["_attempt"]) for r in sink.rows()) == [
        ("1", 0, 2, 1),
        ("2", 3, 1, 0),
    ]


@st.composite
def arrivals(draw):
    """Three batches of up to four tuples each: a side and a key."""
    tuple_ = st.tuples(st.sampled_from(["click", "view"]), st.sampled_from("ab"))
    return [draw(st.lists(tuple_, max_size=4)) for _ in range(3)]


def model(batches):
    """What the join should do: the pairs, as ((batch, i) of the click, (batch, i) of
    the view), and the tuples never matched. A tuple is released in the first batch
    where its key has tuples of both sides, held or new."""
    held, out, matched = [], [], set()
    for b, batch in enumerate(batches):
        rows = held + [(b, i, side, key) for i, (side, key) in enumerate(batch)]
        for key in "ab":
            clicks = [r[:2] for r in rows if r[3] == key and r[2] == "click"]
            views = [r[:2] for r in rows if r[3] == key and r[2] == "view"]
            if clicks and views:
                out += [(c, v) for c in clicks for v in views]
                matched.update(clicks + views)
        held = [r for r in rows if r[:2] not in matched]
    return sorted(out), {r[:2] for r in held}


# each example runs three batches on Spark: few examples, and no shrinking (minutes)
@pytest.mark.e2e
@spark_examples(8)
@given(batches=arrivals(), ack_mode=st.sampled_from(sorted(ACK_MODES)))
def test_pairs_and_outcomes_follow_the_first_match(spark, batches, ack_mode):
    """Whatever the arrivals, the join emits exactly the pairs of the model, a root is
    acked iff its tuple met a match, and every other root stays pending."""
    sink = MemorySink()
    topology = joined(spark, ack_mode, sink)
    records, root_of = [], {}
    for b, batch in enumerate(batches):
        frame = tracked_frame(spark, [k for _, k in batch], keys=[s for s, _ in batch], partition=b)
        records.append(topology.run_batch(frame, b))
        root_of.update({(b, i): root for i, root in enumerate(roots(frame))})
    expected, unmatched = model(batches)
    assert sorted((c, v) for _, c, v in pairs(sink)) == expected
    outcome, pending = ledger([r for r in records if r.num_rows])
    assert outcome == {root_of[t]: ACKED for t in root_of if t not in unmatched}
    assert pending == {root_of[t] for t in unmatched}


@MODES
def test_a_window_after_a_join_holds_the_joined_rows_with_both_roots(spark, ack_mode):
    """Joined pairs go on to a count window of two per key: batch 0 makes one "a" pair
    (held by the window: both of its roots pending), batch 1 another; the window emits
    and the four roots are acked."""
    sink = MemorySink()
    topology = (
        Topology("join-win", spark, None, ack_mode=ack_mode)
        .filter("key = 'click'", name="clicks")
        .filter("key = 'view'", name="views", after="spout")
        .join("clicks", "views", on="value", name="j")
        .window("value", F.count("*").alias("n"), count=2, name="w")
        .sink(sink)
    )
    first = tracked_frame(spark, ["a", "a"], keys=["click", "view"], partition=0)
    second = tracked_frame(spark, ["a", "a"], keys=["view", "click"], partition=1)
    records = [topology.run_batch(first, 0)]
    outcome, pending = ledger(records)
    assert outcome == {} and pending == set(roots(first))
    records.append(topology.run_batch(second, 1))
    assert [(r["value"], r["n"]) for r in sink.rows()] == [("a", 2)]
    outcome, pending = ledger(records)
    assert outcome == dict.fromkeys(roots(first) + roots(second), ACKED)
    assert pending == set()


def counted_clicks(spark, ack_mode, sink, fail=None):
    """Each batch's clicks counted per value, joined with the views on the value."""
    topology = (
        Topology("agg-join", spark, None, ack_mode=ack_mode)
        .filter("key = 'click'", name="clicks")
        .aggregate("value", F.count("*").alias("n"), name="counts")
        .filter("key = 'view'", name="views", after="spout")
        .join("counts", "views", on="value", name="j")
    )
    if fail is not None:
        topology = topology.fail_where(fail, "downstream")
    return topology.sink(sink)


@MODES
def test_a_join_after_an_aggregate_holds_a_count_with_all_its_roots(spark, ack_mode):
    """Batch 0: two "a" clicks counted (one row, two roots), no view: held, both roots
    pending. Batch 1: the "a" view arrives: one joined row, all three roots acked."""
    sink = MemorySink()
    topology = counted_clicks(spark, ack_mode, sink)
    first = tracked_frame(spark, ["a", "a"], keys=["click", "click"], partition=0)
    second = tracked_frame(spark, ["a"], keys=["view"], partition=1)
    records = [topology.run_batch(first, 0)]
    outcome, pending = ledger(records)
    assert outcome == {} and pending == set(roots(first))
    records.append(topology.run_batch(second, 1))
    assert [(r["value"], r["n"], r["offset"]) for r in sink.rows()] == [("a", 2, 0)]
    outcome, pending = ledger(records)
    assert outcome == dict.fromkeys(roots(first) + roots(second), ACKED)
    assert pending == set()


@MODES
def test_a_failed_row_of_a_join_after_an_aggregate_fails_every_root(spark, ack_mode):
    sink = MemorySink()
    topology = counted_clicks(spark, ack_mode, sink, fail=F.col("n") == 2)
    first = tracked_frame(spark, ["a", "a"], keys=["click", "click"], partition=0)
    second = tracked_frame(spark, ["a"], keys=["view"], partition=1)
    records = [topology.run_batch(first, 0), topology.run_batch(second, 1)]
    outcome, pending = ledger(records)
    assert outcome == dict.fromkeys(roots(first) + roots(second), FAILED)
    assert pending == set() and sink.rows() == []


@MODES
def test_a_join_after_a_join(spark, ack_mode):
    """Clicks meet views, and the pairs then meet purchases: a purchase held in batch 0
    is released by the pair made in batch 1; its root and the pair's two are acked."""
    sink = MemorySink()
    topology = (
        Topology("join-join", spark, None, ack_mode=ack_mode)
        .filter("key = 'click'", name="clicks")
        .filter("key = 'view'", name="views", after="spout")
        .filter("key = 'buy'", name="buys", after="spout")
        .join("clicks", "views", on="value", name="seen")
        .map(lambda df: df.select("value", "offset", "_root", "_edge", "_anchors"), name="pair")
        .join("pair", "buys", on="value", name="bought")
        .sink(sink)
    )
    first = tracked_frame(spark, ["a", "a"], keys=["click", "buy"], partition=0)
    second = tracked_frame(spark, ["a"], keys=["view"], partition=1)
    records = [topology.run_batch(first, 0)]
    assert ledger(records)[0] == {}
    records.append(topology.run_batch(second, 1))
    assert len(sink.rows()) == 1
    outcome, pending = ledger(records)
    assert outcome == dict.fromkeys(roots(first) + roots(second), ACKED)
    assert pending == set()
