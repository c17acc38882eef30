"""End-to-end benchmark (issue 15): the README's pipeline over Apache Kafka, every system
side by side in one run, on the same input and the same machine.

The input topic gets ``--records`` sentences of about 8 words (deterministic) over
``--partitions`` partitions, produced once before anything is timed. Each system then
reads that topic with a consumer group of its own, splits the sentences into words,
counts words per batch (at most ``--max-per-batch`` records a batch), writes the counts
(key = word, value = count as a string) to an output topic of its own, and commits its
input offsets to its group only after that write. Systems:

- ``ackstream_kafka``: ackstream tracked, Kafka channel, ``KafkaSink``;
- ``ackstream_local``: ackstream tracked, local channel, ``KafkaSink``;
- ``ackstream_untracked``: the same topology with ``tracking=False``;
- ``kafka_python_loop``: poll, split, count, produce, flush, commit, by hand;
- ``quix``: Quix Streams (the ``bench`` extra), at-least-once. Quix has no per-batch
  aggregate without state and a repartition, so it counts the words of each record and
  writes one message per distinct word of a sentence (more output than the others;
  ``output_messages`` says how much); it commits at most every ``--max-per-batch``
  records, after flushing what it produced;
- ``spark_kafka``: Spark's own Kafka source (``format("kafka")``) with ``foreachBatch``
  doing the same work untracked, committing the batch's offsets to its group by hand
  (``make spark-kafka`` brings the connector);
- ``share_group``: a Kafka share group (KIP-932, the broker's own per-record ack) read
  by confluent-kafka's ``ShareConsumer`` (the ``bench`` extra): poll, split, count,
  produce, flush, then acknowledge every record (ACCEPT) and ``commit_sync``. A share
  group has no committed offset to poll, so its end is the worker's own report that
  the broker took the acknowledgements of every input offset.

Each system runs in a process of its own (a child of this one), one after another, in
an order that alternates across ``--repeats``. Measured from outside the process:

- *records/s*: input records over the time from the system's first record read (the
  start of the first Spark batch with input, from the query's progress; the return of
  the first poll with records; Quix's first record in the pipeline) to the moment a
  poller thread here sees the group's committed offsets cover every input offset (it
  asks the broker every 100 ms with kafka-python). ``records_per_s_from_ready`` counts
  from the process's start of work instead (just before the query starts or the first
  poll), so it includes the queries' start-up; ``startup_s`` is the time from the
  process's start to then.
- *CPU seconds*: user + system time of the whole process tree (Python, Spark's JVM,
  Spark's Python workers; ``/proc/<pid>/stat`` of every process in the worker's session,
  with the children it has already reaped), sampled when the poller sees the last
  commit, minus the same at the start of work (``cpu_s_startup``). The broker's CPU is
  no system's.
- For ``ackstream_kafka``, a second run fed at half its measured rate by a producer
  thread here: complete latency p50/p99 (the completions on the Kafka channel) and
  *offset committed* latency p50/p99 (from each record's send to the poller seeing
  an offset committed past it).

Prints one JSON line and writes it to ``benchmarks/results/e2e-<date>.json``.

    .venv/bin/python benchmarks/e2e.py [--records N] [--partitions P] [--repeats R]
"""

from __future__ import annotations

import argparse
import bisect
import collections
import contextlib
import datetime as dt
import glob
import importlib.metadata
import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
sys.path.insert(0, ROOT)

SYSTEMS = (
    "ackstream_kafka",
    "ackstream_local",
    "ackstream_untracked",
    "kafka_python_loop",
    "quix",
    "spark_kafka",
    "share_group",
)
ACKSTREAM_SYSTEMS = SYSTEMS[:3]
MESSAGE_TIMEOUT_MS = 120_000  # nothing may time out in a run: a replay would be a bug here
SPARK_KAFKA_PREFIX = os.path.join(ROOT, ".cache", "spark-kafka-")
#: The interpreter of the share-group worker: confluent-kafka >= 2.16 has ShareConsumer,
#: and quixstreams pins confluent-kafka < 2.13, so the two need environments of their own
#: (``make bench-e2e`` makes .cache/share-venv and sets ACKSTREAM_SHARE_PYTHON).
SHARE_PYTHON = os.environ.get("ACKSTREAM_SHARE_PYTHON", sys.executable)
MARK = "e2e"  # the key of the worker's event lines on its stdout (Spark's JVM shares it)


def log(message: str) -> None:
    print(f"e2e: {message}", file=sys.stderr, flush=True)


# --- input --------------------------------------------------------------------------


def vocabulary(size: int = 2_000, seed: int = 15) -> list[str]:
    """Deterministic made-up words of 1 to 4 syllables (no spaces, never empty)."""
    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghklmnprstvz" for v in "aeiou"]
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))))
    return sorted(words)


def sentences(count: int, seed: int = 15) -> list[bytes]:
    """``count`` sentences of 6 to 10 words (8 on average), Zipf-like word frequencies."""
    rng = np.random.default_rng(seed)
    words = np.array(vocabulary(), dtype=object)
    ranks = np.arange(1, len(words) + 1)
    weights = 1.0 / ranks
    lengths = rng.integers(6, 11, size=count)
    picks = rng.choice(len(words), size=int(lengths.sum()), p=weights / weights.sum())
    out, at = [], 0
    for n in lengths:
        out.append(" ".join(words[picks[at : at + n]]).encode())
        at += n
    return out


def produce(bootstrap: str, topic: str, lines: list[bytes], partitions: int) -> dict[int, int]:
    """Send every line (record i to partition i % partitions); returns the end offsets."""
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=20, batch_size=256 << 10
    )
    try:
        futures = [
            producer.send(topic, value=line, partition=i % partitions)
            for i, line in enumerate(lines)
        ]
        producer.flush()
        ends: dict[int, int] = {}
        for future in futures:
            meta = future.get(timeout=60)
            ends[meta.partition] = max(ends.get(meta.partition, 0), meta.offset + 1)
        return ends
    finally:
        producer.close()


def create_topic(bootstrap: str, partitions: int, name: str) -> str:
    from broker import create_topic as create

    return create(bootstrap, partitions, name=name)


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return {tp.partition: end for tp, end in consumer.end_offsets(parts).items()}
    finally:
        consumer.close()


# --- measuring from outside -----------------------------------------------------------


class CommitPoller(threading.Thread):
    """Asks the broker for ``group``'s committed offsets on ``topic`` every ``interval_s``;
    keeps when each committed offset was first seen, and sets ``done`` (at ``done_at``)
    once they cover ``target`` ({partition: end offset})."""

    def __init__(self, bootstrap: str, group: str, topic: str, interval_s: float = 0.1):
        super().__init__(daemon=True, name=f"poller-{group}")
        self.bootstrap, self.group, self.topic, self.interval_s = (
            bootstrap,
            group,
            topic,
            interval_s,
        )
        self.history: dict[int, list[tuple[float, int]]] = collections.defaultdict(list)
        self.committed: dict[int, int] = {}
        self.target: dict[int, int] | None = None
        self.done, self.stopped = threading.Event(), threading.Event()
        self.done_at: float | None = None
        self.error: str | None = None
        self.crashed = False

    def run(self) -> None:
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="e2e-poller")
        try:
            self.poll(admin)
        except BaseException as error:  # the run fails loud with it (see check)
            self.error = repr(error)
            self.crashed = True
            raise
        finally:
            admin.close()

    def check(self) -> None:
        if self.crashed:
            raise RuntimeError(f"the commit poller of {self.group} failed: {self.error}")

    def poll(self, admin) -> None:
        from kafka.errors import KafkaError

        while not self.stopped.is_set():
            asked = time.monotonic()
            try:
                offsets = admin.list_group_offsets({self.group: None}).get(self.group, {})
            except KafkaError as error:  # e.g. the group's coordinator is not ready yet
                self.error = repr(error)
                offsets = {}
            now = time.time()
            for tp, meta in offsets.items():
                if meta is None or tp.topic != self.topic:
                    continue
                if meta.offset > self.committed.get(tp.partition, 0):
                    self.committed[tp.partition] = meta.offset
                    self.history[tp.partition].append((now, meta.offset))
            target = self.target
            if target is not None and all(
                self.committed.get(p, 0) >= end for p, end in target.items()
            ):
                self.target = None  # covered; a next target (if any) is set anew
                self.done_at = now
                self.done.set()
            self.stopped.wait(max(0.0, self.interval_s - (time.monotonic() - asked)))

    def committed_total(self) -> int:
        return sum(self.committed.values())

    def seen_at(self, partition: int, offset: int) -> float | None:
        """When a committed offset past ``offset`` of ``partition`` was first seen."""
        history = self.history.get(partition, [])
        at = bisect.bisect_right([o for _, o in history], offset)
        return history[at][0] if at < len(history) else None


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def session_cpu_s(session: int) -> float:
    """User + system CPU seconds of every process in session ``session`` (the worker
    and everything it started), with the children each has already waited for."""
    total = 0
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[3]) == session:  # fields[3]: the session id
            total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return total / _CLK_TCK


def session_pids(session: int) -> list[int]:
    pids = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session:
            pids.append(int(stat.split("/")[2]))
    return pids


class Worker:
    """One system's process: started in a session of its own, reporting events as JSON
    lines on stdout, stopped by closing its stdin; its stderr goes to ``log_path``."""

    def __init__(self, system: str, args: list[str], log_path: str, python: str = sys.executable):
        self.system, self.log_path = system, log_path
        self.events: dict[str, dict] = {}
        self.changed = threading.Condition()
        self.spawned = time.time()
        with open(log_path, "wb") as log_file:
            self.process = subprocess.Popen(
                [python, os.path.abspath(__file__), "worker", system, *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log_file,
                start_new_session=True,
                cwd=ROOT,
            )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for raw in self.process.stdout:
            try:
                event = json.loads(raw)
            except ValueError:
                continue  # the JVM's own stdout
            if isinstance(event, dict) and MARK in event:
                with self.changed:
                    self.events[event[MARK]] = event
                    self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def wait_event(self, name: str, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while name not in self.events:
                if self.process.poll() is not None and not self.reader.is_alive():
                    self.fail(f"exited with {self.process.returncode} before '{name}'")
                left = deadline - time.monotonic()
                if left <= 0:
                    self.fail(f"no '{name}' within {timeout_s:.0f} s")
                self.changed.wait(min(left, 0.5))
        return self.events[name]

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            self.fail(f"exited with {self.process.returncode} while running")

    def cpu_s(self) -> float:
        return session_cpu_s(self.process.pid)

    def stop(self, timeout_s: float = 90.0) -> dict:
        """Close stdin (the worker stops its queries and reports), wait for its exit."""
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            self.fail(f"did not stop within {timeout_s:.0f} s")
        self.reader.join(10)
        self.kill()  # anything of its session still running (a JVM it left behind)
        if self.process.returncode:
            self.fail(f"exited with {self.process.returncode} while stopping")
        return self.events.get("finished", {})

    def kill(self) -> None:
        """SIGTERM, then SIGKILL, to every process of the worker's session, by pid."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = session_pids(self.process.pid)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 10
            while session_pids(self.process.pid) and time.monotonic() < deadline:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(0.1)
                time.sleep(0.1)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)

    def fail(self, why: str):
        self.kill()
        try:
            with open(self.log_path, errors="replace") as f:
                tail = f.readlines()[-80:]
        except OSError:
            tail = []
        raise RuntimeError(
            f"system {self.system} {why}; its log ({self.log_path}) ends with:\n" + "".join(tail)
        )


# --- one run of one system --------------------------------------------------------------


def run_system(system: str, ctx: dict, tag: str, timeout_s: float) -> dict:
    """Start ``system`` on the input topic, wait until its group committed every input
    offset, stop it; returns its figures."""
    bootstrap, records = ctx["bootstrap"], ctx["records"]
    group = f"e2e-{ctx['run']}-{system}-{tag}"
    name = f"e2e-{ctx['run']}-{system.replace('_', '-')}-{tag}"
    output = create_topic(bootstrap, ctx["partitions"], f"{name}-out")
    workdir = os.path.join(ctx["workdir"], name)
    os.makedirs(workdir)
    poller = CommitPoller(bootstrap, group, ctx["input"])
    poller.target = ctx["ends"]
    worker = start_worker(system, ctx, ctx["input"], output, group, name, workdir)
    try:
        ready = worker.wait_event("ready", ctx["startup_timeout_s"])
        cpu_ready = worker.cpu_s()
        log(f"{system}: ready after {ready['t'] - worker.spawned:.1f} s, working")
        if system == "share_group":  # no committed offsets: the worker says when it is done
            poller.done_at = worker.wait_event("acknowledged", timeout_s)["t"]
            poller.committed = dict(ctx["ends"])
            poller.done.set()
        else:
            poller.start()
        deadline = time.monotonic() + timeout_s
        last_report = time.monotonic()
        while not poller.done.wait(0.05):
            worker.check_alive()
            poller.check()
            if time.monotonic() > deadline:
                worker.fail(
                    f"committed {poller.committed_total()} of {records} offsets "
                    f"in {timeout_s:.0f} s (poller: {poller.error})"
                )
            if time.monotonic() - last_report > 5:
                last_report = time.monotonic()
                log(f"{system}: {poller.committed_total()} of {records} offsets committed")
        cpu_done = worker.cpu_s()
        finished = worker.stop()
    finally:
        poller.stopped.set()
        worker.kill()
    first = finished.get("first_read")
    if first is None:
        raise RuntimeError(f"system {system} reported no first read: {finished}")
    done_at = poller.done_at
    result = {
        "records": records,
        "records_per_s": records / (done_at - first),
        "records_per_s_from_ready": records / (done_at - ready["t"]),
        "seconds": done_at - first,
        "startup_s": ready["t"] - worker.spawned,
        "ready_to_first_read_s": first - ready["t"],
        "cpu_s": cpu_done - cpu_ready,
        "cpu_s_startup": cpu_ready,
        "committed_all": all(poller.committed.get(p, 0) >= e for p, e in ctx["ends"].items()),
        "committed": poller.committed_total(),
        "output_messages": sum(end_offsets(bootstrap, output).values()),
        **{k: v for k, v in finished.items() if k not in (MARK, "t", "first_read")},
    }
    if finished.get("first_batch_s") and finished["first_batch_rows"] < records:
        # Spark: the rate after its first batch (cold: JIT, Python workers, clients)
        after = first + finished["first_batch_s"]
        result["records_per_s_after_first_batch"] = (records - finished["first_batch_rows"]) / (
            done_at - after
        )
    log(
        f"{system}: {result['records_per_s']:,.0f} records/s "
        f"({result['records_per_s_from_ready']:,.0f} from ready), "
        f"{result['cpu_s']:.1f} CPU s, start-up {result['startup_s']:.1f} s"
    )
    return result


def start_worker(system, ctx, topic, output, group, name, workdir) -> Worker:
    args = [
        "--bootstrap",
        ctx["bootstrap"],
        "--input",
        topic,
        "--output",
        output,
        "--group",
        group,
        "--name",
        name,
        "--workdir",
        workdir,
        "--max-per-batch",
        str(ctx["max_per_batch"]),
        "--trigger-ms",
        str(ctx["trigger_ms"]),
        "--partitions",
        str(ctx["partitions"]),
    ]
    python = SHARE_PYTHON if system == "share_group" else sys.executable
    return Worker(system, args, os.path.join(ctx["workdir"], f"{name}.log"), python)


def wait_committed(worker: Worker, poller: CommitPoller, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not poller.done.wait(0.1):
        worker.check_alive()
        poller.check()
        if time.monotonic() > deadline:
            worker.fail(f"committed {poller.committed_total()} offsets of {poller.target}")


def latency_run(ctx: dict, rate: float, seconds: float, timeout_s: float) -> dict:
    """ackstream tracked on the Kafka channel, fed at ``rate`` records/s for ``seconds``
    by a producer thread: complete and offset-committed latency percentiles."""
    from kafka import KafkaProducer

    from ackstream import KafkaChannel
    from ackstream.records import ACKED

    bootstrap, partitions = ctx["bootstrap"], ctx["partitions"]
    system, tag = "ackstream_kafka", "latency"
    group = f"e2e-{ctx['run']}-{system}-{tag}"
    name = f"e2e-{ctx['run']}-ackstream-kafka-{tag}"
    topic = create_topic(bootstrap, partitions, f"{name}-in")
    output = create_topic(bootstrap, partitions, f"{name}-out")
    workdir = os.path.join(ctx["workdir"], name)
    os.makedirs(workdir)
    count = max(partitions * 10, int(rate * seconds))
    lines = sentences(count, seed=16)
    warm = max(partitions * 10, int(rate))  # a second's worth, committed before timing
    poller = CommitPoller(bootstrap, group, topic)
    worker = start_worker(system, ctx, topic, output, group, name, workdir)
    sent: list = []
    try:
        worker.wait_event("running", ctx["startup_timeout_s"])
        poller.start()
        # the first batch with input is cold (JIT, Python workers): not what is measured
        log(f"latency: warming up with {warm} records")
        poller.target = warm_ends = produce(bootstrap, topic, sentences(warm, seed=17), partitions)
        wait_committed(worker, poller, timeout_s)
        poller.done.clear()
        log(f"latency: producing {count} records at {rate:,.0f}/s")
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=1)
        begin = time.monotonic()
        for i, line in enumerate(lines):
            wait = begin + i / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            sent.append((time.time(), producer.send(topic, value=line, partition=i % partitions)))
            if i % 5000 == 0:
                worker.check_alive()
        producer.flush()
        placed = [(t, f.get(timeout=60)) for t, f in sent]
        producer.close()
        ends: dict[int, int] = {}
        for _, meta in placed:
            ends[meta.partition] = max(ends.get(meta.partition, 0), meta.offset + 1)
        poller.target = ends
        wait_committed(worker, poller, timeout_s)
        worker.stop()
    finally:
        poller.stopped.set()
        worker.kill()
    committed_ms = np.array(
        [1000 * (poller.seen_at(m.partition, m.offset) - t) for t, m in placed], float
    )
    done = KafkaChannel(bootstrap, name).completions_since(None)[0].to_pylist()
    complete_ms = np.array(
        [
            c["latency_ms"]
            for c in done
            if c["status"] == ACKED and c["offset"] >= warm_ends.get(c["partition"], 0)
        ],
        float,
    )
    result = {
        "system": system,
        "rate_records_per_s": rate,
        "records": count,
        "warmup_records": warm,
        "acked": len(complete_ms),
        "complete_p50_ms": float(np.percentile(complete_ms, 50)) if len(complete_ms) else None,
        "complete_p99_ms": float(np.percentile(complete_ms, 99)) if len(complete_ms) else None,
        "committed_p50_ms": float(np.percentile(committed_ms, 50)),
        "committed_p99_ms": float(np.percentile(committed_ms, 99)),
    }
    log(
        f"latency at {rate:,.0f}/s: complete p50/p99 {result['complete_p50_ms']}/"
        f"{result['complete_p99_ms']} ms, committed p50/p99 {result['committed_p50_ms']:.0f}/"
        f"{result['committed_p99_ms']:.0f} ms"
    )
    return result


# --- the run ------------------------------------------------------------------------------


def spark_kafka_jars() -> list[str]:
    """The jars ``make spark-kafka`` resolved (the newest version present), or []."""
    for folder in sorted(glob.glob(SPARK_KAFKA_PREFIX + "*/jars"), reverse=True):
        if os.path.exists(os.path.join(folder, ".resolved")):
            return sorted(glob.glob(os.path.join(folder, "*.jar")))
    return []


def unavailable(system: str) -> str | None:
    """Why ``system`` cannot run here, or None."""
    if system == "quix" and importlib.util.find_spec("quixstreams") is None:
        return "quixstreams is not installed (pip install -e '.[bench]')"
    if system == "share_group" and not share_consumer_version():
        return (
            f"{SHARE_PYTHON} has no confluent-kafka >= 2.16 (ShareConsumer): make bench-e2e "
            "makes .cache/share-venv for it (quixstreams pins confluent-kafka < 2.13)"
        )
    if system == "spark_kafka" and not spark_kafka_jars():
        return "Spark's Kafka connector is not resolved (make spark-kafka)"
    return None


def share_consumer_version() -> str | None:
    """The confluent-kafka version of :data:`SHARE_PYTHON` if it has ``ShareConsumer``
    (2.16 on), else None."""
    probe = (
        "import confluent_kafka as c; print(c.__version__ if hasattr(c, 'ShareConsumer') else '')"
    )
    try:
        found = subprocess.run(
            [SHARE_PYTHON, "-c", probe], capture_output=True, text=True, timeout=60, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return found.stdout.strip() or None


def version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine(kafka: str | None) -> dict:
    from acker import machine as base  # the same description as the other benchmarks

    jars = spark_kafka_jars()
    connector = next((os.path.basename(j) for j in jars if "spark-sql-kafka" in j), None)
    return {
        **base(),
        "kafka_python": version("kafka-python"),
        "crc32c": importlib.util.find_spec("crc32c") is not None,
        "kafka": kafka,
        "quixstreams": version("quixstreams"),
        "confluent_kafka_share_group": share_consumer_version(),
        "spark_kafka_connector": connector,
        "loadavg": os.getloadavg(),
    }


def ratio(a: dict | None, b: dict | None) -> float | None:
    if not a or not b:
        return None
    return a["records_per_s"] / b["records_per_s"]


def median_run(runs: list[dict]) -> dict:
    """The run with the median records/s, and every run's records/s."""
    ordered = sorted(runs, key=lambda r: r["records_per_s"])
    return {**ordered[len(ordered) // 2], "runs_records_per_s": [r["records_per_s"] for r in runs]}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--max-per-batch", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--trigger-ms", type=int, default=200, help="Spark's trigger interval")
    parser.add_argument(
        "--latency-seconds", type=float, default=30, help="length of the half-rate run (0: none)"
    )
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help="comma-separated subset of " + str(SYSTEMS)
    )
    parser.add_argument("--bootstrap", help="an external Kafka (default: start Apache Kafka)")
    parser.add_argument("--timeout-s", type=float, default=None, help="per run (default: scaled)")
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument("--output", help="write the JSON here instead of benchmarks/results/")
    args = parser.parse_args(argv)
    wanted = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(wanted) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown systems {unknown}; choose from {SYSTEMS}")
    skipped = {s: why for s in wanted if (why := unavailable(s))}
    systems = [s for s in wanted if s not in skipped]
    for system, why in skipped.items():
        log(f"{system}: skipped, {why}")
    timeout_s = args.timeout_s or max(180.0, args.records / 500)

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from broker import KafkaBroker, kafka_version

    workdir = tempfile.mkdtemp(prefix="ackstream-e2e-")
    broker = None
    failed = True
    try:
        if args.bootstrap:
            bootstrap = args.bootstrap
        else:
            log("starting Apache Kafka on loopback")
            broker = KafkaBroker().start()
            bootstrap = broker.bootstrap
        started = time.time()
        run = uuid.uuid4().hex[:6]  # topics and groups of this run (a shared broker)
        topic = create_topic(bootstrap, args.partitions, f"e2e-{run}-sentences")
        lines = sentences(args.records)
        words = sum(line.count(b" ") + 1 for line in lines)
        log(f"producing {args.records} sentences ({words} words) to {topic}")
        ends = produce(bootstrap, topic, lines, args.partitions)
        del lines
        ctx = {
            "bootstrap": bootstrap,
            "input": topic,
            "run": run,
            "ends": ends,
            "records": args.records,
            "partitions": args.partitions,
            "max_per_batch": args.max_per_batch,
            "trigger_ms": args.trigger_ms,
            "workdir": workdir,
            "startup_timeout_s": 240,
        }
        runs: dict[str, list[dict]] = {s: [] for s in systems}
        for repeat in range(args.repeats):
            order = systems if repeat % 2 == 0 else systems[::-1]
            for i, system in enumerate(order):
                log(f"repeat {repeat + 1}/{args.repeats}, [{i + 1}/{len(order)}] {system}")
                runs[system].append(run_system(system, ctx, f"r{repeat}", timeout_s))
        results = {s: median_run(r) for s, r in runs.items()}
        latency = None
        if args.latency_seconds > 0 and "ackstream_kafka" in results:
            rate = results["ackstream_kafka"]["records_per_s"] / 2
            latency = latency_run(ctx, rate, args.latency_seconds, timeout_s)
        tracked, untracked = results.get("ackstream_kafka"), results.get("ackstream_untracked")
        local = results.get("ackstream_local")
        out = {
            "benchmark": "e2e",
            "date": dt.datetime.now(dt.UTC).isoformat(),
            "machine": machine(kafka_version() if broker else None),
            "config": {
                "records": args.records,
                "partitions": args.partitions,
                "max_per_batch": args.max_per_batch,
                "repeats": args.repeats,
                "trigger_ms": args.trigger_ms,
                "words": words,
                "vocabulary": len(vocabulary()),
                "message_timeout_ms": MESSAGE_TIMEOUT_MS,
                "latency_seconds": args.latency_seconds,
                "systems": systems,
                "skipped": skipped,
                "broker": "external" if args.bootstrap else "Apache Kafka, one KRaft node",
                "timing": (
                    "records_per_s: first record read (Spark: start of the first batch "
                    "with input; loop: first poll with records returned; Quix: first "
                    "record in its pipeline) to the poller seeing every input offset "
                    "committed (every 100 ms); from_ready: from the worker's start of "
                    "work; cpu_s: the process tree's user+system CPU from the start of "
                    "work to the last commit seen"
                ),
                "quix_work": "per-record word counts (one message per distinct word of a "
                "sentence), commit at most every max_per_batch records",
            },
            "systems": results,
            "latency": latency,
            "ratios": {
                "tracked_kafka_over_quix": ratio(tracked, results.get("quix")),
                "tracked_kafka_over_loop": ratio(tracked, results.get("kafka_python_loop")),
                "tracked_kafka_over_spark_kafka": ratio(tracked, results.get("spark_kafka")),
                "tracking_overhead_kafka_channel": (
                    1 - ratio(tracked, untracked) if tracked and untracked else None
                ),
                "tracking_overhead_local_channel": (
                    1 - ratio(local, untracked) if local and untracked else None
                ),
            },
            "wall_s": time.time() - started,
        }
        failed = False
    finally:
        if broker is not None:
            broker.stop()
        if failed:
            log(f"logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(out))
    if not args.no_save:
        path = args.output or os.path.join(RESULTS, f"e2e-{dt.date.today()}.json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(json.dumps(out) + "\n")
    return out


# --- the workers (each runs in a process of its own) ----------------------------------------


class Events:
    """The worker's side of the protocol: event lines out, a stop signal in (stdin closed)."""

    def __init__(self):
        self.out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
        sys.stdout = sys.stderr  # whatever else prints goes to the log
        self.stop = threading.Event()
        threading.Thread(target=self._watch_stdin, daemon=True).start()

    def _watch_stdin(self) -> None:
        sys.stdin.read()  # returns at EOF: the benchmark closed our stdin
        self.stop.set()

    def emit(self, name: str, **fields) -> None:
        self.out.write(json.dumps({MARK: name, "t": time.time(), **fields}) + "\n")
        self.out.flush()


def first_batch_start(progress: list) -> float | None:
    """Epoch seconds at which the first batch with input started, from query progress."""
    for p in progress:
        if p.get("numInputRows"):
            return dt.datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
    return None


def spark_summary(query) -> dict:
    progress = query.recentProgress
    batches = [p for p in progress if p.get("numInputRows")]
    return {
        "first_read": first_batch_start(progress),
        "first_batch_s": batches[0]["durationMs"]["triggerExecution"] / 1000 if batches else None,
        "first_batch_rows": int(batches[0]["numInputRows"]) if batches else None,
        # where the first batch's time went (Spark's phases: latestOffset, addBatch, ...)
        "first_batch_ms": dict(batches[0]["durationMs"]) if batches else None,
        "batch_ms": [p["durationMs"]["triggerExecution"] for p in batches],
        # the later batches' phases, medians (addBatch: the topology's batch function)
        "later_batch_phase_ms_median": {
            phase: float(np.median([p["durationMs"].get(phase, 0) for p in batches[1:]]))
            for phase in (batches[1]["durationMs"] if len(batches) > 1 else ())
        },
        "batches": len(batches),
        "rows_read": int(sum(p["numInputRows"] for p in batches)),
        "batch_ms_median": (
            float(np.median([p["durationMs"]["triggerExecution"] for p in batches]))
            if batches
            else None
        ),
    }


def wait_first_progress(query, events: Events, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while query.lastProgress is None and time.monotonic() < deadline:
        if query.exception():
            raise RuntimeError(str(query.exception()))
        time.sleep(0.05)


SPARK_CONF = {"spark.sql.streaming.numRecentProgressUpdates": 10_000}


def work_ackstream(system: str, a, events: Events) -> None:
    from pyspark.sql import functions as F

    from ackstream import KafkaChannel, KafkaSink, LocalChannel, Topology, local_session

    spark = local_session(a.name, conf=SPARK_CONF)
    tracking = system != "ackstream_untracked"
    if system == "ackstream_kafka":
        channel = KafkaChannel(a.bootstrap, a.name)
    else:
        channel = LocalChannel(os.path.join(a.workdir, "channel"))
    topology = (
        Topology(a.name, spark, channel, message_timeout_ms=MESSAGE_TIMEOUT_MS, tracking=tracking)
        .map(lambda df: df.withColumn("line", F.col("value").cast("string")))
        .explode(F.split("line", " "), "word")
        .aggregate("word", F.count("*").alias("n"))
        .map(lambda df: df.selectExpr("*", "word AS key", "CAST(n AS STRING) AS value"))
        .sink(KafkaSink(a.bootstrap, a.output))
    )
    options = {
        "kafka.bootstrap.servers": a.bootstrap,
        "subscribe": a.input,
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": a.max_per_batch,
        "kafka.group.id": a.group,
    }
    if not tracking:
        options["ackstream.tracking"] = "false"
    stream = topology.read_stream(options)
    events.emit("ready")
    running = topology.start(stream, os.path.join(a.workdir, "checkpoint"), trigger_ms=a.trigger_ms)
    try:
        wait_first_progress(running.query, events)
        events.emit("running")
        while not events.stop.wait(0.1):
            if running.exception():
                raise RuntimeError(f"query failed: {running.exception()}")
        summary = spark_summary(running.query)
    finally:
        running.stop()
        spark.stop()
    events.emit("finished", **summary)


def work_spark_kafka(a, events: Events) -> None:
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata
    from pyspark.sql import functions as F

    from ackstream import local_session

    spark = local_session(a.name, conf={**SPARK_CONF, "spark.jars": ",".join(spark_kafka_jars())})
    committer = KafkaConsumer(
        bootstrap_servers=a.bootstrap, group_id=a.group, enable_auto_commit=False
    )
    committer.assign([TopicPartition(a.input, p) for p in range(a.partitions)])

    def batch(df, batch_id):
        df = df.persist()
        counts = (
            df.select(F.explode(F.split(F.col("value").cast("string"), " ")).alias("word"))
            .groupBy("word")
            .count()
            .selectExpr("word AS key", "CAST(count AS STRING) AS value")
        )
        counts.write.format("kafka").option("kafka.bootstrap.servers", a.bootstrap).option(
            "topic", a.output
        ).save()
        ends = df.groupBy("partition").agg(F.max("offset").alias("last")).collect()
        committer.commit(
            {
                TopicPartition(a.input, r["partition"]): OffsetAndMetadata(r["last"] + 1, "", -1)
                for r in ends
            }
        )
        df.unpersist()

    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", a.bootstrap)
        .option("subscribe", a.input)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", a.max_per_batch)
        .load()
    )
    events.emit("ready")
    query = (
        stream.writeStream.foreachBatch(batch)
        .option("checkpointLocation", os.path.join(a.workdir, "checkpoint"))
        .trigger(processingTime=f"{a.trigger_ms} milliseconds")
        .start()
    )
    try:
        wait_first_progress(query, events)
        events.emit("running")
        while not events.stop.wait(0.1):
            if query.exception():
                raise RuntimeError(f"query failed: {query.exception()}")
        summary = spark_summary(query)
    finally:
        query.stop()
        committer.close()
        spark.stop()
    events.emit("finished", **summary)


def work_loop(a, events: Events) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    consumer = KafkaConsumer(
        a.input,
        bootstrap_servers=a.bootstrap,
        group_id=a.group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=a.max_per_batch,
    )
    producer = KafkaProducer(bootstrap_servers=a.bootstrap, acks="all", linger_ms=5)
    first, batches, rows = None, 0, 0
    events.emit("ready")
    events.emit("running")
    while not events.stop.is_set():
        polled = consumer.poll(timeout_ms=100, max_records=a.max_per_batch)
        if not polled:
            continue
        first = first or time.time()
        counts: collections.Counter = collections.Counter()
        for messages in polled.values():
            rows += len(messages)
            for message in messages:
                counts.update(message.value.decode().split(" "))
        futures = [
            producer.send(a.output, key=word.encode(), value=str(n).encode())
            for word, n in counts.items()
        ]
        producer.flush()
        for future in futures:
            future.get(timeout=30)  # raises if the broker did not take it: no commit then
        consumer.commit()
        batches += 1
    consumer.close()
    producer.close()
    events.emit("finished", first_read=first, batches=batches, rows_read=rows)


def work_share_group(a, events: Events) -> None:
    from confluent_kafka import AcknowledgeType, Producer, ShareConsumer
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    # a share group starts at the latest offset unless its group config says otherwise
    earliest = ConfigEntry(
        "share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET
    )
    group = ConfigResource(ResourceType.GROUP, a.group, incremental_configs=[earliest])
    admin = AdminClient({"bootstrap.servers": a.bootstrap})  # kept until its answer
    for future in admin.incremental_alter_configs([group]).values():
        future.result()
    consumer = ShareConsumer(
        {
            "bootstrap.servers": a.bootstrap,
            "group.id": a.group,
            "share.acknowledgement.mode": "explicit",
            "log_level": 3,  # not the "Preview" notice
        }
    )
    consumer.subscribe([a.input])
    producer = Producer({"bootstrap.servers": a.bootstrap, "acks": "all", "linger.ms": 5})
    ends = end_offsets(a.bootstrap, a.input)
    acked: set[tuple[int, int]] = set()
    first, batches, rows = None, 0, 0
    failed: list = []

    def delivered(error, _message):
        if error is not None:
            failed.append(error)

    events.emit("ready")
    events.emit("running")
    while not events.stop.is_set():
        polled = [m for m in consumer.poll(0.1) if m.error() is None]
        if not polled:
            continue
        first = first or time.time()
        rows += len(polled)
        counts = collections.Counter(word for m in polled for word in m.value().decode().split(" "))
        for word, n in counts.items():
            producer.produce(
                a.output, key=word.encode(), value=str(n).encode(), on_delivery=delivered
            )
        if producer.flush(30) or failed:
            raise RuntimeError(f"counts not written: {failed[:3]}")
        for m in polled:
            consumer.acknowledge(m, AcknowledgeType.ACCEPT)
        errors = [e for e in consumer.commit_sync(30).values() if e is not None]
        if errors:
            raise RuntimeError(f"acknowledgements refused: {errors[:3]}")
        acked.update((m.partition(), m.offset()) for m in polled)
        batches += 1
        if len(acked) == sum(ends.values()):
            events.emit("acknowledged")
    consumer.close()
    events.emit(
        "finished", first_read=first, batches=batches, rows_read=rows, redelivered=rows - len(acked)
    )


def work_quix(a, events: Events) -> None:
    from quixstreams import Application
    from quixstreams.models.serializers import Serializer

    class CountValue(Serializer):
        """The value of a (word, count) pair as a string."""

        def __call__(self, value, ctx):
            return str(value[1]).encode()

    app = Application(
        broker_address=a.bootstrap,
        consumer_group=a.group,
        auto_offset_reset="earliest",
        processing_guarantee="at-least-once",
        commit_every=a.max_per_batch,
        commit_interval=1.0,
        state_dir=os.path.join(a.workdir, "state"),
        use_changelog_topics=False,
        loglevel="WARNING",
    )
    source = app.topic(a.input, value_deserializer="str")
    sink = app.topic(a.output, key_serializer="str", value_serializer=CountValue())
    seen = {"first": None, "rows": 0}

    def split_count(line: str):
        seen["first"] = seen["first"] or time.time()
        seen["rows"] += 1
        return list(collections.Counter(line.split(" ")).items())

    sdf = app.dataframe(source).apply(split_count, expand=True)
    sdf.to_topic(sink, key=lambda pair: pair[0])

    def stop_when_told():
        events.stop.wait()
        app.stop()

    threading.Thread(target=stop_when_told, daemon=True).start()
    events.emit("ready")
    events.emit("running")
    app.run()
    events.emit("finished", first_read=seen["first"], rows_read=seen["rows"])


def worker_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="one system of the e2e benchmark")
    parser.add_argument("system", choices=SYSTEMS)
    for option in ("--bootstrap", "--input", "--output", "--group", "--name", "--workdir"):
        parser.add_argument(option, required=True)
    for option in ("--max-per-batch", "--trigger-ms", "--partitions"):
        parser.add_argument(option, type=int, required=True)
    a = parser.parse_args(argv)
    events = Events()
    if a.system in ACKSTREAM_SYSTEMS:
        work_ackstream(a.system, a, events)
    elif a.system == "spark_kafka":
        work_spark_kafka(a, events)
    elif a.system == "kafka_python_loop":
        work_loop(a, events)
    elif a.system == "share_group":
        work_share_group(a, events)
    else:
        work_quix(a, events)


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker_main(sys.argv[2:])
    else:
        # a SIGTERM (timeout, kill) ends the run through main's finally blocks, so that
        # the broker and the workers it started are stopped, not left behind
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        main()
