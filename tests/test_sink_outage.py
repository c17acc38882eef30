"""A sink whose broker stalls (SIGSTOP) pauses the topology, which charges no record
and goes on by itself once the broker answers again.

The upstream is the generator and the channel a local one, so that the stalled broker
is the sink's only: the batch in flight finds it unreachable, waits (the pause's file
in the checkpoint says so, and a line on stderr), and once the broker is resumed
writes again. Nothing is failed, replayed, timed out or dead-lettered, although the
pause outlasts the message timeout, and every record reaches the sink's topic. The
batch deadline does not run down while the batch waits (a test of its own; the long
run's outage outlasts the default deadline).

The long run (``make test-cluster``) holds the stall ``ACKSTREAM_OUTAGE_S`` seconds
(60 by default; 600 for the figure of the reliability page) at 20,000 records a
batch, and measures the CPU the driver and its JVM use while paused and how soon the
lag is back to 0 after the broker's return.
"""

from __future__ import annotations

import json
import os
import time
import uuid

import pytest
from pyspark.sql import functions as F

from ackstream import KafkaSink, LocalChannel, Topology
from ackstream.testing import wait_until_settled
from ackstream.topology.batch_failure import BatchDeadline
from ackstream.topology.described import PAUSED_FILE
from ackstream.ui.status import source_metrics

from helpers import consume, spark_kafka_jars, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.broker]

#: the Python writer's run is in make test-e2e: the suite's 20 minutes keep one writer
WRITERS = [
    pytest.param("python", marks=pytest.mark.e2e) if spark_kafka_jars() else "python",
    *(["spark"] if spark_kafka_jars() else []),
]


def keyed(df):
    """Each record's message keyed by its partition and offset, to count them."""
    return df.withColumn(
        "key", F.concat_ws(":", F.col("partition").cast("string"), F.col("offset").cast("string"))
    )


def start(spark, broker, tmp_path, outbox: str, records: int, writer: str, **settings):
    """The topology over ``records`` generated records, its sink on the broker; the
    running topology and the path of its pause file."""
    name = settings.get("name") or f"stall-{uuid.uuid4().hex[:8]}"
    channel = str(tmp_path / "channel")
    timeout_ms = settings.get("message_timeout_ms", 5_000)
    topology = (
        Topology(
            name,
            spark,
            LocalChannel(channel),
            message_timeout_ms=timeout_ms,
            batch_deadline_ms=settings.get("batch_deadline_ms", 300_000),
        )
        .map(keyed)
        .sink(KafkaSink(broker.bootstrap, outbox, flush_timeout_s=5, writer=writer))
    )
    options = {
        "ackstream.upstream": "generator",
        "ackstream.channel": channel,
        "ackstream.topology": name,
        "ackstream.messageTimeout": f"{timeout_ms}ms",
        "ackstream.generator.count": str(records),
        "ackstream.generator.partitions": "2",
        "ackstream.retryInitialDelay": "200ms",
    }
    if "per_batch" in settings:
        options["maxOffsetsPerTrigger"] = str(settings["per_batch"])
    stream = spark.readStream.format("ackstream").options(**options).load()
    checkpoint = tmp_path / "checkpoint"
    running = topology.start(stream, str(checkpoint), trigger_ms=200)
    return running, checkpoint / "topology" / PAUSED_FILE


def paused(path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def wait_for_the_pause(running, path, timeout: float = 300) -> dict:
    """The pause file's content once the batch waits (a query that stopped raises)."""

    def said():
        error = running.exception()
        if error is not None:
            raise error
        return paused(path)

    return wait_for(said, timeout=timeout, interval=0.2, what="the pause")


def check_nothing_charged(figures: dict, records: int, broker, outbox: str) -> None:
    assert figures["acked"] == records, figures
    for outcome in ("failed", "timed_out", "dead_lettered", "replayed", "rejected"):
        assert figures.get(outcome, 0) == 0, figures
    keys = {m.key.decode() for m in consume(broker.bootstrap, outbox)}
    assert keys == {f"{i % 2}:{i // 2}" for i in range(records)}


@pytest.mark.parametrize("writer", WRITERS)
def test_a_stalled_sink_pauses_the_topology_and_charges_nothing(
    spark, broker, new_topic, tmp_path, capsys, writer
):
    if not hasattr(broker, "pause"):
        pytest.skip("stalls the broker: needs the test session's own (tests/broker.py)")
    records, outbox = 40, new_topic(partitions=2)
    broker.pause()
    try:
        running, pause_file = start(spark, broker, tmp_path, outbox, records, writer)
        try:
            said = wait_for_the_pause(running, pause_file)
            time.sleep(10)  # the stall itself, past the message timeout (5 s)
            assert paused(pause_file) is not None  # still waiting, nothing charged meanwhile
        finally:
            broker.resume()
        figures = wait_until_settled(running, records=records, timeout_s=180)
        assert running.is_active()
        assert paused(pause_file) is None  # the wait ended with the write
    finally:
        broker.resume()
        if "running" in locals():
            running.stop()
    assert said["sink"] == f"KafkaSink to {outbox} at {broker.bootstrap}"
    check_nothing_charged(figures, records, broker, outbox)
    err = capsys.readouterr().err
    began = [line for line in err.splitlines() if f"sink KafkaSink to {outbox}" in line]
    assert len(began) == 2, err[-3000:]
    assert "unreachable since " in began[0] and "retrying every 1 s doubling to 30 s" in began[0]
    assert "reachable again after" in began[1]


@pytest.mark.e2e  # half a minute: make test-e2e, not the 20-minute suite
def test_a_stop_while_paused_returns_and_the_restart_writes_the_batch(
    spark, broker, new_topic, tmp_path
):
    if not hasattr(broker, "pause"):
        pytest.skip("stalls the broker: needs the test session's own (tests/broker.py)")
    records, outbox, name = 20, new_topic(partitions=2), f"stop-{uuid.uuid4().hex[:8]}"
    broker.pause()
    try:
        running, pause_file = start(spark, broker, tmp_path, outbox, records, "python", name=name)
        try:
            wait_for_the_pause(running, pause_file)
        finally:
            running.stop()  # returns: the stop ends the wait
        assert not running.query.isActive
        assert "waited for sink" in str(running.exception())
        assert paused(pause_file) is None
    finally:
        broker.resume()
    assert consume(broker.bootstrap, outbox) == []  # the batch was not written...
    running, _ = start(spark, broker, tmp_path, outbox, records, "python", name=name)
    try:  # ... nor committed: the restart runs it again, charging nothing
        figures = wait_until_settled(running, records=records, timeout_s=180)
    finally:
        running.stop()
    check_nothing_charged(figures, records, broker, outbox)


def test_the_batch_deadline_does_not_run_down_while_held(spark):
    deadline = BatchDeadline(spark, f"held-{uuid.uuid4().hex[:8]}", 300)
    with deadline:
        with deadline.held():
            held_since = time.monotonic()
            wait_for(lambda: time.monotonic() - held_since > 1.0, what="a second held")
            assert not deadline.passed  # 0.3 s deadline, a second held
        wait_for(lambda: deadline.passed, timeout=30, what="the deadline once released")
        deadline.credit(60.0)  # a credit after the deadline passed does not undo it
        assert deadline.passed


def cpu_times(pids) -> dict[int, tuple[str, float]]:
    """The command name and CPU time (user and system) of the processes ``pids`` and
    their descendants (of this process: Spark's JVM, its Python workers, and the
    session's broker, stalled)."""
    ticks = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, tuple[str, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                name, rest = f.read().split(" (", 1)[1].rsplit(")", 1)
        except (OSError, ValueError):
            continue
        fields = rest.split()
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (name, (int(fields[11]) + int(fields[12])) / ticks)
    tree, grew = set(pids), True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return {pid: times[pid] for pid in tree if pid in times}


def cpu_used(before: dict, after: dict) -> dict[int, tuple[str, float]]:
    """Each process's CPU seconds between two ``cpu_times``: a process that started in
    between counts whole, one that ended in between is not counted (its last figure is
    gone), so the sum never goes below what the survivors used."""
    return {
        pid: (name, seconds - (before[pid][1] if pid in before else 0.0))
        for pid, (name, seconds) in after.items()
    }


@pytest.mark.long
def test_a_long_sink_outage_at_20000_a_batch(spark, broker, new_topic, tmp_path, capsys):
    """The broker stalled ``ACKSTREAM_OUTAGE_S`` (default 60) while batches of 20,000
    are written: the figures of the reliability page (run with ``-s``)."""
    if not hasattr(broker, "pause"):
        pytest.skip("stalls the broker: needs the test session's own (tests/broker.py)")
    outage_s = float(os.environ.get("ACKSTREAM_OUTAGE_S", "60"))
    per_batch, records, outbox = 20_000, 100_000, new_topic(partitions=2)
    running, pause_file = start(
        spark,
        broker,
        tmp_path,
        outbox,
        records,
        "auto",
        per_batch=per_batch,
        message_timeout_ms=30_000,
    )
    try:

        def acked() -> bool:
            error = running.exception()
            if error is not None:
                raise error
            return (source_metrics(running.query.lastProgress) or {}).get("acked", 0) > 0

        wait_for(acked, timeout=300, interval=0.2, what="a first batch acked")
        broker.pause()
        try:
            wait_for_the_pause(running, pause_file)
            began = time.monotonic()
            cpu_before = cpu_times([os.getpid()])
            time.sleep(outage_s)  # the outage itself
            used = cpu_used(cpu_before, cpu_times([os.getpid()]))
            cpu_paused = sum(seconds for _, seconds in used.values()) / (time.monotonic() - began)
            ours = {query.id for query in running.queries}
            others = [query.name for query in spark.streams.active if query.id not in ours]
        finally:
            broker.resume()
        back = time.monotonic()
        figures = wait_until_settled(running, records=records, timeout_s=900)
        caught_up_s = time.monotonic() - back
        assert running.is_active()
    finally:
        broker.resume()
        running.stop()
    load = os.getloadavg()
    with capsys.disabled():  # the figures, for the reliability page (pytest -s)
        print(
            f"\nsink outage of {outage_s:.0f} s at {per_batch} a batch: {figures['acked']} acked, "
            f"{figures.get('dead_lettered', 0)} dead-lettered, {figures.get('replayed', 0)} "
            f"replayed; {cpu_paused:.3f} cores while paused (driver, JVM and its workers); lag 0 "
            f"{caught_up_s:.0f} s after the broker's return; load average {load[0]:.1f}"
        )
    check_nothing_charged(figures, records, broker, outbox)
    busiest = sorted(used.items(), key=lambda item: -item[1][1])[:4]
    assert cpu_paused < 0.2, f"busiest (pid, name, s): {busiest}; other queries: {others}"
    assert caught_up_s < 2 * 30  # two message timeouts
    assert "reachable again after" in capsys.readouterr().err
