"""Issue 6, the fault suite: crash the driver, stall the broker, and prove nothing is lost.

Both tests run test_end_to_end's topology (tests/fault_driver.py, without the random
flaky bolt; the poison record is always failed, so exactly one dead letter exists)
and then check the end state with :func:`check_end_state`:

- the consumer group's committed offset is the end offset on every partition;
- every input offset is acked (any attempt) or dead-lettered (exactly the poison),
  never both;
- every word of every record reaches the output topic at least once;
- no commit ran ahead of a completion: every committed watermark (and every done range
  in the commit metadata) seen by a background poller at time t covers only offsets
  with an acked completion (or, for the poison, a dead letter) from before t.

Spurious replays (non-poison completions that timed out or failed) are printed, not
asserted on: crashes are allowed to cost replays, never records.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from ackstream.channels.kafka import KafkaChannel

from helpers import consume, sentences, wait_for

pytestmark = [pytest.mark.fault, pytest.mark.broker]

N = 200  # input records, on 2 partitions
POISON_AT = 17
DRIVER = Path(__file__).with_name("fault_driver.py")


def produce(bootstrap: str, topic: str) -> list[str]:
    from kafka import KafkaProducer

    lines = sentences(N)
    lines[POISON_AT] = "poison pill sentence"
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for i, line in enumerate(lines):
        producer.send(topic, value=line.encode(), partition=i % 2)
    producer.flush()
    producer.close()
    return lines


class CommitRecorder(threading.Thread):
    """Polls the group's committed offsets every ~100 ms: ``(t_ms, partition, offset, meta)``
    where ``t_ms`` is taken after the answer arrived (the commit happened before it)."""

    def __init__(self, bootstrap: str, group: str, topic: str):
        super().__init__(daemon=True)
        self.bootstrap, self.group, self.topic = bootstrap, group, topic
        self.seen: list[tuple[int, int, int, str]] = []
        self.errors = 0
        self._halt = threading.Event()

    def run(self) -> None:
        from kafka import KafkaConsumer, TopicPartition
        from kafka.errors import KafkaError

        consumer = None
        while not self._halt.is_set():
            try:
                if consumer is None:
                    consumer = KafkaConsumer(
                        bootstrap_servers=self.bootstrap,
                        group_id=self.group,
                        enable_auto_commit=False,
                    )
                for p in (0, 1):
                    got = consumer.committed(TopicPartition(self.topic, p), metadata=True)
                    t_ms = int(time.time() * 1000)
                    if got is not None and got.offset is not None and got.offset >= 0:
                        self.seen.append((t_ms, p, got.offset, got.metadata or ""))
            except (KafkaError, OSError):  # a stalled or restarting broker: keep polling
                self.errors += 1
                if consumer is not None:
                    with contextlib.suppress(KafkaError, OSError):
                        consumer.close(autocommit=False)
                    consumer = None
            self._halt.wait(0.1)
        if consumer is not None:
            consumer.close(autocommit=False)

    def latest(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for _, p, off, _ in self.seen:
            out[p] = off
        return out

    def stop(self) -> None:
        self._halt.set()
        self.join(15)


def all_committed(recorder: CommitRecorder) -> bool:
    return recorder.latest() == {0: N // 2, 1: N // 2}


def output_count(bootstrap: str, topic: str) -> int:
    """Messages in the output topic so far (an end offset: enough to see it grow)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        return sum(consumer.end_offsets([TopicPartition(topic, 0)]).values())
    finally:
        consumer.close()


def check_end_state(
    bootstrap: str, name: str, outbox: str, lines: list[str], recorder: CommitRecorder
) -> dict:
    """The assertions common to every fault test; returns figures for the report."""
    poison = (POISON_AT % 2, POISON_AT // 2)
    everything = {(i % 2, i // 2) for i in range(N)}

    assert all_committed(recorder), f"committed {recorder.latest()}, end {N // 2} per partition"

    done, _ = KafkaChannel(bootstrap, name).completions_since(None)
    rows = done.to_pylist()
    first_ack: dict[tuple[int, int], int] = {}
    for r in rows:
        if r["status"] == "acked":
            key = (r["partition"], r["offset"])
            first_ack[key] = min(first_ack.get(key, r["completed_ms"]), r["completed_ms"])

    letters = consume(bootstrap, f"{name}.dead")
    dead: dict[tuple[int, int], int] = {}
    for letter in letters:
        headers = {k: v.decode() for k, v in letter.headers}
        key = (int(headers["ackstream.partition"]), int(headers["ackstream.offset"]))
        dead[key] = min(dead.get(key, letter.timestamp), letter.timestamp)
    assert set(dead) == {poison}, f"dead letters for {sorted(dead)}, expected only {poison}"
    assert not set(first_ack) & set(dead), "an offset was both acked and dead-lettered"
    assert set(first_ack) | set(dead) == everything, (
        f"neither acked nor dead-lettered: {sorted(everything - set(first_ack) - set(dead))}"
    )

    written = {m.key.decode() for m in consume(bootstrap, outbox)}
    expected = {w for line in lines for w in line.split()} - {"poison"}
    assert expected <= written, f"words never written: {sorted(expected - written)}"

    # no commit before its tree completed (a dead letter counts for the poison)
    completed_at = {**first_ack, **dead}
    early = []
    for t_ms, p, watermark, meta in recorder.seen:
        covered = set(range(watermark))
        spans = json.loads(meta).get("done", []) if meta else []
        for a, b in spans:
            covered.update(range(a, b))
        for off in covered:
            when = completed_at.get((p, off))
            if when is None or when > t_ms:
                early.append((t_ms, p, off, when))
    assert not early, (
        f"offsets committed before their tree completed (t, p, off, done): {early[:10]}"
    )

    spurious = sorted(
        {
            (r["partition"], r["offset"], r["attempt"], r["status"])
            for r in rows
            if r["status"] != "acked" and (r["partition"], r["offset"]) != poison
        }
    )
    return {
        "records": N,
        "acked": len(first_ack),
        "dead_lettered": len(dead),
        "dead_letter_messages": len(letters),
        "lost": 0,
        "spurious_replays": len(spurious),
        "commit_observations": len(recorder.seen),
        "completions": len(rows),
    }


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the driver's whole process group (its Python and its Spark JVM)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)


def kill_after(process: subprocess.Popen, progressed, what: str, delay: float) -> None:
    """Once ``progressed()`` holds (polled), wait ``delay`` s, then SIGKILL ``process``."""
    wait_for(progressed, timeout=180, interval=0.2, what=what)
    time.sleep(delay)
    kill_group(process)


def test_driver_crashes_lose_nothing_and_commit_nothing_early(broker, new_topic, tmp_path):
    seed = int(os.environ.get("ACKSTREAM_FAULT_SEED", time.time_ns() % 1_000_000))
    print(f"\nfault seed: {seed} (rerun with ACKSTREAM_FAULT_SEED={seed})")
    rng = random.Random(seed)
    inbox, outbox = new_topic(partitions=2), new_topic(partitions=1)
    name = f"fault-{uuid.uuid4().hex[:8]}"
    lines = produce(broker.bootstrap, inbox)
    checkpoint = tmp_path / "checkpoint"
    recorder = CommitRecorder(broker.bootstrap, f"ackstream-{name}", inbox)
    recorder.start()
    kills, process = 0, None
    log = open(tmp_path / "driver.log", "ab")  # noqa: SIM115 (closed in the finally below)

    def spawn(kill_after_sink: int = 0) -> subprocess.Popen:
        env = {**os.environ, "ACKSTREAM_FAULT_KILL_AFTER_SINK": str(kill_after_sink)}
        return subprocess.Popen(
            [sys.executable, str(DRIVER), broker.bootstrap, inbox, outbox, name, str(checkpoint)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )

    def alive(proc):
        if proc.poll() is not None:
            pytest.fail(f"the driver exited with {proc.returncode}; log: {log.name}")
        return True

    try:
        # run 1 dies soon after its first output (mid-batch, usually before any commit);
        # run 2 soon after its first commit (with acks, commits and replays under way)
        for run, after in ((1, "output"), (2, "commit")):
            before = output_count(broker.bootstrap, outbox)
            committed = sum(recorder.latest().values())
            process = spawn()
            if after == "output":

                def progressed(proc=process, n=before):
                    return alive(proc) and output_count(broker.bootstrap, outbox) > n
            else:

                def progressed(proc=process, n=committed):
                    return alive(proc) and sum(recorder.latest().values()) > n

            delay = rng.uniform(1.0, 4.0)
            kill_after(process, progressed, f"the first {after} of driver run {run}", delay)
            kills += 1
            print(
                f"run {run}: SIGKILL {delay:.2f}s after its first {after}, "
                f"committed then {recorder.latest()}"
            )
        # run 3 kills itself between a batch's output write and its ack write
        nth = rng.randint(1, 3)
        process = spawn(kill_after_sink=nth)
        process.wait(240)
        assert process.returncode == -signal.SIGKILL, f"run 3 ended with {process.returncode}"
        kills += 1
        print(f"run 3: SIGKILL right after sink write {nth}, committed then {recorder.latest()}")
        process = spawn()
        wait_for(
            lambda: alive(process) and all_committed(recorder),
            timeout=240,
            interval=0.5,
            what="every input offset committed after the restarts",
        )
    finally:
        if process is not None and process.poll() is None:
            kill_group(process)
        recorder.stop()
        log.close()

    figures = check_end_state(broker.bootstrap, name, outbox, lines, recorder)
    print(f"driver crash figures: kills survived {kills}, {figures}")


def test_acker_crashes_keep_its_state_and_cost_no_replay(spark, broker, new_topic, tmp_path):
    """The acker in a process of its own (``ackstream acker``), SIGKILLed twice at random
    points and restarted from its checkpoint while the topology runs on. Its timeouts are
    longer than an outage, so any replay would mean it lost state or records. The
    topology acks per stage, so that every tree goes through the acker (telescoped, a
    batch settles its own trees and the acker would have nothing to lose)."""
    from fault_driver import build

    seed = int(os.environ.get("ACKSTREAM_FAULT_SEED", time.time_ns() % 1_000_000))
    print(f"\nfault seed: {seed} (rerun with ACKSTREAM_FAULT_SEED={seed})")
    rng = random.Random(seed)
    inbox, outbox = new_topic(partitions=2), new_topic(partitions=1)
    name = f"acker-{uuid.uuid4().hex[:8]}"
    lines = produce(broker.bootstrap, inbox)
    recorder = CommitRecorder(broker.bootstrap, f"ackstream-{name}", inbox)
    recorder.start()
    log = open(tmp_path / "acker.log", "ab")  # noqa: SIM115 (closed in the finally below)
    command = [
        sys.executable,
        "-m",
        "ackstream",
        "acker",
        "--topology",
        name,
        "--bootstrap",
        broker.bootstrap,
        "--checkpoint",
        str(tmp_path / "acker"),
        "--message-timeout",
        "60s",
        "--trigger-ms",
        "300",
        "--cores",
        "1",
    ]

    def spawn() -> subprocess.Popen:
        return subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def completions() -> int:
        return KafkaChannel(broker.bootstrap, name).completions_since(None)[0].num_rows

    stream, topology = build(
        spark,
        broker.bootstrap,
        inbox,
        outbox,
        name,
        message_timeout_ms=60_000,
        source_timeout="5 min",
        per_batch=20,
        ack_mode="per_stage",
    )
    acker, running = spawn(), None
    kills = 0
    try:
        # the topology starts once the acker runs, so that the kills land mid-stream
        wait_for(
            lambda: acker.poll() is None and b"running" in (tmp_path / "acker.log").read_bytes(),
            timeout=120,
            interval=0.3,
            what="the acker to start",
        )
        running = topology.start(stream, str(tmp_path / "checkpoint"), trigger_ms=300, acker=False)
        for run in (1, 2):
            before = completions()
            acker = acker if run == 1 else spawn()
            delay = rng.uniform(0.2, 2.0)
            kill_after(
                acker,
                lambda proc=acker, n=before: proc.poll() is None and completions() > n,
                f"completions of acker run {run}",
                delay,
            )
            kills += 1
            print(
                f"acker run {run}: SIGKILL {delay:.2f}s after its first completion, "
                f"committed then {recorder.latest()}"
            )
        acker = spawn()
        wait_for(
            lambda: all_committed(recorder) or running.exception() or acker.poll(),
            timeout=240,
            interval=0.5,
            what="every input offset committed",
        )
        assert running.exception() is None and acker.poll() is None
    finally:
        if running is not None:
            running.stop()
        if acker.poll() is None:
            kill_group(acker)
        recorder.stop()
        log.close()

    figures = check_end_state(broker.bootstrap, name, outbox, lines, recorder)
    print(f"acker crash figures: kills survived {kills}, {figures}")
    assert figures["spurious_replays"] == 0


def test_a_stalled_broker_loses_nothing(spark, broker, new_topic, tmp_path):
    from fault_driver import start

    pause_s = 8.0  # above the 1 s poll and 2 s version-probe timeouts of kafka-python calls
    inbox, outbox = new_topic(partitions=2), new_topic(partitions=1)
    name = f"pause-{uuid.uuid4().hex[:8]}"
    lines = produce(broker.bootstrap, inbox)
    recorder = CommitRecorder(broker.bootstrap, f"ackstream-{name}", inbox)
    recorder.start()
    running = start(spark, broker.bootstrap, inbox, outbox, name, str(tmp_path / "checkpoint"))
    try:
        wait_for(
            lambda: output_count(broker.bootstrap, outbox) > 0 or running.exception(),
            timeout=90,
            interval=0.2,
            what="the first output",
        )
        time.sleep(0.5)
        broker.pause()
        try:
            time.sleep(pause_s)
        finally:
            broker.resume()
        print(f"\nbroker paused {pause_s:.0f}s; committed after resume: {recorder.latest()}")
        wait_for(
            lambda: all_committed(recorder) or running.exception(),
            timeout=120,
            interval=0.5,
            what="every input offset committed after the pause",
        )
        assert running.exception() is None, f"a query died: {running.exception()}"
        assert running.is_active(), "a query stopped: " + ", ".join(
            f"{q.name} active={q.isActive}" for q in running.queries
        )
    finally:
        running.stop()
        recorder.stop()

    figures = check_end_state(broker.bootstrap, name, outbox, lines, recorder)
    print(f"broker pause figures: {figures}")
