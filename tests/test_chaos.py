"""The chaos suite: crash and stall every process of a running topology, and
prove that nothing is lost and nothing is committed early.

One chaos run, for one seed, on a broker of its own (:func:`chaos_broker`, so that
killing it spares the session's): the topology of ``tests/fault_driver.py`` (per-stage
acks, so that every tree goes through the acker; a flaky bolt failing a fraction of
first attempts; a poison record, always failed, so exactly one dead letter exists) in
a driver process whose executors run on a standalone cluster of two one-core Workers
(:func:`chaos_cluster`), and its acker as ``ackstream acker`` in another. The seed decides
where the poison is, the order of the faults and the delays before them:

- the driver kills itself right after its N-th sink write (N in 1-3), before that
  batch's acks: always the first fault, so that it lands mid-stream;
- the driver's process group SIGKILLed a random moment after the commits moved;
- the acker SIGKILLed the same way, and restarted from its checkpoint;
- the broker SIGSTOPped for longer than the message timeout, then resumed;
- the broker SIGKILLed and restarted from its log;
- a Spark Worker SIGKILLed with its executor and their Python workers, as if its host
  died; it comes back once the commits have moved on the other Worker alone.

After the run, :func:`outcome` measures, and the test then asserts: every offset is
acked or dead-lettered (only the poison), never both (``lost``); no group commit,
polled every ~100 ms, covered an offset before its completion (``committed_early``);
every (word, record) pair reached the output. Duplicates in the output and spurious
replays (completions that timed out or came back unknown: the crashes' cost) are
counted and reported, not asserted on.

Sizes: ``make test-cluster`` (and so CI) runs one small seed (:func:`test_chaos_small`);
``make chaos`` runs the issue's size, 20,000 records on 4 partitions, for the seeds in
``ACKSTREAM_CHAOS_SEEDS`` ("1-20" by default; also "3,5,8"), ``ACKSTREAM_CHAOS_RECORDS``
and ``ACKSTREAM_CHAOS_PARTITIONS`` override the size; ``ACKSTREAM_CHAOS_REPORT``
names a JSON-lines file each run's figures are appended to.
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
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import consume, first_outcomes, sentences, wait_for
from spark_cluster import StandaloneCluster, spark_env

pytestmark = [pytest.mark.chaos]

DRIVER = Path(__file__).with_name("fault_driver.py")
MESSAGE_TIMEOUT_MS = 5_000
#: longer than the message timeout and kafka-python's request timeouts of the clients
STALL_S = 8.0
FAULTS = ("driver_kill", "acker_kill", "broker_stall", "broker_restart", "worker_kill")


@dataclass(frozen=True)
class Size:
    records: int
    partitions: int
    per_batch: int  # maxOffsetsPerTrigger: spreads the input over many batches
    fail_rate: float
    deadline_s: float  # for every offset to be committed after the last fault


SMALL = Size(records=200, partitions=2, per_batch=25, fail_rate=0.05, deadline_s=600)


def full_size() -> Size:
    return Size(
        records=int(os.environ.get("ACKSTREAM_CHAOS_RECORDS", "20000")),
        partitions=int(os.environ.get("ACKSTREAM_CHAOS_PARTITIONS", "4")),
        per_batch=1_000,
        fail_rate=0.01,
        deadline_s=1_800,
    )


def chaos_seeds() -> list[int]:
    text = os.environ.get("ACKSTREAM_CHAOS_SEEDS", "1-20")
    if "-" in text:
        first, last = (int(part) for part in text.split("-"))
        return list(range(first, last + 1))
    return [int(part) for part in text.split(",") if part.strip()]


@pytest.fixture(scope="module")
def chaos_broker():
    """A broker of the module's own, killed and stalled by the runs."""
    if os.environ.get("ACKSTREAM_TEST_BOOTSTRAP"):
        pytest.skip("the chaos suite kills its broker: not on an external cluster")
    from broker import KafkaBroker

    running = KafkaBroker().start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def chaos_cluster():
    """A standalone cluster the drivers' executors run on; its Workers are killed."""
    running = StandaloneCluster(workers=2, cores=1).start()
    yield running
    running.stop()


def produce(bootstrap: str, topic: str, size: Size, poison_at: int) -> list[str]:
    from kafka import KafkaProducer

    lines = sentences(size.records)
    lines[poison_at] = "poison pill sentence"
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    for i, line in enumerate(lines):
        producer.send(topic, value=line.encode(), partition=i % size.partitions)
    producer.flush()
    producer.close()
    return lines


def coordinates(i: int, partitions: int) -> tuple[int, int]:
    """Where the i-th produced line landed: (partition, offset)."""
    return i % partitions, i // partitions


class CommitRecorder(threading.Thread):
    """Polls the group's committed offsets every ~100 ms: ``(t_ms, partition, offset, meta)``
    where ``t_ms`` is taken after the answer arrived (the commit happened before it)."""

    def __init__(self, bootstrap: str, group: str, topic: str, partitions: int):
        super().__init__(daemon=True)
        self.bootstrap, self.group, self.topic = bootstrap, group, topic
        self.partitions = range(partitions)
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
                for p in self.partitions:
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
        for _, p, off, _ in list(self.seen):
            out[p] = off
        return out

    def stop(self) -> None:
        self._halt.set()
        self.join(15)


def outcome(bootstrap: str, name: str, outbox: str, lines, size: Size, poison, recorder) -> dict:
    """The run's figures: lost, committed early, duplicates, spurious replays, ..."""
    everything = {coordinates(i, size.partitions) for i in range(size.records)}
    rows, first_ack, letters, dead = first_outcomes(bootstrap, name)
    written = [(m.key.decode(), m.value.decode()) for m in consume(bootstrap, outbox)]
    expected = {
        (word, "{}:{}".format(*coordinates(i, size.partitions)))
        for i, line in enumerate(lines)
        if coordinates(i, size.partitions) != poison
        for word in line.split()
    }
    return {
        "records": size.records,
        "partitions": size.partitions,
        "lost": len(everything - set(first_ack) - set(dead)),
        "committed_early": early_commits(recorder.seen, {**first_ack, **dead}),
        "acked_and_dead": len(set(first_ack) & set(dead)),
        # what happened to the first few of those, to tell a late ack from a wrong one
        "acked_and_dead_history": {
            f"{p}:{o}": [
                (r["attempt"], r["status"], r["completed_ms"], r["reason"])
                for r in rows
                if (r["partition"], r["offset"]) == (p, o)
            ]
            + [("dead letter", dead[(p, o)])]
            for p, o in sorted(set(first_ack) & set(dead))[:3]
        },
        "dead_lettered": sorted(dead),
        "outputs_missing": len(expected - set(written)),
        "duplicates": len(written) - len(set(written)),
        "spurious_replays": sum(
            1
            for r in rows
            if r["status"] in ("timed_out", "unknown") and (r["partition"], r["offset"]) != poison
        ),
        "flaky_failures": sum(1 for r in rows if r["reason"] == "flaky"),
        "commit_observations": len(recorder.seen),
        "committed": recorder.latest(),
    }


def early_commits(seen, completed_at: dict[tuple[int, int], int]) -> int:
    """Commit observations covering an offset whose completion (an ack, or a dead letter)
    came after the observation, or never: the watermark covers every offset below it,
    the commit metadata's done ranges the offsets in them."""
    never = float("inf")
    latest_below: dict[int, list[float]] = {}  # partition -> max completion time below n
    for p in {p for _, p, _, _ in seen}:
        times = [
            completed_at.get((p, off), never)
            for off in range(max(o for _, q, o, _ in seen if q == p))
        ]
        running, prefix = 0.0, [0.0]
        for t in times:
            running = max(running, t)
            prefix.append(running)
        latest_below[p] = prefix
    early = 0
    for t_ms, p, watermark, meta in seen:
        spans = json.loads(meta).get("done", []) if meta else []
        late = latest_below[p][watermark] > t_ms or any(
            completed_at.get((p, off), never) > t_ms for a, b in spans for off in range(a, b)
        )
        early += late
    return early


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL a process's whole group (a driver's Python and its Spark JVM)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)


class Chaos:
    """One run's processes, faults and waits (see the module doc)."""

    def __init__(self, broker, cluster, size: Size, seed: int, workdir: Path):
        from broker import create_topic

        self.broker, self.cluster, self.size, self.workdir = broker, cluster, size, workdir
        self.rng = random.Random(seed)
        self.bootstrap = broker.bootstrap
        self.inbox = create_topic(self.bootstrap, size.partitions)
        self.outbox = create_topic(self.bootstrap, 1)
        self.name = f"chaos-{uuid.uuid4().hex[:8]}"
        self.poison = coordinates(self.rng.randrange(size.records), size.partitions)
        self.lines = produce(
            self.bootstrap, self.inbox, size, self.poison[1] * size.partitions + self.poison[0]
        )
        self.recorder = CommitRecorder(
            self.bootstrap, f"ackstream-{self.name}", self.inbox, size.partitions
        )
        self.log = open(workdir / "chaos.log", "ab")  # noqa: SIM115 (closed in close())
        self.driver: subprocess.Popen | None = None
        self.acker: subprocess.Popen | None = None
        self.events: list[str] = []

    def spawn_driver(self, kill_after_sink: int = 0) -> None:
        settings = {
            "per_batch": self.size.per_batch,
            "fail_rate": self.size.fail_rate,
            "ack_mode": "per_stage",
            "message_timeout_ms": MESSAGE_TIMEOUT_MS,
            "acker": False,
            "kill_after_sink": kill_after_sink,
        }
        command = [sys.executable, str(DRIVER), self.bootstrap, self.inbox, self.outbox]
        self.driver = subprocess.Popen(
            [*command, self.name, str(self.workdir / "checkpoint")],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={
                **spark_env(),
                "ACKSTREAM_FAULT_SETTINGS": json.dumps(settings),
                "ACKSTREAM_FAULT_MASTER": self.cluster.url,
            },
        )

    def spawn_acker(self) -> None:
        command = [sys.executable, "-m", "ackstream", "acker", "--topology", self.name]
        self.acker = subprocess.Popen(
            [
                *command,
                "--bootstrap",
                self.bootstrap,
                "--checkpoint",
                str(self.workdir / "acker"),
                "--message-timeout",
                f"{MESSAGE_TIMEOUT_MS}ms",
                "--trigger-ms",
                "300",
                "--cores",
                "1",
                "--verbose",  # Spark's log into the chaos log, not a file of its own
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def check_alive(self) -> bool:
        for what, process in (("driver", self.driver), ("acker", self.acker)):
            if process is not None and process.poll() is not None:
                pytest.fail(
                    f"the {what} exited by itself with {process.returncode} after "
                    f"{self.events}; log: {self.log.name}"
                )
        return True

    def committed(self) -> int:
        return sum(self.recorder.latest().values())

    def all_committed(self) -> bool:
        ends = {
            p: len(range(p, self.size.records, self.size.partitions))
            for p in range(self.size.partitions)
        }
        return self.recorder.latest() == ends

    def after_progress(self, what: str) -> None:
        """Wait until the commits moved (or all are done), then a random 0.2-3 s."""
        before = self.committed()
        wait_for(
            lambda: self.check_alive() and (self.committed() > before or self.all_committed()),
            timeout=600,
            interval=0.2,
            what=f"progress before the {what}",
        )
        time.sleep(self.rng.uniform(0.2, 3.0))

    def inflict(self, fault: str) -> None:
        self.after_progress(fault)
        if fault == "driver_kill":
            kill_group(self.driver)
            self.spawn_driver()
        elif fault == "acker_kill":
            kill_group(self.acker)
            self.spawn_acker()
        elif fault == "broker_stall":
            self.broker.pause()
            try:
                time.sleep(STALL_S)
            finally:
                self.broker.resume()
        elif fault == "broker_restart":
            self.broker.restart()
        elif fault == "worker_kill":
            worker = self.rng.randrange(len(self.cluster.workers))
            self.cluster.kill_worker(worker)
            self.events.append(f"worker {worker} killed at {self.recorder.latest()}")
            self.after_progress("worker's return")
            self.cluster.restart_worker(worker)
        self.events.append(f"{fault} at {self.recorder.latest()}")

    def run(self) -> dict:
        self.recorder.start()
        try:
            self.spawn_acker()
            nth = self.rng.randint(1, 3)
            self.spawn_driver(kill_after_sink=nth)
            self.driver.wait(900)
            assert self.driver.returncode == -signal.SIGKILL, (
                f"the driver ended with {self.driver.returncode}, not by its own SIGKILL "
                f"after sink write {nth}; log: {self.log.name}"
            )
            self.events.append(f"driver killed itself after sink write {nth}")
            self.spawn_driver()
            for fault in self.rng.sample(FAULTS, len(FAULTS)):
                self.inflict(fault)
            wait_for(
                lambda: self.check_alive() and self.all_committed(),
                timeout=self.size.deadline_s,
                interval=0.5,
                what=f"every input offset committed after {self.events}",
            )
        finally:
            self.close()
        return outcome(
            self.bootstrap,
            self.name,
            self.outbox,
            self.lines,
            self.size,
            self.poison,
            self.recorder,
        )

    def close(self) -> None:
        for process in (self.driver, self.acker):
            if process is not None and process.poll() is None:
                kill_group(process)
        self.recorder.stop()
        self.log.close()


def chaos_run(broker, cluster, size: Size, seed: int, workdir: Path) -> None:
    started = time.monotonic()
    chaos = Chaos(broker, cluster, size, seed, workdir)
    figures = chaos.run()
    figures = {"seed": seed, "seconds": round(time.monotonic() - started), **figures}
    figures["events"] = chaos.events
    print(f"\nchaos: {json.dumps(figures)}")
    report = os.environ.get("ACKSTREAM_CHAOS_REPORT")
    if report:
        with open(report, "a") as out:
            out.write(json.dumps(figures) + "\n")
    assert figures["lost"] == 0, figures
    assert figures["committed_early"] == 0, figures
    assert figures["acked_and_dead"] == 0, figures
    assert figures["dead_lettered"] == [chaos.poison], figures
    assert figures["outputs_missing"] == 0, figures


@pytest.mark.long
@pytest.mark.timeout(1200)
def test_chaos_small(chaos_broker, chaos_cluster, tmp_path):
    """One seed at a small size, in ``make test-cluster`` (which CI runs; about five
    minutes, too long for the 20-minute suite): random unless ``ACKSTREAM_CHAOS_SEED``
    is set, printed for a rerun."""
    seed = int(os.environ.get("ACKSTREAM_CHAOS_SEED", time.time_ns() % 1_000_000))
    print(f"\nchaos seed: {seed} (rerun with ACKSTREAM_CHAOS_SEED={seed})")
    chaos_run(chaos_broker, chaos_cluster, SMALL, seed, tmp_path)


@pytest.mark.long
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("seed", chaos_seeds())
def test_chaos_full(chaos_broker, chaos_cluster, seed, tmp_path):
    chaos_run(chaos_broker, chaos_cluster, full_size(), seed, tmp_path)
