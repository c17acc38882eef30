"""The ackstream source with the built-in generator upstream, end to end through the acker."""

import os

import pytest

from ackstream import read_dead_letters
from ackstream.channels.local import LocalChannel
from ackstream.sources.generator import sentence
from ackstream.testing import SpoutAcker
from ackstream.vocabulary.records import FAILED, TIMED_OUT

from helpers import commits, generator_stream, start_foreach_batch, start_two_shard_acker, wait_for

pytestmark = pytest.mark.spark


def stop_once_committed(channel_dir, offsets, timeout, *queries):
    """Wait until the source has committed the generator's ``offsets``, then stop
    ``queries``, also when the wait fails."""
    try:
        wait_for(
            lambda: commits(channel_dir) == offsets, timeout=timeout, what="every offset committed"
        )
    finally:
        for query in queries:
            query.stop()


def test_generator_records_are_tracked_replayed_and_dead_lettered(spark, tmp_path):
    channel_dir = str(tmp_path / "channel")
    channel = LocalChannel(channel_dir)
    topology = SpoutAcker(channel, fail=lambda f: f["offset"] % 10 == 3)
    acker = start_two_shard_acker(spark, channel, tmp_path / "acker", 3000, trigger_ms=200)
    frame = generator_stream(
        spark,
        channel_dir,
        **{"generator.count": 40, "generator.partitions": 2},
        topology="gen-test",
        messageTimeout="3s",
        sourceTimeout="30s",  # a cold acker may take longer
        retryInitialDelay="100ms",
        maxRetries=1,
    )
    assert frame.columns == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "_root",
        "_edge",
        "_attempt",
        "_reason",
    ]
    query = start_foreach_batch(frame, topology, str(tmp_path / "source"))
    stop_once_committed(channel_dir, {"generator/0": 20, "generator/1": 20}, 90, query, acker)
    seen = {(r["partition"], r["offset"], r["_attempt"]) for r in topology.rows}
    failing = {(p, o) for p in (0, 1) for o in range(20) if o % 10 == 3}
    assert {(p, o) for p, o, a in seen if a == 0} == {(p, o) for p in (0, 1) for o in range(20)}
    assert {(p, o) for p, o, a in seen if a == 1} == failing
    letters = read_dead_letters(os.path.join(channel_dir, "dead_letters")).to_pylist()
    assert sorted((d["partition"], d["offset"]) for d in letters) == sorted(failing)
    assert {(d["attempts"], d["reason"]) for d in letters} == {(2, FAILED)}
    assert letters[0]["value"].decode() == sentence(letters[0]["partition"], letters[0]["offset"])


def test_an_idle_acker_is_ticked_by_the_source_and_times_out_a_lost_tree(spark, tmp_path):
    """The acker runs no idle batches: the source's tick makes it expire the root whose
    acks were lost, long before the source would give up on it (source timeout)."""
    channel_dir = str(tmp_path / "channel")
    channel = LocalChannel(channel_dir)
    topology = SpoutAcker(channel, lose=lambda f: (f["offset"] == 3) & (f["_attempt"] == 0))
    acker = start_two_shard_acker(spark, channel, tmp_path / "acker", 2000, trigger_ms=200)
    frame = generator_stream(
        spark,
        channel_dir,
        **{"generator.count": 10, "generator.partitions": 1},
        topology="tick-test",
        messageTimeout="2s",
        sourceTimeout="1h",
        retryInitialDelay="100ms",
    )
    query = start_foreach_batch(frame, topology, str(tmp_path / "source"))
    stop_once_committed(channel_dir, {"generator/0": 10}, 120, query, acker)
    done = channel.completions_since(None)[0].to_pylist()
    assert [(c["offset"], c["attempt"]) for c in done if c["status"] == TIMED_OUT] == [(3, 0)]
    assert {(r["offset"], r["_attempt"]) for r in topology.rows} == {(o, 0) for o in range(10)} | {
        (3, 1)
    }


def test_tracking_off_commits_what_spark_committed_and_max_offsets_per_trigger(spark, tmp_path):
    channel_dir = str(tmp_path / "channel")
    sizes = []
    query = (
        spark.readStream.format("ackstream")
        .option("ackstream.upstream", "generator")
        .option("ackstream.generator.count", "12")
        .option("ackstream.channel", channel_dir)
        .option("ackstream.tracking", "false")
        .option("maxOffsetsPerTrigger", "4")
        .load()
        .writeStream.foreachBatch(lambda df, _: sizes.append(df.filter("_attempt = 0").count()))
        .option("checkpointLocation", str(tmp_path / "source"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    stop_once_committed(channel_dir, {"generator/0": 6, "generator/1": 6}, 60, query)
    assert sum(sizes) == 12 and max(sizes) == 4


def test_the_run_file_example_of_the_cli_runs_unbounded(spark, tmp_path):
    """``ackstream run --help`` shows one run file: an unbounded generator with no rate,
    which runs as fast as its batches go, without end. Run as ``run`` runs it."""
    import runpy
    import textwrap

    from ackstream.cli.run import RUN_HELP
    from ackstream.topology.running import stop_queries

    example = textwrap.dedent(RUN_HELP.split("e.g. words.py:")[1])
    assert "/tmp/words/" in example and "generator.count" not in example
    words = tmp_path / "words.py"
    words.write_text(example.replace("/tmp/words", str(tmp_path)))
    before = {q.id for q in spark.streams.active}
    runpy.run_path(str(words), init_globals={"spark": spark}, run_name="__main__")
    started = [q for q in spark.streams.active if q.id not in before]
    try:
        wait_for(
            lambda: (
                sum(commits(tmp_path / "channel").values()) > 0
                or any(q.exception() for q in started)
            ),
            timeout=180,
            interval=0.5,
            what="the first records committed",
        )
        assert not any(q.exception() for q in started), [q.exception() for q in started]
    finally:
        stop_queries(started)


def test_a_query_that_starts_with_nothing_to_read_runs_its_first_batch(spark, tmp_path):
    """Spark runs a new query's first batch even when ``latestOffset`` returns the
    initial offset (nothing to read yet): that batch reads nothing, and the records
    that come later are read by the next ones."""
    frame = generator_stream(
        spark,
        str(tmp_path / "channel"),
        **{"generator.rate": 1, "generator.partitions": 1},  # nothing at first
        topology="starts-empty",
    )
    seen: list = []

    def collect(batch, batch_id):
        seen.append(batch.count())

    query = start_foreach_batch(frame, collect, str(tmp_path / "checkpoint"))
    try:
        wait_for(
            lambda: sum(seen) > 0 or query.exception(),
            timeout=120,
            interval=0.2,
            what="a record read",
        )
        assert query.exception() is None, query.exception()
        assert seen[0] == 0  # the first batch: the initial offset, nothing in it
    finally:
        query.stop()
