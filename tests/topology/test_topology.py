"""A topology as real streaming queries: the stages' query and the acker on a local channel."""

import json
import os

import pytest
from pyspark.sql import functions as F

from ackstream.channels.local import LocalChannel
from ackstream.sinks.memory import MemorySink
from ackstream.testing import with_lineage
from ackstream.topology import Topology
from ackstream.ui.status_sources import stages_in
from ackstream.vocabulary.records import ACKED, FAILED

from helpers import stop_once_settled, wait_for

pytestmark = pytest.mark.spark

LINES = ["the quick fox", "jumps over", "the boom dog", "quick quick", "", "fox"]
SCHEMA = "key string, value string, topic string, partition int, offset long"


def line_stream(spark, directory, lines, tracked=True):
    """A file stream of ``lines`` at offsets 0, 1, ... of topic 'lines' (one JSON file)."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "part-0.json"), "w") as f:
        for offset, line in enumerate(lines):
            f.write(
                json.dumps(
                    {"key": None, "value": line, "topic": "lines", "partition": 0, "offset": offset}
                )
                + "\n"
            )
    stream = spark.readStream.schema(SCHEMA).json(str(directory))
    return with_lineage(stream, source="test") if tracked else stream


def word_count(spark, channel, sink, tracking=True, message_timeout_ms=30_000):
    return (
        Topology(
            "wordcount",
            spark,
            channel,
            tracking=tracking,
            message_timeout_ms=message_timeout_ms,
            stage_counts=True,
        )
        .explode(F.split("value", " "), "word")
        .where(F.col("word") != "")
        .fail_where(F.col("word") == "boom")
        .aggregate("word", F.count("*").alias("n"))
        .sink(sink)
    )


def test_stream_acks_every_root_and_fails_the_injected_one(spark, tmp_path):
    channel = LocalChannel(tmp_path / "channel")
    sink = MemorySink()
    topology = word_count(spark, channel, sink, message_timeout_ms=120_000)
    running = topology.start(
        line_stream(spark, tmp_path / "in", LINES), str(tmp_path / "ckpt"), trigger_ms=200
    )
    seen, position = [], -1
    try:

        def all_done():
            nonlocal position
            table, position = channel.completions_since(position)
            seen.extend(table.to_pylist())
            return len(seen) >= len(LINES) or running.exception()

        wait_for(all_done, timeout=150, what="a completion for every line")
        assert running.exception() is None
    finally:
        running.stop()
    status = {c["offset"]: c["status"] for c in seen}
    assert status == {i: (FAILED if "boom" in line else ACKED) for i, line in enumerate(LINES)}
    counts = {r["word"]: r["n"] for r in sink.rows()}
    assert counts == {"the": 2, "quick": 3, "fox": 2, "jumps": 1, "over": 1, "dog": 1}
    # Storm UI's executed (in) and emitted (out) per stage: 6 lines, 12 words (an empty
    # line splits to one empty word), 11 not empty, 10 without "boom", 6 distinct
    assert stages_in(str(tmp_path / "ckpt")) == {
        "explode#1": {"in": 6, "out": 12},
        "filter#2": {"in": 12, "out": 11},
        "fail_where#3": {"in": 11, "out": 10},
        "aggregate#4": {"in": 10, "out": 6},
        "sink#1": {"in": 6},
    }


class ClosedOnStop(MemorySink):
    closed = 0

    def close(self):
        self.closed += 1


def test_tracking_off_writes_no_ack_records_and_stop_closes_the_sink(spark, tmp_path):
    channel = LocalChannel(tmp_path / "channel")
    sink = ClosedOnStop()
    topology = word_count(spark, channel, sink, tracking=False)
    stream = line_stream(spark, tmp_path / "in", LINES, tracked=False)
    running = topology.start(stream, str(tmp_path / "ckpt"), trigger_ms=200)
    try:
        assert running.acker is None
        running.process_all_available()
        assert sink.closed == 0
    finally:
        running.stop()
    assert sink.closed == 1
    assert {r["word"] for r in sink.rows()} == {"the", "quick", "fox", "jumps", "over", "dog"}
    assert os.listdir(channel.acks_dir) == []


@pytest.mark.parametrize("ackers", [-1, 1.5, True])
def test_ackers_must_be_a_whole_number_of_shards(ackers):
    import ackstream

    with pytest.raises(ackstream.OptionError, match="ackers.*or 0: tracking off"):
        Topology("shards", None, None, ackers=ackers)


@pytest.mark.parametrize("off", [{"tracking": False}, {"ackers": 0}])
def test_continuing_trees_with_tracking_off_is_refused(off):
    """A topology that continues an upstream topology's trees tracks them: with tracking
    off it would read their lineage headers and track nothing, so it is refused."""
    import ackstream

    with pytest.raises(ackstream.OptionError, match="continue_trees.*tracking is off"):
        Topology("down", None, None, continue_trees=True, **off)
    assert Topology("down", None, None, continue_trees=True).mode.continues_trees


def test_ackers_zero_reads_its_source_untracked_like_tracking_off(tmp_path):
    """Storm with no ackers acks every tuple at emit: ``ackers=0`` is tracking off, and
    the source is told so (else it would wait for completions nobody reports)."""
    import ackstream
    from ackstream.config.source import parse

    channel = LocalChannel(tmp_path / "channel")
    none, off = Topology("t", None, channel, ackers=0), Topology("t", None, channel, tracking=False)
    options = {"ackstream.upstream": "generator"}
    assert not none.tracking
    assert none.source_options(options) == off.source_options(options)
    assert not parse(none.source_options(options)).tracking
    assert parse(Topology("t", None, channel).source_options(options)).tracking
    with pytest.raises(ackstream.OptionError, match="ackstream.tracking"):
        none.source_options({**options, "ackstream.tracking": "true"})


def test_a_topology_without_a_session_says_what_to_give_before_reading_or_starting(tmp_path):
    """``spark=None`` declares and runs batches it is given; reading its stream or
    starting it asks for the session, and the error says what to give, in one line."""
    import ackstream

    channel = LocalChannel(tmp_path / "channel")
    detached = Topology("t", None, channel).sink(MemorySink()).without_session()
    for attempt in (
        lambda: detached.read_stream({"ackstream.upstream": "generator"}),
        lambda: detached.session(),
    ):
        with pytest.raises(ackstream.OptionError) as raised:
            attempt()
        assert raised.value.option == "spark"
        assert "SparkSession" in str(raised.value) and "local_session()" in str(raised.value)
        assert "\n" not in str(raised.value)
    assert detached.source_config is None  # refused before anything was set


def test_a_topology_with_no_ackers_commits_each_batch_and_writes_no_ack_records(spark, tmp_path):
    from helpers import commits

    channel_dir = str(tmp_path / "channel")
    channel = LocalChannel(channel_dir)
    sink = MemorySink()
    topology = (
        Topology("no-ackers", spark, channel, ackers=0)
        .fail_where(F.col("offset") == 3)  # nothing tracks it: no replay
        .sink(sink)
    )
    stream = topology.read_stream(
        {"ackstream.upstream": "generator", "ackstream.generator.count": "20"}
    )
    running = topology.start(stream, str(tmp_path / "ckpt"), trigger_ms=200)
    try:
        assert running.acker is None
        wait_for(
            lambda: (
                commits(channel_dir) == {"generator/0": 10, "generator/1": 10}
                or running.exception()
            ),
            timeout=300,
            what="every offset committed",
        )
        assert running.exception() is None
    finally:
        running.stop()
    assert os.listdir(channel.acks_dir) == []
    assert channel.completions_since(None)[0].num_rows == 0
    assert sorted((r["partition"], r["offset"]) for r in sink.rows()) == [
        (p, o) for p in (0, 1) for o in range(10) if o != 3
    ]


def test_a_started_topology_settles_its_batches_from_the_offsets_without_rereading(spark, tmp_path):
    """The roots come from the source's logged offset, not from the rows: a record the
    stream drops before the stages is acked like a filtered tuple, and fails still fail.
    (Read from the rows, the dropped ones would wait for the 10-minute source timeout.)"""
    from helpers import commits, generator_stream

    channel_dir = str(tmp_path / "channel")
    channel = LocalChannel(channel_dir)
    stream = generator_stream(
        spark,
        channel_dir,
        topology="planned",
        messageTimeout="5 min",
        retryInitialDelay="50ms",
        **{"generator.count": 40},
    )
    sink = MemorySink()
    topology = (
        Topology("planned", spark, channel, message_timeout_ms=300_000, stage_counts=True)
        .fail_where((F.col("offset") == 4) & (F.col("_attempt") == 0))
        .sink(sink)
    )
    running = topology.start(stream.where("offset % 2 = 0"), str(tmp_path / "ckpt"), trigger_ms=200)
    stop_once_settled(running, 40, timeout_s=90)
    assert commits(channel_dir) == {"generator/0": 20, "generator/1": 20}
    done = channel.completions_since(None)[0].to_pylist()
    assert {(c["partition"], c["offset"]) for c in done if c["status"] == ACKED} == {
        (p, o) for p in (0, 1) for o in range(20)
    }
    assert sorted(
        (c["partition"], c["offset"], c["attempt"]) for c in done if c["status"] == FAILED
    ) == [(0, 4, 0), (1, 4, 0)]
    assert sorted((r["partition"], r["offset"]) for r in sink.rows()) == sorted(
        (p, o) for p in (0, 1) for o in range(0, 20, 2)
    )
    # counted from the offsets' planned rows too: 20 even offsets, then offset 4 of both
    # partitions again; its first attempts failed in the stage, not in the sink
    assert stages_in(str(tmp_path / "ckpt")) == {
        "fail_where#1": {"in": 22, "out": 20},
        "sink#1": {"in": 20},
    }


def test_stop_waits_for_the_batch_in_progress_to_end(spark, tmp_path):
    """Spark interrupts a batch it stops in the middle (and prints a long error when that
    lands in Python code): a running topology stops between its batches."""

    def slow(frame):
        import time

        time.sleep(1.5)
        return frame[["value"]]

    sink = MemorySink()
    topology = (
        Topology("slow", spark, LocalChannel(tmp_path / "channel"), tracking=False)
        .pandas_bolt(slow, "value string")
        .sink(sink)
    )
    stream = line_stream(spark, tmp_path / "in", LINES, tracked=False)
    running = topology.start(stream, str(tmp_path / "ckpt"), trigger_ms=100)
    try:
        wait_for(
            lambda: (
                running.query.status.get("isTriggerActive")
                and running.query.status.get("message", "").startswith("Processing")
            ),
            timeout=60,
            interval=0.02,
            what="the first batch to be running",
        )
    finally:
        running.stop()
    assert running.query.exception() is None
    assert sorted(r["value"] for r in sink.rows()) == sorted(LINES)


def test_a_busy_topology_stops_once_its_batch_in_progress_is_written(spark, tmp_path):
    """Batches slower than the trigger run back to back, with no gap between triggers to
    stop in: stop() lets the batch in progress finish and be written, then stops before
    the next batch begins. No batch is interrupted in its foreachBatch function (which
    made Spark print a long StackOverflowError, and left the batch unwritten)."""
    folder, begun = tmp_path / "in", tmp_path / "begun"
    folder.mkdir()
    begun.mkdir()
    for n in range(40):  # a file a batch: each batch's rows are "<file>-<line>"
        lines = [
            {"key": None, "value": f"{n}-{k}", "topic": "lines", "partition": 0, "offset": k}
            for k in range(3)
        ]
        (folder / f"part-{n:02d}.json").write_text("".join(json.dumps(x) + "\n" for x in lines))

    def slow(frame):
        import time

        for value in frame["value"]:
            (begun / value.split("-")[0]).touch()
        time.sleep(0.3)
        return frame[["value"]]

    def written() -> set[str]:
        return {row["value"].split("-")[0] for row in sink.rows()}

    sink = MemorySink()
    topology = (
        Topology("busy", spark, LocalChannel(tmp_path / "channel"), tracking=False)
        .pandas_bolt(slow, "value string")
        .sink(sink)
    )
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(folder))
    running = topology.start(stream, str(tmp_path / "ckpt"), trigger_ms=100)
    try:
        wait_for(
            lambda: len(os.listdir(begun)) >= 3 and len(os.listdir(begun)) > len(written()),
            timeout=120,
            interval=0.02,
            what="a third batch to be running",
        )
        in_progress = set(os.listdir(begun))
    finally:
        running.stop()
    assert running.query.exception() is None
    assert in_progress <= written()  # the batch in progress finished and was written
    # it stops within a batch or so (a poll of the status may miss one gap between two
    # batches); before, a busy query ran on for the whole 10 s wait (9 batches here)
    assert len(set(os.listdir(begun)) - in_progress) <= 2
    assert written() == set(os.listdir(begun))  # no batch was interrupted


def test_read_stream_raises_a_bad_option_as_an_option_error_naming_it(spark, tmp_path):
    """Spark wraps what load() raises in its own AnalysisException; read_stream checks first."""
    import ackstream

    topology = Topology("opts", spark, LocalChannel(tmp_path / "channel"))
    with pytest.raises(ackstream.OptionError, match="did you mean 'ackstream.maxRetries'"):
        topology.read_stream({"ackstream.upstream": "generator", "ackstream.maxRetrys": "3"})
    with pytest.raises(ackstream.OptionError, match="ackstream.messageTimeout"):
        topology.read_stream({"ackstream.upstream": "generator", "ackstream.messageTimeout": "1s"})


def test_a_source_given_other_terms_than_its_topology_is_refused_at_the_first_batch(
    spark, tmp_path
):
    from helpers import generator_stream

    channel_dir = str(tmp_path / "channel")
    stream = generator_stream(
        spark, channel_dir, topology="other", messageTimeout="30s", **{"generator.count": 10}
    )
    topology = Topology("mine", spark, LocalChannel(channel_dir), message_timeout_ms=30_000)
    running = topology.sink(MemorySink()).start(stream, str(tmp_path / "ckpt"), trigger_ms=100)
    try:
        wait_for(lambda: running.exception(), timeout=90, what="the first batch to fail")
    finally:
        running.stop()
    message = str(running.exception())
    assert "ackstream.topology" in message and "'other'" in message and "'mine'" in message


@pytest.mark.broker
def test_a_kafka_channel_takes_the_sources_client_settings_and_refuses_other_ones(
    spark, broker, new_topic
):
    """Security settings are given once, to the source: the topology's KafkaChannel (which
    writes the completions the source reads) takes those it lacks. Other brokers, or a
    setting both were given with different values, would have the source read one channel
    and the topology write another: refused, naming both."""
    import ackstream
    from ackstream.channels.kafka import KafkaChannel

    channel = KafkaChannel(
        broker.bootstrap, "agree", kafka_options={"kafka.reconnect.backoff.ms": "100"}
    )
    topology = Topology("agree", spark, channel)
    options = {
        "kafka.bootstrap.servers": broker.bootstrap,
        "subscribe": new_topic(),
        "kafka.security.protocol": "PLAINTEXT",
        "kafka.request.timeout.ms": "20000",
        "kafka.max.poll.records": "50",  # a consumer's setting: not the channel's business
    }
    topology.read_stream(options)
    assert topology.channel.kafka_options == {
        "kafka.reconnect.backoff.ms": "100",
        "kafka.security.protocol": "PLAINTEXT",
        "kafka.request.timeout.ms": "20000",
    }
    assert topology.channel.settings["request_timeout_ms"] == 20000
    assert channel.kafka_options == {
        "kafka.reconnect.backoff.ms": "100"
    }  # the user's object is left alone

    with pytest.raises(
        ackstream.OptionError, match="kafka.reconnect.backoff.ms.*.100., the value the"
    ):
        Topology("agree", spark, channel).read_stream(
            {**options, "kafka.reconnect.backoff.ms": "200"}
        )
    elsewhere = KafkaChannel("127.0.0.1:1", "agree")
    with pytest.raises(ackstream.OptionError, match="kafka.bootstrap.servers.*127.0.0.1:1"):
        Topology("agree", spark, elsewhere).read_stream(options)
