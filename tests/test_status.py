"""``ackstream status``: counting roots by outcome from the channels, without Spark."""

import json
import os
import time
from dataclasses import replace

import pyarrow as pa
import pytest

from ackstream.channels.local import LocalChannel
from ackstream.errors import EnvironmentProblem
from ackstream.sinks.dead_letters import (
    DEAD_LETTER_SCHEMA,
    ParquetDeadLetters,
    read_dead_letters,
)
from ackstream.testing import ack, ack_records, init
from ackstream.ui.metrics import exposition
from ackstream.ui.status import history, latency_histogram, summarize
from ackstream.ui.status_sources import local_status
from ackstream.vocabulary.dead_letter import DeadLetter
from ackstream.vocabulary.records import (
    ACKED,
    BATCH_FAILED,
    COMPLETION_SCHEMA,
    FAILED,
    INVALID,
    REJECTED,
    TIMED_OUT,
    UNKNOWN,
)

from helpers import produce


def done(root, status, offset=None, attempt=0, latency=None):
    return {
        "root": root,
        "status": status,
        "topic": "t",
        "partition": 0,
        "offset": offset,
        "attempt": attempt,
        "latency_ms": latency,
        "completed_ms": 0,
    }


def prometheus(status) -> str:
    return exposition([status])


def completions(rows):
    return pa.Table.from_pylist(rows, schema=COMPLETION_SCHEMA)


#: What ``fill_channel`` writes, as ``Status`` fields.
EXPECTED = {
    "roots": 11,
    "pending": 3,
    "acked": 5,
    "failed": 2,
    "timed_out": 1,
    "replayed": 2,
    "dead_lettered": 1,
    "latency_ms": {"p50": 30.0, "p90": 46.0, "p99": 49.6},
}


def fill_channel(directory) -> LocalChannel:
    """Roots 1-10 at offsets 1-10 (attempt 0) and root 11, offset 6 replayed (attempt 1).

    1-5 acked (10..50 ms), 6 failed and replayed as 11, which failed again and was
    dead-lettered; 7 timed out (replayed); 8-10 pending; root 1's completion twice.
    """
    channel = LocalChannel(directory)
    channel.write_acks(ack_records([init(r, r, offset=r, ts=1) for r in range(1, 6)]))
    channel.write_acks(
        ack_records(
            [init(r, r, offset=r, ts=1) for r in range(6, 11)] + [ack(r, r) for r in range(1, 6)]
        )
    )
    channel.write_acks(ack_records([init(11, 11, offset=6, attempt=1)]))
    batches = {
        0: [done(r, ACKED, r, latency=10 * r) for r in range(1, 6)]
        + [done(6, FAILED, 6), done(7, TIMED_OUT, 7)],
        3: [done(11, FAILED, 6, attempt=1), done(1, ACKED, 1, latency=10)],
    }
    for batch, rows in batches.items():
        channel.write_completions(completions(rows), batch)
    ParquetDeadLetters(os.path.join(channel.directory, "dead_letters"), "words").write(
        [DeadLetter("t", 0, 6, 2, FAILED)], {}
    )
    return channel


def test_summarize_counts_each_root_once_by_outcome():
    rows = [
        done(1, ACKED, latency=5),
        done(2, FAILED, 2),
        done(3, TIMED_OUT, 3),
        done(1, ACKED, latency=500),
    ]  # a completion delivered twice counts once
    status = summarize([1, 2, 3, 4, 4], completions(rows), None, topology="t", channel="c")
    assert (status.roots, status.pending, status.acked, status.failed, status.timed_out) == (
        4,
        1,
        1,
        1,
        1,
    )
    assert status.replayed == 2 and status.dead_lettered is None
    assert status.latency_ms == {"p50": 5.0, "p90": 5.0, "p99": 5.0}


def test_a_rejection_counts_over_an_ack_of_the_same_root_as_the_source_decides():
    """A read task rejects an oversize record; its topology batch acks every root it
    planned. On the Kafka channel the two may be read in either order."""
    rows = [done(7, ACKED, 7, latency=3), done(8, ACKED, 8, latency=3), done(7, REJECTED, 7)]
    status = summarize([], completions(rows), None)
    assert (status.roots, status.acked, status.rejected) == (2, 1, 1)


def test_a_dead_lettered_attempt_is_not_counted_as_replayed():
    letters = pa.Table.from_pylist(
        [{"topic": "t", "partition": 0, "offset": 2, "attempts": 2}], schema=DEAD_LETTER_SCHEMA
    )
    rows = [done(1, FAILED, 2, attempt=0), done(2, FAILED, 2, attempt=1)]
    status = summarize([1, 2], completions(rows), letters)
    assert (status.failed, status.replayed, status.dead_lettered) == (2, 1, 1)


def test_rejected_unknown_and_invalid_are_counted_and_shown_apart():
    rows = [
        done(1, REJECTED, 1),
        done(2, UNKNOWN),
        done(None, INVALID),
        done(None, INVALID),
        done(3, ACKED, 3, latency=4),
    ]
    status = summarize([1, 3], completions(rows), None)
    assert (status.rejected, status.unknown, status.invalid, status.replayed) == (1, 1, 2, 0)
    assert (status.roots, status.acked, status.pending) == (3, 1, 0)
    text = "\n".join(status.lines())
    assert "unknown" in text and "invalid" in text


def test_summarize_of_nothing():
    status = summarize([], COMPLETION_SCHEMA.empty_table(), None)
    assert (status.roots, status.pending, status.acked, status.latency_ms) == (0, 0, 0, None)
    assert "no acked roots yet" in "\n".join(status.lines())


def test_completion_without_an_init_is_a_root_not_pending():
    status = summarize([], completions([done(9, TIMED_OUT)]), None)
    assert (status.roots, status.pending, status.timed_out, status.replayed) == (1, 0, 1, 1)


def test_local_status_reads_acks_completions_and_dead_letters(tmp_path):
    fill_channel(tmp_path / "ch")
    (tmp_path / "ch" / "acks" / ".half-written.parquet").write_bytes(b"")
    (tmp_path / "ch" / "acks" / "foreign.parquet").write_bytes(b"not parquet")  # skipped
    status = local_status(str(tmp_path / "ch"), "words")
    assert {k: getattr(status, k) for k in EXPECTED} == EXPECTED
    assert (status.topology, status.channel) == ("words", str(tmp_path / "ch"))
    text = "\n".join(status.lines())
    assert "pending" in text and "p99 50 ms" in text


def test_status_says_when_the_newest_dead_letter_died(tmp_path):
    fill_channel(tmp_path / "ch")
    folder = os.path.join(tmp_path / "ch", "dead_letters")
    ParquetDeadLetters(folder, "words").write([DeadLetter("t", 0, 9, 1, REJECTED)], {})
    newest = max(read_dead_letters(folder).column("written_ms").to_pylist())
    status = local_status(str(tmp_path / "ch"), "words")
    assert status.last_dead_letter_ms == newest
    (line,) = [x for x in status.lines() if x.strip().startswith("dead-lettered")]
    said = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(newest / 1000))
    assert line.endswith(f"(the newest died {said})")


def test_local_status_of_a_missing_directory_says_what_to_give(tmp_path):
    with pytest.raises(EnvironmentProblem) as problem:
        local_status(str(tmp_path / "nowhere"))
    assert problem.value.what.endswith("nowhere")


@pytest.mark.broker
def test_kafka_status_reads_both_topics(broker, tmp_path):
    from ackstream.channels.kafka import KafkaChannel
    from ackstream.ui.status_sources import kafka_status

    topology = f"status-{os.urandom(4).hex()}"
    channel = KafkaChannel(broker.bootstrap, topology, partitions=1)
    channel.prepare()
    try:
        channel.write_acks(ack_records([init(r, r, offset=r, ts=1) for r in (1, 2, 3)]))
        batch = completions([done(1, ACKED, 1, latency=7), done(2, FAILED, 2)])
        channel.write_completions(batch, 0)
    finally:
        channel.close()
    status = kafka_status(broker.bootstrap, topology)
    assert (status.roots, status.pending, status.acked, status.failed, status.replayed) == (
        3,
        1,
        1,
        1,
        1,
    )
    assert status.dead_lettered == 0 and status.latency_ms["p50"] == 7.0
    assert status.partitions is None  # the source's group has committed nothing yet


def committed_group(bootstrap: str, topology: str) -> str:
    """A topic of 5 records whose group ``ackstream-<topology>`` committed offset 2."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    topic = f"{topology}-in"
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for n in range(5):
        producer.send(topic, b"%d" % n, partition=0)
    producer.flush()
    producer.close()
    group = KafkaConsumer(bootstrap_servers=bootstrap, group_id=f"ackstream-{topology}")
    group.commit({TopicPartition(topic, 0): OffsetAndMetadata(2, "", -1)})
    group.close()
    return topic


@pytest.mark.broker
def test_kafka_status_shows_the_lag_of_the_sources_group(broker, monkeypatch):
    """With the Kafka channel there is no metrics file: the lag is the group's."""
    import ackstream.ui.status_sources
    from ackstream.ui.status_sources import kafka_status

    topology = f"lag-{os.urandom(4).hex()}"
    topic = committed_group(broker.bootstrap, topology)
    status = kafka_status(broker.bootstrap, topology)
    assert status.partitions == {topic: {"0": {"end": 5, "committed": 2, "lag": 3}}}
    assert f"{topic}[0]" in "\n".join(status.lines())
    # an upstream on other brokers: the group is read there, not on the channel's (one
    # broker in the suite: the call is watched; the local channel's test reads it for real)
    asked = []
    monkeypatch.setattr(ackstream.ui.status_sources, "group_lag", lambda *args: asked.append(args))
    kafka_status(broker.bootstrap, topology, upstream_bootstrap="127.0.0.1:9")
    assert asked == [("127.0.0.1:9", f"ackstream-{topology}", None)]


@pytest.mark.broker
def test_status_of_a_local_channel_reads_the_lag_on_the_upstream_brokers(broker, tmp_path, capsys):
    import json

    from ackstream.cli import main

    topology = f"lag-{os.urandom(4).hex()}"
    topic = committed_group(broker.bootstrap, topology)
    fill_channel(tmp_path / "ch")
    argv = ["status", "--channel", str(tmp_path / "ch"), "--topology", topology, "--json"]
    assert main([*argv, "--upstream-bootstrap", broker.bootstrap]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["partitions"] == {topic: {"0": {"end": 5, "committed": 2, "lag": 3}}}
    assert main(argv) == 0  # without it: the figures the source saved (none here)
    assert json.loads(capsys.readouterr().out)["partitions"] is None


def finished(root, status, offset, at_s, attempt=0, reason=None):
    """A completion at ``at_s`` seconds (epoch ms / 1000), with the stage's reason."""
    return {**done(root, status, offset, attempt, latency=1), "completed_ms": at_s * 1000} | {
        "reason": reason
    }


def test_rates_count_the_window_before_now_by_outcome():
    letters = pa.Table.from_pylist(
        [{"topic": "t", "partition": 0, "offset": 4, "attempts": 2}], schema=DEAD_LETTER_SCHEMA
    )
    rows = [
        finished(1, ACKED, 1, 85),  # before the window
        finished(2, ACKED, 2, 95),
        finished(3, ACKED, 3, 99),
        finished(4, FAILED, 4, 91, reason="parse: ValueError: x"),  # replayed as root 5
        finished(5, FAILED, 4, 98, attempt=1, reason="parse: ValueError: x"),  # dead-lettered
        finished(6, TIMED_OUT, 6, 100),
    ]
    status = summarize([], completions(rows), letters, now_ms=100_000, window_s=10)
    assert status.rates_per_s == {"acked": 0.2, "replayed": 0.2, "dead_lettered": 0.1}
    assert "  last 10 s  acked 0.2/s  replayed 0.2/s  dead-lettered 0.1/s" in status.lines()


def test_failed_and_rejected_roots_are_counted_by_the_stage_their_reason_names_apart():
    """A rejected root is never replayed: Storm UI's failed count per bolt leaves it out."""
    rows = [
        finished(1, FAILED, 1, 1, reason="poison: (offset % 10) = 5"),
        finished(2, FAILED, 2, 1, reason="poison: (offset % 10) = 5"),
        finished(3, REJECTED, 3, 1, reason="parse#2: ValueError: bad"),
        finished(6, REJECTED, 6, 1, reason="poison: (offset % 10) = 5"),
        finished(4, TIMED_OUT, 4, 1),
        finished(5, ACKED, 5, 1),
        finished(7, BATCH_FAILED, 7, 1, reason="SparkRuntimeException: poison in SQL"),
    ]
    status = summarize([], completions(rows), None)
    assert status.failed_by_stage == {"poison": 2, "timed out": 1, "whole batch": 1}
    assert (status.failed, status.replayed) == (3, 4)
    assert status.rejected_by_stage == {"parse#2": 1, "poison": 1}
    assert status.rates_per_s is None  # no time given: no rates
    text = status.lines()
    failed, rejected = text.index("  failed by stage"), text.index("  rejected by stage")
    assert text[failed + 1 : failed + 3] == [
        f"    {'poison':<24}{2:>8}   (offset % 10) = 5 (2)",
        f"    {'timed out':<24}{1:>8}   timed out (1)",
    ]
    assert text[rejected + 1 : rejected + 3] == [
        f"    {'parse#2':<24}{1:>8}   ValueError: bad (1)",
        f"    {'poison':<24}{1:>8}   (offset % 10) = 5 (1)",
    ]
    assert status.failed_reasons["whole batch"] == {"SparkRuntimeException: poison in SQL": 1}


def test_local_status_shows_the_lag_the_source_saved_and_exposes_it_to_prometheus(tmp_path):
    from ackstream.channels.local import SOURCE_METRICS_FILE

    fill_channel(tmp_path / "ch")
    parts = {"t": {"0": {"end": 12, "committed": 6, "lag": 6}}}
    saved = {"partitions": parts, "read": 22}
    (tmp_path / "ch" / SOURCE_METRICS_FILE).write_text(json.dumps(saved))
    status = local_status(str(tmp_path / "ch"), "words")
    assert (status.partitions, status.read) == (parts, 22)
    assert "  read                22   (records the source read since it started)" in status.lines()
    assert "  t[0]                            12          6       6" in status.lines()
    exposition = prometheus(status).splitlines()
    assert 'ackstream_partition_lag{partition="0",topic="t",topology="words"} 6.0' in exposition
    assert 'ackstream_roots_pending{topology="words"} 3.0' in exposition
    assert 'ackstream_dead_letters_total{topology="words"} 1.0' in exposition
    assert 'ackstream_records_read_total{topology="words"} 22.0' in exposition


def test_local_status_without_source_metrics_says_the_lag_is_unknown(tmp_path):
    fill_channel(tmp_path / "ch")
    status = local_status(str(tmp_path / "ch"), "words")
    assert status.partitions is None
    assert any(line.startswith("  lag: unknown") for line in status.lines())


def test_prometheus_types_counts_that_only_grow_as_counters_and_latency_as_a_histogram(tmp_path):
    """Prometheus' conventions: a counter is named ``*_total`` and every ``*_total`` is a
    counter; the complete latency is a histogram (buckets, count and sum), levels are
    gauges; each family has its HELP and TYPE before its samples; no precomputed rate."""
    fill_channel(tmp_path / "ch")
    status = local_status(str(tmp_path / "ch"), "words")
    status = replace(
        status,
        rejected=1,
        rejected_by_stage={"parse": 1},
        held={"w": {"tuples": 3, "roots": 2}},
        stages={"w": {"in": 9, "out": 2}},
        partitions={"t": {"0": {"end": 12, "committed": 6, "lag": 6}}},
    )
    lines = prometheus(status).splitlines()
    types = dict(line.split()[2:4] for line in lines if line.startswith("# TYPE "))
    assert {name: kind for name, kind in types.items() if kind == "counter"} == {
        "ackstream_roots_total": "counter",
        "ackstream_roots_replayed_total": "counter",
        "ackstream_dead_letters_total": "counter",
        "ackstream_failed_by_stage_total": "counter",
        "ackstream_rejected_by_stage_total": "counter",
        "ackstream_stage_tuples_total": "counter",
    }
    assert types["ackstream_complete_latency_seconds"] == "histogram"
    others = {n: k for n, k in types.items() if k not in ("counter", "histogram")}
    assert set(others.values()) == {"gauge"} and not any("rate" in n for n in types)
    assert all(kind == "counter" for name, kind in types.items() if name.endswith("_total"))
    assert 'ackstream_complete_latency_seconds_bucket{le="0.05",topology="words"} 5.0' in lines
    assert 'ackstream_complete_latency_seconds_count{topology="words"} 5.0' in lines
    assert 'ackstream_complete_latency_seconds_sum{topology="words"} 0.15' in lines
    assert 'ackstream_failed_by_stage_total{stage="timed out",topology="words"} 1.0' in lines
    assert 'ackstream_stage_tuples_total{side="in",stage="w",topology="words"} 9.0' in lines
    for name in types:  # HELP, TYPE, then the family's samples, together
        at = lines.index(f"# TYPE {name} {types[name]}")
        assert lines[at - 1].startswith(f"# HELP {name} ") and lines[at + 1].startswith(name)


def test_a_dead_letter_written_twice_counts_once():
    """After a crash the source may write a letter again: it is one record."""
    letter = {"topic": "t", "partition": 0, "offset": 2, "attempts": 2}
    letters = pa.Table.from_pylist([letter, letter], schema=DEAD_LETTER_SCHEMA)
    rows = [done(1, FAILED, 2, attempt=0), done(2, FAILED, 2, attempt=1)]
    status = summarize([1, 2], completions(rows), letters)
    assert (status.failed, status.replayed, status.dead_lettered) == (2, 1, 1)


@pytest.mark.broker
def test_kafka_status_leaves_rejected_dead_letters_out_of_the_replayed_count(broker):
    """The dead-letter topic holds letters of rejected records too: only the letters of
    failed or timed-out attempts make those roots not replayed."""
    from ackstream.channels.kafka import KafkaChannel
    from ackstream.sinks.dead_letters import KafkaDeadLetters
    from ackstream.ui.status_sources import kafka_status

    topology = f"replayed-{os.urandom(4).hex()}"
    channel = KafkaChannel(broker.bootstrap, topology, partitions=1)
    channel.prepare()
    rows = [
        done(1, FAILED, 1),  # replayed as root 2
        done(2, FAILED, 1, attempt=1),  # its last attempt: dead-lettered
        done(3, TIMED_OUT, 3),  # replayed
        done(4, FAILED, 4),  # replayed
        done(5, REJECTED, 5),  # dead-lettered at once
        done(6, REJECTED, 6),  # dead-lettered at once
    ]
    try:
        channel.write_completions(completions(rows), 0)
    finally:
        channel.close()
    letters = KafkaDeadLetters(broker.bootstrap, f"{topology}.dead", topology)
    try:
        letters.write(
            [
                DeadLetter("t", 0, 1, 2, "failed"),
                DeadLetter("t", 0, 5, 1, "rejected: parse: bad"),
                DeadLetter("t", 0, 6, 1, "rejected: parse: bad"),
            ],
            {},
        )
    finally:
        letters.close()
    status = kafka_status(broker.bootstrap, topology)
    assert (status.failed, status.timed_out, status.rejected) == (3, 1, 2)
    assert (status.replayed, status.dead_lettered) == (3, 3)


def runs(namespace, spans, topic="t"):
    """Completions of runs of acked offsets, as a batch writes them: ``spans`` is
    ``[(partition, first, end), ...]``, each run's root the first offset's."""
    from ackstream.vocabulary import ids
    from ackstream.vocabulary.records import completion_table

    part, first, end = (list(c) for c in zip(*spans))
    return completion_table(
        ids.root_ids(namespace, topic, part, first, 0),
        ACKED,
        topic=topic,
        partition=part,
        offset=first,
        attempt=0,
        end_offset=end,
        ids=namespace,
        latency_ms=5,
        completed_ms=0,
    )


def test_a_run_its_partition_cannot_hold_is_counted_invalid_not_expanded(tmp_path):
    """A topology of 4,000 records on t[0] reported them in one run; a damaged or
    forged row claims 1,000,000 offsets past them, another a partition the source does
    not read, another a root its namespace does not mint. Only the 4,000 are acked (a
    forged row made status count 1,004,000 acked, expanded in memory); each other row
    is one invalid completion, and what is expanded stays within the partition."""
    from ackstream.channels.local import SOURCE_METRICS_FILE

    channel = LocalChannel(tmp_path / "ch")
    parts = {"t": {"0": {"end": 4_000, "committed": 4_000, "lag": 0}}}
    (tmp_path / "ch" / SOURCE_METRICS_FILE).write_text(json.dumps({"partitions": parts}))
    channel.write_completions(runs("words", [(0, 0, 4_000)]), 0)
    wrong_root = runs("words", [(0, 0, 4_000)]).set_column(0, "root", pa.array([7], pa.int64()))
    forged = pa.concat_tables(
        [runs("words", [(0, 4_000, 1_004_000), (3, 0, 10)]), runs("other", [(0, 0, 0)]), wrong_root]
    )
    channel.write_completions(forged, 1)
    status = local_status(str(tmp_path / "ch"), "words")
    assert (status.roots, status.acked, status.invalid) == (4_000, 4_000, 4)
    assert "invalid" in "\n".join(status.lines())
    # without the partitions the source saved, no run is known to fit: none is counted
    os.remove(tmp_path / "ch" / SOURCE_METRICS_FILE)
    status = local_status(str(tmp_path / "ch"), "words")
    assert (status.acked, status.invalid) == (0, 5)


@pytest.mark.broker
def test_kafka_status_counts_a_run_past_its_partition_s_end_on_the_brokers_as_invalid(
    broker, new_topic
):
    """With the Kafka channel the brokers say where each partition ends: a run past the
    end of a topic of 5 records, and one of a topic that does not exist, are invalid."""
    from ackstream.channels.kafka import KafkaChannel
    from ackstream.ui.status_sources import kafka_status

    topic = new_topic(partitions=1)
    produce(broker.bootstrap, topic, [str(n) for n in range(5)])
    topology = f"runs-{os.urandom(4).hex()}"
    channel = KafkaChannel(broker.bootstrap, topology, partitions=1)
    channel.prepare()
    try:
        channel.write_completions(runs(topology, [(0, 0, 5)], topic=topic), 0)
        channel.write_completions(runs(topology, [(0, 5, 1_000_000)], topic=topic), 1)
        channel.write_completions(runs(topology, [(0, 0, 3)], topic=f"{topic}-none"), 2)
    finally:
        channel.close()
    status = kafka_status(broker.bootstrap, topology)
    assert (status.roots, status.acked, status.invalid) == (5, 5, 2)


def test_history_bins_the_completions_by_time_with_rates_and_latency_percentiles():
    """Completions over 90 s in 2 s bins: each bin's roots a second by outcome, and the
    percentiles of its acked roots' latency (None where a bin acked nothing)."""
    import numpy as np

    completed = np.array([1_000, 1_500, 2_900, 50_000, 91_000])
    outcomes = np.array(["acked", "replayed", "acked", "dead_lettered", None], dtype=object)
    latency = np.array([100.0, np.nan, 300.0, np.nan, np.nan])
    bins = history(completed, outcomes, latency, bins=60)
    assert [b["t_ms"] for b in bins[:2]] == [1_000, 3_000] and len(bins) == 46
    first = bins[0]
    assert (first["acked"], first["replayed"], first["failed"]) == (1.0, 0.5, 0.5)
    assert (first["p50"], first["p99"]) == (200.0, 298.0)
    dead = next(b for b in bins if b["dead_lettered"])
    assert dead["t_ms"] == 49_000 and dead["p50"] is None
    assert bins[-1]["failed"] == 0.5  # a completion neither acked, replayed nor dead
    assert history(np.array([0]), np.array([None]), np.array([np.nan])) == []


def test_the_latency_histogram_counts_each_latency_in_every_bucket_at_or_above_it():
    import numpy as np

    h = latency_histogram(np.array([5.0, 6.0, 120_000.0]))
    assert h["buckets"][0] == [5, 1] and h["buckets"][1] == [10, 2]
    assert h["buckets"][-1] == [60_000, 2] and (h["count"], h["sum"]) == (3, 120_011.0)


def test_a_status_holds_its_history_and_histogram(tmp_path):
    fill_channel(tmp_path / "ch")
    status = local_status(str(tmp_path / "ch"), "words")
    assert status.latency_histogram["count"] == 5
    assert status.history == []  # fill_channel's completions carry no time


def declared_graph():
    """What ``start()`` writes for the README's payments topology, its stages named."""
    return {
        "nodes": [
            {"name": "spout", "kind": "spout", "after": [], "reason": None},
            {"name": "parse", "kind": "reject_where", "after": ["spout"], "reason": "not a number"},
            {
                "name": "check",
                "kind": "fail_where",
                "after": ["parse"],
                "reason": "negative amount",
            },
            {"name": "cents", "kind": "map", "after": ["check"], "reason": None},
            {"name": "sink#1", "kind": "sink: KafkaSink", "after": ["cents"], "reason": None},
        ]
    }


def test_failures_are_charged_to_the_stage_whose_fixed_reason_they_give():
    rows = [
        finished(1, FAILED, 1, 1, reason="negative amount"),
        finished(2, FAILED, 1, 2, attempt=1, reason="negative amount"),
        finished(3, REJECTED, 3, 1, reason="not a number"),
        finished(4, FAILED, 4, 1, reason="cents: ZeroDivisionError: x"),
        finished(5, FAILED, 5, 1, reason="something else"),
    ]
    before = summarize([], completions(rows), None)  # no graph: counted under the text
    assert before.failed_by_stage["negative amount"] == 2
    status = summarize([], completions(rows), None, graph=declared_graph())
    assert status.failed_by_stage == {"check": 2, "cents": 1, "something else": 1}
    assert status.rejected_by_stage == {"parse": 1}
    assert status.failed_reasons["check"] == {"negative amount": 2}  # the reason beside it
    assert status.failed_reasons["cents"] == {"ZeroDivisionError: x": 1}
    assert f"    {'check':<24}{2:>8}   negative amount (2)" in status.lines()


def test_failures_by_stage_count_from_when_the_checkpoint_began():
    rows = [
        finished(1, FAILED, 1, 10, reason="negative amount"),  # an earlier checkpoint's
        finished(2, FAILED, 2, 30, reason="negative amount"),
    ]
    status = summarize([], completions(rows), None, graph=declared_graph(), stages_since_ms=20_000)
    assert status.failed == 2  # the cards count everything the channel holds
    assert status.failed_by_stage == {"check": 1}
    assert any(
        "failed by stage (since the checkpoint began, 1970-01-01 00:00:20 UTC)" in line
        for line in status.lines()
    )


def a_checkpoint(tmp_path, began_s=None):
    """A topology's checkpoint folder as ``start()`` leaves it: the declared graph, and
    Spark's ``metadata`` file written when the query first started."""
    from ackstream.topology.described import write_graph

    folder = tmp_path / "checkpoint" / "topology"
    write_graph(str(folder), declared_graph())
    (folder / "metadata").write_text("{}")
    if began_s is not None:
        os.utime(folder / "metadata", (began_s, began_s))
    return str(tmp_path / "checkpoint")


def test_the_declared_graph_is_read_beside_the_checkpoint_without_stage_counts(tmp_path):
    from ackstream.ui.status_sources import StatusSource

    fill_channel(tmp_path / "ch")
    checkpoint = a_checkpoint(tmp_path, began_s=0)
    status = StatusSource("words", channel=str(tmp_path / "ch"), checkpoint=checkpoint).read()
    assert status.stages == {}  # no stage counts kept
    names = [n["name"] for n in status.graph["nodes"]]
    assert names == ["spout", "parse", "check", "cents", "sink#1"]
    assert status.graph["nodes"][2]["after"] == ["parse"]
    assert status.stages_since_ms == 0
    assert status.run is None  # no process has run it
    without = StatusSource("words", channel=str(tmp_path / "ch")).read()
    assert (without.graph, without.stages_since_ms) == (None, None)


class Progress(dict):
    """What Spark's listener bus gives a listener (pyspark's progress is a dict too):
    the source's own count of the records read since it started (``read``), when it
    reports one, beside Spark's ``numInputRows``."""

    def __init__(self, query_id, batch_id, read=None, spark_rows=40):
        metrics = {"pending": 0, "partitions": {}, "read": read}
        super().__init__(sources=[{"latestOffset": json.dumps(metrics)}] if read else [])
        self.id, self.batchId, self.numInputRows = query_id, batch_id, spark_rows
        self.durationMs = {"triggerExecution": 120}


class Event:
    def __init__(self, query_id, progress=None, exception=None):
        self.id, self.progress, self.exception = query_id, progress, exception


def test_the_run_a_process_records_is_read_as_the_header_says_it(tmp_path):
    from ackstream.topology.described import RunRecorder
    from ackstream.ui.status_sources import StatusSource

    fill_channel(tmp_path / "ch")
    checkpoint = a_checkpoint(tmp_path)
    folder = os.path.join(checkpoint, "topology")
    source = StatusSource("words", channel=str(tmp_path / "ch"), checkpoint=checkpoint)
    recorder = RunRecorder(folder, "q-1", "http://127.0.0.1:4040")
    run = source.read().run
    assert (run["state"], run["last_batch"], run["spark_ui"], run["pid"]) == (
        "running",
        None,
        "http://127.0.0.1:4040",
        os.getpid(),
    )
    recorder.onQueryProgress(Event("q-1", Progress("q-other", 9, read=5)))  # another query's
    recorder.onQueryProgress(Event("q-1", Progress("q-1", 3)))  # no count of its own: Spark's
    assert source.read().run["last_batch"]["rows"] == 40
    recorder.onQueryProgress(Event("q-1", Progress("q-1", 4, read=22, spark_rows=0)))
    before = source.read().run["last_batch"]["ended_ms"]
    recorder.onQueryProgress(Event("q-1", Progress("q-1", 5, read=30, spark_rows=0)))
    status = source.read()
    # the source's count, not Spark's 0 (its Kafka connector's rows are counted nowhere
    # there): the batch's rows are what it read since the last progress
    assert status.read == 30 and status.run["read"] == 30
    batch = status.run["last_batch"]
    waited = batch["ended_ms"] - before  # since the last progress
    assert {k: batch[k] for k in ("id", "duration_ms", "rows", "processed_per_s")} == {
        "id": 5,
        "duration_ms": 120,
        "rows": 8,
        "processed_per_s": 8 * 1000 / 120,
    }
    assert batch["input_per_s"] == (8 * 1000 / waited if waited else None)
    (line,) = [x for x in status.lines() if "last batch" in x]
    assert "running since" in line and "last batch 5 took 120 ms (8 rows, " in line
    assert "processed 66.7 rows/s" in line
    assert line.endswith("Spark UI http://127.0.0.1:4040")
    recorder.onQueryTerminated(Event("q-1", exception="StreamingQueryException: boom\n at ..."))
    run = source.read().run
    assert run["state"] == "stopped" and run["stopped_ms"] >= run["started_ms"]
    assert run["error"] == "StreamingQueryException: boom"


#: A process that keeps a run file as a started topology's does, then waits for stdin.
RECORDING = """
import sys
from ackstream.topology.described import RunRecorder
RunRecorder(sys.argv[1], "q-1", None)
print("recording", flush=True)
sys.stdin.read()
"""


def test_a_killed_process_s_run_reads_stopped_and_a_silent_one_not_responding(tmp_path):
    import signal
    import socket
    import subprocess
    import sys

    from ackstream.topology.described import RUN_FILE, SILENT_MS, read_run
    from ackstream.vocabulary.clock import now_ms

    folder = str(tmp_path / "topology")
    process = subprocess.Popen(
        [sys.executable, "-c", RECORDING, folder],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline() == "recording\n"  # its file is written
        run = read_run(folder)
        assert (run["state"], run["pid"], run["host"]) == (
            "running",
            process.pid,
            socket.gethostname(),
        )
        # alive but not heard from for longer than the bound: not responding
        silent = read_run(folder, now=run["heard_ms"] + SILENT_MS + 1)
        assert silent["state"] == "not responding"
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=60)  # gone (and reaped): no more a process
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=60)
    with open(os.path.join(folder, RUN_FILE)) as f:
        assert json.load(f)["state"] == "running"  # what the killed process left
    run = read_run(folder)
    assert run["state"] == "stopped" and run["stopped_ms"] is None
    assert f"pid {process.pid}" in run["error"] and "killed" in run["error"]
    from ackstream.ui.status import run_line

    assert run_line(run).startswith("stopped after ")
    # read from another host, the pid says nothing: the silence does
    with open(os.path.join(folder, RUN_FILE)) as f:
        elsewhere = {**json.load(f), "host": "another-host"}
    with open(os.path.join(folder, RUN_FILE), "w") as f:
        json.dump(elsewhere, f)
    assert read_run(folder, now=elsewhere["heard_ms"] + 1)["state"] == "running"
    late = read_run(folder, now=elsewhere["heard_ms"] + SILENT_MS + 1)
    assert late["state"] == "not responding"
    assert run_line(late).startswith("not responding since ")
    # under Spark Connect the query runs in the server: no listener here, no silence
    from ackstream.topology.described import RunRecorder

    connected = str(tmp_path / "connected")
    RunRecorder(connected, "q-2", None, listened=False)
    assert read_run(connected, now=now_ms() + 10 * SILENT_MS)["state"] == "running"


@pytest.mark.broker
def test_status_of_a_kafka_channel_shows_the_rows_read_as_a_local_one_does(
    broker, tmp_path, capsys
):
    from ackstream.channels.kafka import KafkaChannel
    from ackstream.cli import main
    from ackstream.topology.described import RunRecorder

    topology = f"status-{os.urandom(4).hex()}"
    channel = KafkaChannel(broker.bootstrap, topology, partitions=1)
    channel.prepare()
    try:
        channel.write_acks(ack_records([init(r, r, offset=r, ts=1) for r in (1, 2)]))
        channel.write_completions(completions([done(1, ACKED, 1, latency=7)]), 0)
    finally:
        channel.close()
    checkpoint = a_checkpoint(tmp_path)
    recorder = RunRecorder(os.path.join(checkpoint, "topology"), "q-1", None)
    # the source's own count, as its progress carries it; Spark's connector counted 0
    recorder.onQueryProgress(Event("q-1", Progress("q-1", 1, read=2, spark_rows=0)))
    base = ["status", "--bootstrap", broker.bootstrap, "--topology", topology]
    assert main([*base, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["read"] is None  # no checkpoint: unknown
    assert main([*base, "--checkpoint", checkpoint, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["read"] == 2
    assert main([*base, "--checkpoint", checkpoint]) == 0
    said = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["read", "2", "(records", "the", "source", "read", "since", "it", "started)"] in said


def test_a_paused_run_says_which_sink_it_waits_for_since_when_and_that_nothing_is_charged(
    tmp_path,
):
    """The pause file of this run reads into the run state and its line; one older
    than the run's start (a killed process's) does not."""
    import socket

    from ackstream.topology.described import PAUSED_FILE, RUN_FILE, read_run
    from ackstream.ui.status import run_line
    from ackstream.vocabulary.clock import now_ms

    folder, now = str(tmp_path), now_ms()
    run = {"state": "running", "pid": os.getpid(), "host": socket.gethostname()}
    with open(os.path.join(folder, RUN_FILE), "w") as f:
        json.dump({**run, "started_ms": now - 60_000, "heard_ms": now}, f)

    def pause(since_ms):
        with open(os.path.join(folder, PAUSED_FILE), "w") as f:
            sink = {"sink": "KafkaSink to out", "error": "TimeoutException", "retry_s": 8}
            json.dump({**sink, "since_ms": since_ms}, f)

    pause(now - 30_000)
    line = run_line(read_run(folder, now=now))
    assert "; paused: sink KafkaSink to out unreachable since " in line
    assert "(TimeoutException)" in line and "no record is charged" in line
    assert "within 8 s" in line
    pause(now - 90_000)  # before this run started
    assert read_run(folder, now=now)["paused"] is None
    assert "paused" not in run_line(read_run(folder, now=now))
