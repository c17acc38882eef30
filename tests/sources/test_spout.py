"""The spout on its own: generator upstream, local channel, a hand-moved clock; no Spark."""

import numpy as np
import pytest

from ackstream.channels.local import LocalChannel
from ackstream.config.source import parse
from ackstream.sinks.dead_letters import read_dead_letters
from ackstream.sources.generator import UNBOUNDED_STEP
from ackstream.sources.spout import open_spout
from ackstream.sources.starting import initial_offset
from ackstream.sources.upstream import open_upstream
from ackstream.vocabulary import ids
from ackstream.vocabulary.records import ACKED, CAUGHT_UP, FAILED, TICK, completion_table

from helpers import produce, scheduled, wait_for

TOPIC = "generator"


def report(channel, status, partition, offsets, attempt=0, reason=None):
    offsets = np.asarray(offsets, np.int64)
    roots = ids.root_ids("spout", TOPIC, partition, offsets, attempt)
    channel.write_completions(
        completion_table(
            roots,
            status,
            topic=TOPIC,
            partition=partition,
            offset=offsets,
            attempt=attempt,
            reason=reason,
        )
    )


def acker_catches_up(channel):
    """What a running acker does with the ticks the spout wrote: echo the latest."""
    ticks = [r["value"] for r in channel.ack_records().to_pylist() if r["kind"] == TICK]
    channel.write_completions(completion_table([0], CAUGHT_UP, completed_ms=max(ticks)))


def ten_seconds_are_left(spout, channel, clock):
    """The roots time out 10 s from now, not before, once the acker has caught up."""
    for step, timed_out in ((9_000, 0), (1_000, 10)):
        clock.advance(step)
        spout.next_offset()  # ticks the acker
        acker_catches_up(channel)
        spout.next_offset()
        assert spout.metrics()["timed_out"] == timed_out
        assert spout.metrics()["pending"] == 10 - timed_out


def test_a_new_spout_plans_every_record_and_names_its_terms_in_the_offset(make_spout):
    spout, _, _ = make_spout()
    offset = spout.next_offset()
    assert offset.read == {(TOPIC, 0): (0, 5), (TOPIC, 1): (0, 5)}
    assert offset.replays == ()
    assert (offset.tracked.topology, offset.tracked.timeout_ms) == ("spout", 10_000)
    assert spout.next_offset() is None  # nothing new, nothing due


def test_the_read_limit_is_shared_by_lag(make_spout):
    spout, _, _ = make_spout()
    assert spout.next_offset(max_rows=4).read == {(TOPIC, 0): (0, 2), (TOPIC, 1): (0, 2)}


def test_acked_offsets_are_committed_up_to_the_first_gap(make_spout):
    spout, channel, _ = make_spout()
    spout.next_offset()
    report(channel, ACKED, 0, [0, 1, 3])
    spout.next_offset()  # the next round reads the completions
    committed = spout.upstream.committed(spout.upstream.partitions())
    assert committed[(TOPIC, 0)][0] == 2
    assert '"done":[[3,4]]' in committed[(TOPIC, 0)][1]  # acked above the watermark


def test_a_failed_record_is_replayed_after_its_backoff_then_dead_lettered(make_spout):
    spout, channel, clock = make_spout(maxRetries=1, retryInitialDelay="1s")
    spout.next_offset()
    report(channel, FAILED, 1, [2], reason="boom")
    assert spout.next_offset() is None  # the backoff is not over
    clock.advance(1_000)
    assert spout.next_offset().replays == ((TOPIC, 1, 2, 3, 1),)
    report(channel, FAILED, 1, [2], attempt=1, reason="boom again")
    assert spout.next_offset() is not None  # a dead letter written makes a new offset
    (letter,) = read_dead_letters(spout.config.dead_letter_dir).to_pylist()
    assert (letter["partition"], letter["offset"], letter["attempts"]) == (1, 2, 2)
    assert letter["reason"] == "failed: boom again"


def test_a_root_past_the_message_timeout_wakes_the_acker_then_times_out(make_spout):
    spout, channel, clock = make_spout(sourceTimeout="30s")
    spout.on_spark_commit(spout.next_offset())  # the batch ran: the roots' timeouts start
    clock.advance(10_000)
    spout.next_offset()
    assert TICK in set(channel.ack_records().column("kind").to_pylist())
    clock.advance(20_000)  # past the source timeout, but the acker has not caught up
    assert spout.next_offset() is None and spout.metrics()["timed_out"] == 0
    acker_catches_up(channel)  # to the tick written at 30 s
    assert spout.next_offset() is None  # every root failed, replays scheduled
    assert spout.metrics()["timed_out"] == 10
    clock.advance(500)  # the first backoff
    replays = spout.next_offset().replays
    assert replays == tuple((TOPIC, p, 0, 5, 1) for p in (0, 1))  # a run per partition


def test_time_the_planner_waits_for_brokers_is_not_charged_to_the_roots(make_spout):
    """A broker restart blocks the planner's Kafka calls for 60 s (they are retried): no
    completion can be heard meanwhile, so the roots in flight keep the 10 s of source
    timeout they had left, and time out only once those have passed."""
    spout, channel, clock = make_spout(sourceTimeout="30s")
    spout.on_spark_commit(spout.next_offset())  # the batch ran: the roots' timeouts start
    clock.advance(20_000)
    latest = spout.upstream.latest

    def blocked_for_a_minute(tps, positions):
        clock.advance(60_000)
        return latest(tps, positions)

    spout.upstream.latest = blocked_for_a_minute
    spout.next_offset()
    spout.upstream.latest = latest
    ten_seconds_are_left(spout, channel, clock)


def test_no_root_times_out_while_the_channel_does_not_answer(make_spout):
    """The brokers of the completion channel are silent for 60 s while the planner keeps
    running: no root times out meanwhile (its ack may be waiting), and afterwards the
    roots keep the 10 s of source timeout they had left."""
    spout, channel, clock = make_spout(sourceTimeout="30s")
    spout.on_spark_commit(spout.next_offset())
    clock.advance(20_000)
    spout.next_offset()
    channel.answering = lambda: False
    for _ in range(6):
        clock.advance(10_000)
        acker_catches_up(channel)  # were it heard, the acker is up to date
        spout.next_offset()
        assert spout.metrics()["timed_out"] == 0
    channel.answering = lambda: True
    spout.next_offset()  # heard again: 60 s not charged
    ten_seconds_are_left(spout, channel, clock)


def test_no_root_times_out_before_the_acker_has_caught_up_past_its_deadline(make_spout):
    """The acker is down for two minutes (a slow restart): every tree's acks wait in the
    channel for it, so no root times out at the source until the acker has echoed a tick
    written after the root's deadline; then the roots with no outcome do."""
    spout, channel, clock = make_spout(sourceTimeout="30s")
    spout.on_spark_commit(spout.next_offset())
    for _ in range(12):
        clock.advance(10_000)
        spout.next_offset()  # ticks, unanswered
    assert spout.metrics()["timed_out"] == 0 and spout.metrics()["pending"] == 10
    report(channel, ACKED, 0, range(5))  # the acker is back: it settles what it got
    acker_catches_up(channel)
    spout.next_offset()
    metrics = spout.metrics()
    assert (metrics["acked"], metrics["timed_out"], metrics["pending"]) == (5, 5, 0)


@pytest.mark.broker
def test_partitions_added_upstream_are_read_from_their_start(broker, new_topic, tmp_path):
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewPartitions

    topic = new_topic(partitions=1)
    config = parse(
        {
            "kafka.bootstrap.servers": broker.bootstrap,
            "subscribe": topic,
            "ackstream.topology": "grows",
            "ackstream.channel": str(tmp_path / "channel"),
            "kafka.metadata.max.age.ms": "200",  # see new partitions soon
        }
    )
    channel, upstream = LocalChannel(config.channel), open_upstream(config)
    spout = open_spout(config, upstream, channel, initial_offset(config, upstream, channel))
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    try:
        producer.send(topic, b"first", partition=0).get(10)
        assert spout.next_offset().read == {(topic, 0): (0, 1)}
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        admin.create_partitions({topic: NewPartitions(total_count=2)})
        admin.close()
        producer.close()
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, metadata_max_age_ms=200)
        wait_for(lambda: producer.partitions_for(topic) == {0, 1}, what="the new partition")
        producer.send(topic, b"second", partition=1).get(10)
        producer.send(topic, b"third", partition=1).get(10)
        planned = {}
        wait_for(
            lambda: (
                planned.update(getattr(spout.next_offset(), "read", {})) or (topic, 1) in planned
            ),
            what="the new partition planned",
        )
        assert planned[(topic, 1)] == (0, 2)
    finally:
        producer.close()
        spout.close()


def test_a_partition_whose_end_went_back_is_an_error_naming_it(make_spout):
    """A topic deleted and re-created under the query restarts its offsets at 0."""
    from ackstream.errors import AckstreamError

    spout, _, _ = make_spout()
    spout.next_offset()  # read [0, 5) of both partitions
    latest = spout.upstream.latest
    spout.upstream.latest = lambda tps, positions: {**latest(tps, positions), (TOPIC, 1): 2}
    with pytest.raises(AckstreamError, match=r"generator\[1\] ends at offset 2, below the 5"):
        spout.next_offset()


def test_a_second_query_with_the_same_name_is_refused_naming_both(make_spout):
    from ackstream.errors import AckstreamError

    first, _, clock = make_spout()
    first.next_offset()  # commits, with its claim on the group
    second, _, other_clock = make_spout()  # same topology, same group, a new query
    other_clock.now_ms = clock.now_ms + 1_000
    with pytest.raises(AckstreamError, match="another query") as refused:
        second.next_offset()
    assert first.claim.owner in str(refused.value) and second.claim.owner in str(refused.value)

    clock.advance(6_000)
    first.next_offset()  # the first one goes on and renews its claim
    later, _, later_clock = make_spout()
    later_clock.now_ms = clock.now_ms + first.claim.lease_ms  # the first one is gone
    later.next_offset()


def test_a_same_named_query_of_another_group_never_settles_this_ones_records(
    broker, new_topic, tmp_path
):
    """Two topologies of one name share the channel (named by the topology); when they
    commit to different consumer groups, their root ids differ, so the acks of one's
    records are not the other's (the group claim above covers one group only)."""
    topic = new_topic(partitions=1)
    produce(broker.bootstrap, topic, [str(n) for n in range(4)])
    spouts = []
    try:
        for group in ("ackstream-twin", "other"):
            config = parse(
                {
                    "kafka.bootstrap.servers": broker.bootstrap,
                    "subscribe": topic,
                    "startingOffsets": "earliest",
                    "kafka.group.id": group,
                    "ackstream.topology": "twin",
                    "ackstream.channel": str(tmp_path / "channel"),
                }
            )
            channel, upstream = LocalChannel(config.channel), open_upstream(config)
            start = initial_offset(config, upstream, channel)
            spouts.append(open_spout(config, upstream, channel, start))
        ours, theirs = spouts
        assert (ours.config.id_namespace, theirs.config.id_namespace) == ("twin", "twin@other")
        ours.next_offset(), theirs.next_offset()
        roots = ids.root_ids("twin", topic, 0, np.arange(4), 0)  # ours, all acked
        channel.write_completions(
            completion_table(roots, ACKED, topic=topic, partition=0, offset=np.arange(4))
        )
        ours.next_offset(), theirs.next_offset()
        assert (ours.metrics()["acked"], ours.metrics()["pending"]) == (4, 0)
        assert (theirs.metrics()["acked"], theirs.metrics()["pending"]) == (0, 4)
    finally:
        for spout in spouts:
            spout.close()


def test_a_restart_from_the_checkpoint_is_the_same_query(make_spout, tmp_path):
    spout, channel, clock = make_spout()
    offset = spout.next_offset()
    restarted = open_spout(spout.config, open_upstream(spout.config), channel, offset, clock)
    try:
        clock.advance(1_000)
        restarted.on_spark_commit(offset)
        assert restarted.claim.owner == spout.claim.owner
    finally:
        restarted.close()


def test_a_restart_goes_on_counting_from_the_logged_offset(make_spout):
    """Outcomes read before Spark logged the offset are in it (an ack read after it and
    already covered by the group's commit is not counted again: it is done, not re-read
    as an outcome)."""
    spout, channel, clock = make_spout()
    spout.next_offset(max_rows=4)  # offsets 0-1 of each partition
    report(channel, ACKED, 0, [0, 1])
    offset = spout.next_offset(max_rows=4)  # 2-3 of each
    assert spout.metrics()["acked"] == 2
    restarted = open_spout(spout.config, open_upstream(spout.config), channel, offset, clock)
    try:
        assert restarted.metrics()["acked"] == 2
        report(channel, ACKED, 1, [0, 1, 2])
        restarted.next_offset()
        assert restarted.metrics()["acked"] == 5
    finally:
        restarted.close()


def test_metrics_count_outcomes_and_give_each_partitions_lag(make_spout):
    """What ``reportLatestOffset`` shows in Spark's progress: 10 records, partition 0's
    0-4 acked, partition 1's offset 2 failed twice (replayed, then dead-lettered)."""
    spout, channel, clock = make_spout(maxRetries=1, retryInitialDelay="1s")
    spout.next_offset()
    report(channel, ACKED, 0, range(5))
    report(channel, FAILED, 1, [2])
    spout.next_offset()
    assert spout.metrics()["partitions"] == {
        TOPIC: {
            "0": {"end": 5, "committed": 5, "lag": 0},
            "1": {"end": 5, "committed": 0, "lag": 5},
        }
    }
    assert (spout.metrics()["pending"], spout.metrics()["waiting"]) == (4, 1)
    clock.advance(1_000)
    spout.next_offset()  # the replay, at attempt 1
    report(channel, FAILED, 1, [2], attempt=1)
    report(channel, ACKED, 1, [0, 1, 3])
    spout.next_offset()
    metrics = spout.metrics()
    assert {k: metrics[k] for k in ("acked", "failed", "replayed", "dead_lettered")} == {
        "acked": 8,
        "failed": 2,
        "replayed": 1,
        "dead_lettered": 1,
    }
    assert (metrics["pending"], metrics["waiting"]) == (1, 0)  # partition 1's offset 4
    assert metrics["partitions"][TOPIC]["1"] == {"end": 5, "committed": 4, "lag": 1}


def run_batches(spout, channel, clock, fails, rounds=60, max_rows=None):
    """What a topology does with each batch the spout plans: every root of a batch that
    ``fails(records)`` fails as a whole (``batch_failed``), else every root is acked.
    Returns the planned batches, each ``(offset, {(partition, offset, attempt)})``, once
    nothing is left to plan (backoffs are waited out)."""
    from ackstream.sources.offsets import PlannedRoots
    from ackstream.vocabulary.records import BATCH_FAILED

    batches = []
    for _ in range(rounds):
        offset = spout.next_offset(max_rows)
        if offset is None:
            if not scheduled(spout.tracker) and not spout.tracker.in_flight:
                return batches
            clock.advance(1_000)  # a backoff
            continue
        inits = PlannedRoots.of_offsets([offset], clock()).inits
        records = set(
            zip(*(inits.column(c).to_pylist() for c in ("partition", "offset", "attempt")))
        )
        batches.append((offset, records))
        failed = fails(records)
        channel.write_completions(
            completion_table(
                inits.column("root"),
                BATCH_FAILED if failed else ACKED,
                topic=inits.column("topic"),
                partition=inits.column("partition"),
                offset=inits.column("offset"),
                attempt=inits.column("attempt"),
                reason="slow#2: the batch deadline of 3000 ms passed" if failed else None,
            )
        )
        spout.on_spark_commit(offset)
    pytest.fail(f"still planning after {rounds} batches")


def test_a_poison_is_isolated_from_a_failed_batch_and_only_its_lone_failures_count(make_spout):
    """A batch that fails as a whole (the poison at partition 1, offset 2 hangs it) is
    replayed in groups of its own, nothing new read with them, until the poison fails
    alone; only those lone failures count against maxRetries; every other record is
    acked without a retry charged, and the letter counts every emit of the poison."""
    spout, channel, clock = make_spout(
        maxRetries=2, retryInitialDelay="1s", **{"generator.count": 40}
    )
    poison = (1, 2)
    batches = run_batches(
        spout, channel, clock, lambda records: poison in {(p, o) for p, o, _ in records}, 80, 8
    )

    assert spout.tracker.watermarks() == {(TOPIC, 0): 20, (TOPIC, 1): 20}
    (letter,) = read_dead_letters(spout.config.dead_letter_dir).to_pylist()
    assert (letter["partition"], letter["offset"]) == poison
    assert letter["reason"] == "batch_failed: slow#2: the batch deadline of 3000 ms passed"
    # the first batch (8 roots) fails; its suspects replay in 8 groups of 1; the poison,
    # alone, fails on attempts 1, 2 and 3 (two retries): 4 emits in all
    assert letter["attempts"] == 4
    with_poison = [records for _, records in batches if poison in {r[:2] for r in records}]
    assert [len(records) for records in with_poison] == [8, 1, 1, 1]
    replayed = [(offset, records) for offset, records in batches if offset.replays]
    assert all(not offset.read for offset, _ in replayed), "new records joined suspects"
    # no innocent record was replayed but once, as a suspect
    innocent = [r for _, records in replayed for r in records if r[:2] != poison]
    assert sorted(r[2] for r in innocent) == [1] * 7


def test_a_failed_group_is_split_again_until_the_poison_is_alone(make_spout):
    """40 roots fail together: 8 groups of 5; the poison's group fails, alone of its
    round: halved (3 and 2), then its half of 2, to the poison alone: 4 batches, where
    5 groups of 1 took 5. The other suspects are acked in their groups."""
    spout, channel, clock = make_spout(maxRetries=0, **{"generator.count": 40})
    poison = (0, 13)
    batches = run_batches(
        spout, channel, clock, lambda records: poison in {(p, o) for p, o, _ in records}
    )
    sizes = [len(records) for _, records in batches]
    assert sizes[0] == 40 and sorted(sizes[1:9]) == [5] * 8 and sorted(sizes[9:]) == [1, 1, 2, 3]
    (letter,) = read_dead_letters(spout.config.dead_letter_dir).to_pylist()
    assert (letter["partition"], letter["offset"], letter["attempts"]) == (*poison, 4)
    assert spout.tracker.watermarks() == {(TOPIC, 0): 20, (TOPIC, 1): 20}
    assert spout.metrics()["dead_lettered"] == 1


def test_a_batch_failing_for_every_record_is_retried_together_then_dead_lettered(make_spout):
    """Every batch fails (a broken sink, a stage that fails every record): once every
    group of the first round failed too, the error is not one record's, so the records
    are charged and retried together, and dead-lettered with the error after their
    retries, in a bounded number of batches (splitting on to single records took a
    batch per record and retry)."""
    spout, channel, clock = make_spout(maxRetries=1, retryInitialDelay="1s")
    batches = run_batches(spout, channel, clock, lambda records: True, rounds=200)
    letters = read_dead_letters(spout.config.dead_letter_dir).to_pylist()
    assert len(letters) == 10
    # the first read, then in a group of 2 (uncharged), then the one retry, together
    assert {letter["attempts"] for letter in letters} == {3}
    assert {letter["reason"] for letter in letters} == {
        "batch_failed: charged with 10 records of a failing group; "
        "the group's first error: slow#2: the batch deadline of 3000 ms passed"
    }
    sizes = [len(records) for _, records in batches if records]
    assert sizes == [10] + [2] * 5 + [10]  # then the letters, in a batch of no records


def test_an_unbounded_generator_releases_a_bounded_step_at_a_time(tmp_path):
    """With neither count nor rate it has no end (it once offered 2**62 offsets per
    partition, which overflowed the planner): it runs as fast as batches go, each
    batch taking a bounded step of each partition."""
    config = parse({"ackstream.upstream": "generator", "ackstream.channel": str(tmp_path)})
    channel, upstream = LocalChannel(config.channel), open_upstream(config)
    spout = open_spout(config, upstream, channel, initial_offset(config, upstream, channel))
    try:
        first, second = spout.next_offset(), spout.next_offset()
    finally:
        spout.close()
    step = UNBOUNDED_STEP
    assert first.read == {(TOPIC, 0): (0, step), (TOPIC, 1): (0, step)}
    assert second.read == {(TOPIC, 0): (step, 2 * step), (TOPIC, 1): (step, 2 * step)}
