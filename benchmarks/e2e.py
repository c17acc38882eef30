"""End-to-end benchmark: the README's pipeline over Apache Kafka, every system doing the
same work in its natural, fastest form, side by side in one run on one machine.

The work (the systems are in ``e2e_systems.py``): an input topic per batch size holds
sentences of about 8 words (deterministic) over ``--partitions`` partitions, produced
before anything is timed. Each system reads it with a consumer group of its own in
batches of at most N records (``--batch-sizes``), counts the words of each batch, writes
the counts to an output topic of its own, and commits its input offsets to its group
after that write. After every run the output topic is read back: the counts summed per
word must equal the input's, or the run fails (a system doing less, or more, work is
caught); its number of messages is printed.

Stages that hold tuples across batches are timed against Spark's own stateful operators
doing the same work, each system reading an input made for it (``INPUT_KIND``): the
pipeline with a 2 s tumbling window after the count, by processing time and by event
time (the records' Kafka timestamps, a batch's spanning one window, a watermark
``WATERMARK_DELAY`` behind), against Spark's ``withWatermark`` +
``groupBy(window, word).count()`` in its state store; records 2k and 2k + 1 of a
partition joined, then both's words counted, by a waiting join against Spark's
stream-stream inner join with watermarks; and the pipeline with ``ack_mode=
"per_stage"`` against the same telescoped. An event input ends with a tick per
partition whose event time closes every window before it (its word is not the work's:
the check leaves it out); a window system commits a record once its window was written
(ackstream) or was counted into the state store (Spark).

Warm figures. The Spark systems share one long-lived worker process (one Spark
session); the others run in a fresh process each. Before the timed runs of a batch size,
a warm-up round runs every Spark system once over that size's input, exactly as a timed
run, and drops it (its rates are kept apart in the JSON): the JVM compiles Spark's hot
code for minutes, and a first run at a size was 10 to 40 % slower than the next ones even
after a short warm-up. Every input also starts with ``--warmup-batches`` batches: a run
is timed from its group's first commit that covers them to the one that covers every
offset, both seen by a poller asking the broker every 50 ms; its rate is the records
committed in between over that time. Warm is not steady: each run reports the share of
the worker's CPU its JVM's JIT compilers took (``jit_cpu_share``), still a fifth or more
minutes in, and the classes Spark's code generation compiled per batch (a plan that
differs each batch would recompile every time). CPU:
user + system seconds of the worker's process tree (Spark's JVM and Python workers
included, the broker not) over the same span, per record. Repeats alternate the order
(A B C, then C B A); ``/proc/loadavg`` is recorded before and after every run.

Cold figures (``--cold-systems``): each system once in a fresh process on the first
size's input, before the warm runs: from the process's start to the first output
message, and to every input offset committed.

Latency (``--latency-seconds``): ackstream tracked on the Kafka channel in the warm
worker, fed at half its median rate at the first size by a confluent-kafka producer
here (kafka-python's took most of one of the two cores), timed after an untimed paced
lead-in (``--latency-lead-s``): complete latency (its completions) and send-to-commit
latency (a record's send to the poller seeing an offset committed past it), p50 and
p99, and each batch's phases (Spark's progress).

Prints tables and the figures of the project's targets (``TARGETS``) and writes JSON
to ``benchmarks/results/e2e-<date>.json``.

    .venv/bin/python benchmarks/e2e.py [--batch-sizes 20000,100000] [--batches 10]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime as dt
import functools
import glob
import importlib.metadata
import importlib.util
import json
import math
import os
import queue
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
import uuid

import numpy as np
from e2e_systems import (
    INPUT_KIND,
    JOINED,
    MARK,
    MESSAGE_TIMEOUT_MS,
    PER_STAGE,
    PYTHON_READER,
    SPARK_JOIN,
    SPARK_SYSTEMS,
    SPARK_WINDOW,
    SYSTEMS,
    TICK,
    TRACKED,
    UNTRACKED,
    UNTRACKED_GUIDE,
    WINDOW_SECONDS,
    WINDOWED,
    WINDOWED_EVENT,
    WINDOWED_GUIDE,
    spark_kafka_jars,
)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
sys.path.insert(0, ROOT)

#: What the figures are judged against: (name, system, the system it is compared with,
#: comparison, target, the batch size the target applies at or None for every size).
#: An overhead is 1 - system / other; a None comparison is printed, not judged.
TARGETS = (
    ("tracked / Spark's Kafka source", TRACKED, "spark_kafka", ">=", 0.8, None),
    ("tracked / Quix", TRACKED, "quix", ">=", 1.5, None),
    ("tracked / kafka-python loop", TRACKED, "kafka_python_loop", ">=", 1.2, 100_000),
    ("tracking overhead, Kafka channel", TRACKED, UNTRACKED, "<=", 0.10, None),
    ("tracking overhead, local channel", "ackstream_local", UNTRACKED, None, None, None),
    ("Spark's reader / Python reader, tracked", TRACKED, PYTHON_READER, None, None, None),
    ("time window overhead, tracked", WINDOWED, TRACKED, None, None, None),
    ("time window / Spark's windowed count", WINDOWED, SPARK_WINDOW, ">=", 0.6, None),
    ("guide's window / Spark's windowed count", WINDOWED_GUIDE, SPARK_WINDOW, ">=", 0.6, None),
    ("untracked guide's window / Spark's, a batch", UNTRACKED_GUIDE, SPARK_WINDOW, ">=", 0.8, None),
    ("event-time window / Spark's windowed count", WINDOWED_EVENT, SPARK_WINDOW, ">=", 0.6, None),
    ("waiting join / Spark's stream-stream join", JOINED, SPARK_JOIN, ">=", 0.8, None),
    ("per_stage / telescoped", PER_STAGE, TRACKED, ">=", 0.3, None),
)
#: Systems whose commits run ahead of their output (untracked, a window's rows are
#: committed before the window is written): a run ends once the output is complete,
#: and the figure is judged per batch (see ``per_batch``), not by commits over time.
OUTPUT_LAGS_COMMITS = (UNTRACKED_GUIDE,)
LATENCY_TARGETS = (("complete_p99_ms", "<=", 1000.0), ("committed_p99_ms", "<=", 2000.0))
#: the latency run's producer sleeps to its pace once per this many records
PACE_EVERY = 32


#: A worker that committed nothing new for this long (from its start: a cold Spark
#: system commits first well within it) has stalled.
STALL_S = 120.0


class Stalled(RuntimeError):
    """A worker's commits stopped moving (see :meth:`Poller.wait`)."""


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


def produce(
    bootstrap: str, topic: str, lines: list[bytes], partitions: int, times: list[int] | None = None
) -> dict[int, int]:
    """Send every line (record i to partition i % partitions, with the Kafka timestamp
    ``times[i]`` when given); returns the end offsets."""
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=20, batch_size=256 << 10
    )
    try:
        futures = [
            producer.send(
                topic,
                value=line,
                partition=i % partitions,
                timestamp_ms=None if times is None else times[i],
            )
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


def paced_send(bootstrap, topic, lines, rate: float, partitions: int, worker) -> list[tuple]:
    """Send ``lines`` at ``rate`` records a second (record i to partition i % partitions)
    and return each one's (send time, partition, offset). With confluent-kafka's
    producer: kafka-python's took most of a core at these rates, a share of the two
    cores the measured system runs on."""
    from confluent_kafka import KafkaException, Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1})
    sent: list[float] = []
    placed: dict[int, tuple[int, int]] = {}
    errors: list = []

    def delivered(i: int, error, message) -> None:
        if error is not None:
            errors.append(error)
        else:
            placed[i] = (message.partition(), message.offset())

    begin = time.monotonic()
    for i, line in enumerate(lines):
        if i % PACE_EVERY == 0:  # a sleep per record would cost more than its send
            producer.poll(0)
            wait = begin + i / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if i % (PACE_EVERY * 128) == 0:
                worker.check_alive()
        sent.append(time.time())
        producer.produce(
            topic, value=line, partition=i % partitions, on_delivery=functools.partial(delivered, i)
        )
    if producer.flush(60) or errors or len(placed) != len(sent):
        raise KafkaException(errors[0] if errors else f"{len(sent) - len(placed)} not delivered")
    return [(t, *placed[i]) for i, t in enumerate(sent)]


def create_topic(bootstrap: str, partitions: int, name: str) -> str:
    from broker import create_topic as create

    return create(bootstrap, partitions, name=name)


#: how far after the last record the ticks of an event input are (a broker refuses a
#: timestamp more than an hour ahead of its clock by default)
TICK_AFTER_MS = 600_000


@dataclasses.dataclass
class Input:
    """An input topic: its first ``warm_ends`` offsets are the warm-up, the rest timed
    (ticks after ``ends``, if any, are neither)."""

    topic: str
    max_per_batch: int
    warm_ends: dict[int, int]
    ends: dict[int, int]
    counts: collections.Counter  # word (bytes) -> occurrences in the whole topic
    kind: str = "plain"
    #: a word that is not the work's: the ticks' (counted in windows that may never close)
    ignored: bytes | None = None

    @property
    def records(self) -> int:
        return sum(self.ends.values())

    @property
    def timed_records(self) -> int:
        return self.records - sum(self.warm_ends.values())

    def figures(self) -> dict:
        return {
            "timed_records": self.timed_records,
            "warmup_records": self.records - self.timed_records,
            "words": sum(self.counts.values()),
        }


def make_input(
    ctx, name: str, max_per_batch: int, warm_batches: int, timed_batches: int, kind="plain"
):
    """A topic of ``warm_batches`` then ``timed_batches`` batches of sentences, the
    warm-up produced (and flushed) first so that it holds the lowest offsets. ``kind``
    (``e2e_systems.INPUT_KIND``): ``"plain"``; ``"event"``, each record's timestamp its
    event time, from now on, a batch's records spanning one window, then a tick per
    partition (the word ``TICK``, :data:`TICK_AFTER_MS` later) whose watermark closes
    every window of the records before it; ``"pairs"``, event times too, and an even number
    of records in each partition, so that every record 2k has its 2k + 1."""
    topic = create_topic(ctx.bootstrap, ctx.partitions, f"e2e-{ctx.run}-{name}")
    count = (warm_batches + timed_batches) * max_per_batch
    if kind == "pairs":
        count += -count % (2 * ctx.partitions)
    lines = sentences(count)
    times = None
    if kind != "plain":
        start = int(time.time() * 1000)
        step = ctx.window_seconds * 1000 / max_per_batch  # a batch's records span one window
        times = [start + int(i * step) for i in range(count)]
    warm = warm_batches * max_per_batch
    log(f"producing {len(lines):,} sentences to {topic} ({warm:,} of them the warm-up)")
    first, rest = (None, None) if times is None else (times[:warm], times[warm:])
    warm_ends = produce(ctx.bootstrap, topic, lines[:warm], ctx.partitions, first) if warm else {}
    ends = {**warm_ends, **produce(ctx.bootstrap, topic, lines[warm:], ctx.partitions, rest)}
    counts = collections.Counter(b" ".join(lines).split(b" "))
    ignored = None
    if kind == "event":
        ignored, ticks = TICK.encode(), [times[-1] + TICK_AFTER_MS] * ctx.partitions
        produce(ctx.bootstrap, topic, [ignored] * ctx.partitions, ctx.partitions, ticks)
    return Input(topic, max_per_batch, warm_ends, ends, counts, kind, ignored)


def read_output(bootstrap: str, topic: str, timeout_s: float = 120) -> tuple[dict, int]:
    """The counts of ``topic`` summed per word, and its number of messages."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        ends = consumer.end_offsets(parts)
        counts: collections.Counter = collections.Counter()
        messages = 0
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < end for tp, end in ends.items()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"could not read {topic} to its end in {timeout_s:.0f} s")
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    counts[record.key] += int(record.value)
                messages += len(records)
        return counts, messages
    finally:
        consumer.close()


def wait_for_output(bootstrap: str, output: str, inp: Input, timeout_s: float) -> None:
    """Wait until ``output`` holds the counts of ``inp`` (or ``timeout_s`` passes; the
    check that follows then says what differs)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        counts, _ = read_output(bootstrap, output)
        counts.pop(inp.ignored, None)
        if counts == inp.counts:
            return
        time.sleep(1)


def check_same_work(system: str, expected: collections.Counter, found: dict) -> None:
    """Fails unless ``found`` (the output's counts per word) equals ``expected``."""
    if found == expected:
        return
    wrong = [w for w in expected.keys() | found.keys() if found.get(w, 0) != expected.get(w, 0)]
    examples = ", ".join(
        f"{w.decode(errors='replace') if w else w!r}: {found.get(w, 0)} for {expected.get(w, 0)}"
        for w in sorted(wrong, key=lambda w: w or b"")[:5]
    )
    raise RuntimeError(
        f"system {system} did not do the same work: its output counts "
        f"{sum(found.values()):,} words against {sum(expected.values()):,} in the input, "
        f"{len(wrong)} words differ (e.g. {examples})"
    )


# --- measuring from outside -----------------------------------------------------------


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def session_stats(session: int) -> tuple[list[int], dict[tuple[int, int], int]]:
    """The processes of session ``session`` (the worker and everything it started) and
    each one's own user + system CPU ticks, by (pid, start time): a pid may be reused."""
    pids, ticks = [], {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[3]) == session:  # fields[3]: the session id
            pid = int(stat.split("/")[2])
            pids.append(pid)
            ticks[pid, int(fields[19])] = int(fields[11]) + int(fields[12])  # utime stime
    return pids, ticks


#: how often the poller reads the worker's CPU between the marks
CPU_SAMPLE_S = 0.5


def loadavg() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(v) for v in f.read().split()[:3]]


class Poller(threading.Thread):
    """Asks the broker for ``group``'s committed offsets on ``topic`` every ``interval_s``.
    Records when they first cover each expected set of end offsets (``expect``), with
    ``cpu()`` then, the history of each partition's commits, and, given ``output``, when
    that topic first holds a message."""

    def __init__(self, bootstrap, group, topic, cpu, output=None, interval_s=0.05):
        super().__init__(daemon=True, name=f"poller-{group}")
        self.bootstrap, self.group, self.topic, self.output = bootstrap, group, topic, output
        self.cpu, self.interval_s = cpu, interval_s
        self.expected: dict[str, dict[int, int]] = {}
        #: (time, (cpu s, of which JIT), committed)
        self.reached: dict[str, tuple[float, tuple[float, float], int]] = {}
        self.committed: dict[int, int] = {}
        self.history: dict[int, list[tuple[float, int]]] = collections.defaultdict(list)
        self.first_output: float | None = None
        self.changed = threading.Event()
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    def expect(self, name: str, ends: dict[int, int]) -> None:
        self.expected[name] = dict(ends)

    def run(self) -> None:
        from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="e2e-poller")
        outputs = KafkaConsumer(bootstrap_servers=self.bootstrap) if self.output else None
        try:
            parts = []
            if outputs is not None:
                ids = outputs.partitions_for_topic(self.output) or ()
                parts = [TopicPartition(self.output, p) for p in ids]
            sampled = 0.0
            while not self.stopped.is_set():
                asked = time.monotonic()
                if asked - sampled >= CPU_SAMPLE_S:  # see Worker.cpu_s: processes that end
                    self.cpu()
                    sampled = asked
                # the output first: it is written before the commits that _poll sees
                if parts and self.first_output is None and any(outputs.end_offsets(parts).values()):
                    self.first_output = time.time()
                self._poll(admin)
                self.stopped.wait(max(0.0, self.interval_s - (time.monotonic() - asked)))
        except BaseException as error:  # the run fails loud with it (see check)
            self.error = error
            raise
        finally:
            admin.close()
            if outputs is not None:
                outputs.close()

    def _poll(self, admin) -> None:
        from kafka.errors import KafkaError

        try:
            offsets = admin.list_group_offsets({self.group: None}).get(self.group, {})
        except KafkaError:  # e.g. the group's coordinator is not ready yet
            return
        now = time.time()
        for tp, meta in offsets.items():
            if (
                tp.topic == self.topic
                and meta
                and meta.offset > self.committed.get(tp.partition, 0)
            ):
                self.committed[tp.partition] = meta.offset
                self.history[tp.partition].append((now, meta.offset))
        for name, ends in list(self.expected.items()):
            if name not in self.reached and self.covers(ends):
                self.reached[name] = (now, self.cpu(), sum(self.committed.values()))
                self.changed.set()

    def covers(self, ends: dict[int, int]) -> bool:
        return all(self.committed.get(p, 0) >= end for p, end in ends.items())

    def wait(self, name: str, worker: Worker, timeout_s: float) -> tuple[float, float, int]:
        """When the commits covered ``name``'s offsets, the CPU seconds and the number of
        offsets committed then. A worker that commits nothing new for :data:`STALL_S`
        has stalled (:class:`Stalled`)."""
        deadline = time.monotonic() + timeout_s
        progress, last = time.monotonic(), sum(self.committed.values())
        while name not in self.reached:
            if self.error is not None:
                raise RuntimeError(f"the commit poller of {self.group} failed: {self.error!r}")
            worker.check_alive()
            committed = sum(self.committed.values())
            if committed != last:
                progress, last = time.monotonic(), committed
            elif time.monotonic() - progress > STALL_S:
                worker.kill()
                raise Stalled(f"{self.group}: no new commit for {STALL_S:.0f} s, at {committed:,}")
            if time.monotonic() > deadline:
                worker.fail(
                    f"committed {sum(self.committed.values()):,} offsets of "
                    f"{sum(self.expected[name].values()):,} in {timeout_s:.0f} s"
                )
            self.changed.wait(0.1)
            self.changed.clear()
        return self.reached[name]

    def seen_at(self, partition: int, offset: int) -> float | None:
        """When a committed offset past ``offset`` of ``partition`` was first seen."""
        return next((t for t, o in self.history.get(partition, ()) if o > offset), None)


class Worker:
    """A process running systems one after another on command (JSON lines on its stdin:
    a run, then a stop), reporting ``started`` and ``finished`` as JSON lines on its
    stdout; it ends when its stdin closes. Started in a session of its own, so that its
    CPU time and its processes (Spark's JVM, Python workers) can be found."""

    def __init__(self, log_path: str):
        self.log_path = log_path
        #: each process's own CPU ticks when last seen, by (pid, start time): see cpu_s
        self.seen_ticks: dict[tuple[int, int], int] = {}
        self.seen_jit: dict[tuple[int, int, int], int] = {}  # by (pid, thread, start time)
        self.events: queue.Queue = queue.Queue()
        self.spawned = time.time()
        with open(log_path, "ab") as log_file:
            self.process = subprocess.Popen(
                [sys.executable, os.path.join(HERE, "e2e_systems.py")],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log_file,
                start_new_session=True,
                cwd=ROOT,
            )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for raw in self.process.stdout:
            with contextlib.suppress(ValueError):
                event = json.loads(raw)
                if isinstance(event, dict) and MARK in event:
                    self.events.put(event)
        self.events.put(None)  # the worker's stdout closed

    def send(self, **command) -> None:
        self.process.stdin.write((json.dumps(command) + "\n").encode())
        self.process.stdin.flush()

    def expect(self, name: str, timeout_s: float) -> dict:
        try:
            event = self.events.get(timeout=timeout_s)
        except queue.Empty:
            self.fail(f"sent no '{name}' within {timeout_s:.0f} s")
        if event is None:
            self.process.wait(10)
            self.fail(f"exited with {self.process.returncode} before '{name}'")
        if event[MARK] != name:
            self.fail(f"sent '{event[MARK]}' where '{name}' was due")
        return event

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            self.fail(f"exited with {self.process.returncode} while running")

    def cpu_s(self) -> tuple[float, float]:
        """User + system CPU seconds of the worker's processes, and of those the JIT
        compiler threads' (C1 and C2) of its JVM: how much of a run went to compiling.
        Each process and compiler thread counts its own time, remembered once it has
        ended (the JVM ends compiler threads it no longer needs): PySpark's daemon
        ignores SIGCHLD, so an ended Python worker's time reaches no parent's children's
        time, and a sum over the live processes went down when one ended (the poller
        samples it often, so little of an ended process's last moments is missed)."""
        pids, ticks = session_stats(self.process.pid)
        self.seen_ticks.update(ticks)
        total = sum(self.seen_ticks.values()) / _CLK_TCK
        for pid in pids:
            for stat in glob.glob(f"/proc/{pid}/task/*/stat"):
                try:
                    with open(stat) as f:
                        text = f.read()
                except OSError:  # gone meanwhile
                    continue
                name, fields = text[text.find("(") + 1 : text.rfind(")")], text.rsplit(")", 1)[1]
                if name.startswith(("C1 CompilerThre", "C2 CompilerThre")):
                    values = fields.split()
                    thread = (pid, int(stat.split("/")[4]), int(values[19]))
                    self.seen_jit[thread] = int(values[11]) + int(values[12])  # utime stime
        return total, sum(self.seen_jit.values()) / _CLK_TCK

    def close(self, timeout_s: float = 90.0) -> None:
        """Close stdin (the worker ends), wait for it, end what is left of its session."""
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout_s)
        self.kill()

    def kill(self) -> None:
        """SIGTERM, then SIGKILL, to every process of the worker's session, by pid."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = session_stats(self.process.pid)[0]
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 10
            while session_stats(self.process.pid)[0] and time.monotonic() < deadline:
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
        raise RuntimeError(f"worker {why}; its log ({self.log_path}) ends with:\n" + "".join(tail))


# --- one run of one system ------------------------------------------------------------


def ackstream_options(given: list[str], parser) -> dict[str, str]:
    """``KEY=VALUE`` arguments as source options; a malformed one stops the run."""
    options = {}
    for item in given:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            parser.error(f"--ackstream-option {item!r}: expected KEY=VALUE")
        options[key.strip()] = value.strip()
    return options


def start_job(worker: Worker, ctx, system: str, name: str, topic: str, max_per_batch: int):
    """Send ``worker`` the job of ``system`` over ``topic`` (its group, checkpoint and
    output named ``name``); returns its output topic."""
    output = create_topic(ctx.bootstrap, ctx.partitions, f"{name}-out")
    workdir = os.path.join(ctx.workdir, name)
    os.makedirs(workdir)
    worker.send(
        system=system,
        bootstrap=ctx.bootstrap,
        input=topic,
        output=output,
        group=name,
        name=name,
        workdir=workdir,
        max_per_batch=max_per_batch,
        trigger_ms=ctx.trigger_ms,
        warmup_batches=ctx.warmup_batches,
        ackstream_options=ctx.ackstream_options,
        window_seconds=ctx.window_seconds,
    )
    return output


def run_system(worker: Worker, system: str, inp: Input, ctx, tag: str, cold=False) -> dict:
    """Run ``system`` in ``worker`` over ``inp`` until its group committed every input
    offset, stop it, check its output; returns its figures (timed from the warm-up's
    commit, or, when ``cold``, from the worker's start)."""
    name = f"e2e-{ctx.run}-{tag}-{system.replace('_', '-')}"
    load_before = loadavg()
    output = start_job(worker, ctx, system, name, inp.topic, inp.max_per_batch)
    poller = Poller(ctx.bootstrap, name, inp.topic, worker.cpu_s, output if cold else None)
    poller.expect("warm", inp.warm_ends)
    poller.expect("all", inp.ends)
    poller.start()
    try:
        started = worker.expect("started", ctx.startup_timeout_s)
        warm_at, (warm_cpu, warm_jit), warm_committed = poller.wait("warm", worker, ctx.timeout_s)
        done_at, (done_cpu, done_jit), _ = poller.wait("all", worker, ctx.timeout_s)
        if system in OUTPUT_LAGS_COMMITS:
            wait_for_output(ctx.bootstrap, output, inp, ctx.timeout_s)
        worker.send(stop=True)
        finished = worker.expect("finished", 180)
    finally:
        poller.stopped.set()
        poller.join(10)
    load_after = loadavg()
    counts, messages = read_output(ctx.bootstrap, output)
    counts.pop(inp.ignored, None)
    check_same_work(system, inp.counts, counts)
    if cold:
        result = {
            "to_started_s": started["t"] - worker.spawned,
            "to_first_output_s": (poller.first_output or done_at) - worker.spawned,
            "to_all_committed_s": done_at - worker.spawned,
            "records": inp.records,
            "output_messages": messages,
            "loadavg_before": load_before,
        }
        log(
            f"{system} cold: first output {result['to_first_output_s']:.1f} s, all committed "
            f"{result['to_all_committed_s']:.1f} s after its process started"
        )
        return result
    # a system whose batches do not split evenly over the partitions may commit past
    # the warm-up before its commits cover it: what it committed since is what is timed
    timed = inp.records - warm_committed
    if not timed:
        raise RuntimeError(
            f"system {system} committed no offset between the warm-up and the end: "
            "give it more --batches"
        )
    result = {
        "timed_records": timed,
        "records_per_s": timed / (done_at - warm_at),
        "seconds": done_at - warm_at,
        "cpu_us_per_record": 1e6 * (done_cpu - warm_cpu) / timed,
        "jit_cpu_share": (done_jit - warm_jit) / max(done_cpu - warm_cpu, 1e-9),
        "output_messages": messages,
        "words_counted": sum(counts.values()),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        **{k: v for k, v in finished.items() if k not in (MARK, "t")},
    }
    log(
        f"{system}: {result['records_per_s']:,.0f} records/s, "
        f"{result['cpu_us_per_record']:.1f} CPU us/record "
        f"({100 * result['jit_cpu_share']:.0f} % compiling), {messages:,} output messages"
    )
    return result


def run_fresh(system: str, inp: Input, ctx, tag: str, cold=False) -> dict:
    """``system`` in a worker process of its own; a run that stalled (kafka-python's
    group coordination has been seen to spin without end in a fresh consumer) is
    run once more in a new process, and the stall is recorded with the result."""
    stalls = []
    for attempt in range(2):
        worker = Worker(os.path.join(ctx.workdir, f"{tag}-{system}-{attempt}.log"))
        try:
            result = run_system(worker, system, inp, ctx, f"{tag}-{attempt}", cold=cold)
            return {**result, "stalled_runs": stalls} if stalls else result
        except Stalled as stall:
            log(f"{system}: stalled ({stall}); running it again in a new process")
            stalls.append(str(stall))
        finally:
            worker.close()
    raise RuntimeError(f"{system} stalled twice: {stalls}")


def latency_run(
    worker: Worker, ctx, rate: float, seconds: float, lead_s: float, max_per_batch: int
) -> dict:
    """ackstream tracked on the Kafka channel, fed at ``rate`` records/s by a producer
    here: a second's worth of records at once (the query is running), then ``lead_s``
    of paced records that are not timed (the new query's first batches ran up to twice
    as long as later ones), then ``seconds`` of timed ones: complete and send-to-commit
    latency percentiles of those."""
    from ackstream import KafkaChannel
    from ackstream.vocabulary.records import ACKED

    name = f"e2e-{ctx.run}-latency"
    topic = create_topic(ctx.bootstrap, ctx.partitions, f"{name}-in")
    count = max(ctx.partitions * 10, int(rate * seconds))
    lead = int(rate * lead_s)
    warm = max(ctx.partitions * 10, int(rate))
    start_job(worker, ctx, TRACKED, name, topic, max_per_batch)
    poller = Poller(ctx.bootstrap, name, topic, worker.cpu_s)
    poller.start()
    try:
        worker.expect("started", ctx.startup_timeout_s)
        log(f"latency: warming up with {warm:,} records")
        warm_ends = produce(ctx.bootstrap, topic, sentences(warm, seed=17), ctx.partitions)
        poller.expect("warm", warm_ends)
        poller.wait("warm", worker, ctx.timeout_s)
        log(f"latency: producing {lead:,} + {count:,} records at {rate:,.0f}/s")
        placed = paced_send(
            ctx.bootstrap, topic, sentences(lead + count, seed=16), rate, ctx.partitions, worker
        )
        ends = dict(warm_ends)
        for _, partition, offset in placed:
            ends[partition] = max(ends[partition], offset + 1)
        poller.expect("all", ends)
        poller.wait("all", worker, ctx.timeout_s)
        worker.send(stop=True)
        finished = worker.expect("finished", 180)
    finally:
        poller.stopped.set()
        poller.join(10)
    every_ms = np.array([1000 * (poller.seen_at(p, o) - t) for t, p, o in placed], float)
    committed_ms, timed = every_ms[lead:], placed[lead:]
    first = {}  # each partition's first timed offset
    for _, partition, offset in timed:
        first[partition] = min(first.get(partition, offset), offset)
    done = KafkaChannel(ctx.bootstrap, name).completions_since(None)[0].to_pylist()
    complete_ms = np.array(
        [
            c["latency_ms"]
            for c in done
            if c["status"] == ACKED and c["offset"] >= first.get(c["partition"], math.inf)
        ],
        float,
    )
    result = {
        "system": TRACKED,
        "rate_records_per_s": rate,
        "records": count,
        "warmup_records": warm,
        "lead_in_records": lead,
        "max_per_batch": max_per_batch,
        "acked": len(complete_ms),
        "complete_p50_ms": float(np.percentile(complete_ms, 50)) if len(complete_ms) else None,
        "complete_p99_ms": float(np.percentile(complete_ms, 99)) if len(complete_ms) else None,
        "committed_p50_ms": float(np.percentile(committed_ms, 50)),
        "committed_p99_ms": float(np.percentile(committed_ms, 99)),
        "committed_p99_ms_with_lead_in": float(np.percentile(every_ms, 99)),
        "phase_ms_median": finished["phase_ms_median"],
        "progress": finished["progress"],
    }
    log(
        f"latency at {rate:,.0f}/s: complete p50/p99 {result['complete_p50_ms']}/"
        f"{result['complete_p99_ms']} ms, send-to-commit p50/p99 "
        f"{result['committed_p50_ms']:.0f}/{result['committed_p99_ms']:.0f} ms (p99 "
        f"{result['committed_p99_ms_with_lead_in']:.0f} ms with the lead-in)"
    )
    return result


# --- figures --------------------------------------------------------------------------


def spread(values: list) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
        "mean": statistics.fmean(values),
        "n": len(values),
    }


def summarize(runs: list[dict]) -> dict:
    return {
        "records_per_s": spread([r["records_per_s"] for r in runs]),
        "cpu_us_per_record": spread([r["cpu_us_per_record"] for r in runs]),
        "output_messages": [r["output_messages"] for r in runs],
        "runs": runs,
    }


def judge(value: float | None, comparison: str | None, target: float | None) -> bool | None:
    if value is None or comparison is None:
        return None
    return value >= target if comparison == ">=" else value <= target


def per_batch(top: list[dict], bottom: list[dict]) -> dict | None:
    """The pairs' ratio of the median batch (Spark's ``triggerExecution``) of ``bottom``
    to that of ``top``, where both are Spark systems: the same records a batch, so a
    throughput ratio that does not depend on when a window system commits (its commits
    come once a window, so a short run's records/s is coarse), or on whether it does."""

    def batch_ms(run: dict) -> float | None:
        return run.get("phase_ms_median", {}).get("triggerExecution") or None

    pairs = [batch_ms(b) / batch_ms(a) for a, b in zip(top, bottom) if batch_ms(a) and batch_ms(b)]
    return spread(pairs)


def ratios(sizes: dict[int, dict[str, list[dict]]], latency: dict | None) -> list[dict]:
    """Each target's figure per batch size: the two systems' runs of one repeat paired,
    the pairs' mean, min and max, and the ratio of the two medians; tracking overheads as
    1 - tracked / untracked. The mean of the pairs is judged against the target."""
    out = []
    for size, runs in sizes.items():
        for name, top, bottom, comparison, target, at in TARGETS:
            if not runs.get(top) or not runs.get(bottom):
                continue
            pairs = [
                a["records_per_s"] / b["records_per_s"] for a, b in zip(runs[top], runs[bottom])
            ]
            medians = [
                statistics.median(r["records_per_s"] for r in runs[s]) for s in (top, bottom)
            ]
            of_medians = medians[0] / medians[1]
            if "overhead" in name:
                pairs, of_medians = [1 - p for p in pairs], 1 - of_medians
            figure = spread(pairs)
            applies = at is None or at == size
            by_batch = per_batch(runs[top], runs[bottom])
            judged = by_batch if top in OUTPUT_LAGS_COMMITS else figure
            met = judge(judged and judged["mean"], comparison, target) if applies else None
            out.append(
                {
                    "name": name,
                    "batch_size": size,
                    "pairs": pairs,
                    "mean": figure["mean"],
                    "min": figure["min"],
                    "max": figure["max"],
                    "of_medians": of_medians,
                    "per_batch": by_batch,
                    "target": f"{comparison} {target}" if comparison and applies else None,
                    "met": met,
                }
            )
    for key, comparison, target in LATENCY_TARGETS if latency else ():
        value = latency[key]
        out.append(
            {
                "name": f"latency {key} at {latency['rate_records_per_s']:,.0f} records/s",
                "batch_size": latency["max_per_batch"],
                "mean": value,
                "target": f"{comparison} {target}",
                "met": judge(value, comparison, target),
            }
        )
    return out


def print_tables(out: dict) -> None:
    def num(value, digits=0):
        return "-" if value is None else f"{value:,.{digits}f}"

    print()
    for size, figures in out["sizes"].items():
        print(
            f"{int(size):,} records per batch: {figures['timed_records']:,} timed records "
            f"(+{figures['warmup_records']:,} warm-up), {out['config']['partitions']} "
            f"partitions, runs alternating: {out['config']['repeats']}"
        )
        print(
            f"  {'system':<21} {'rec/s median':>12} {'min':>9} {'max':>9} "
            f"{'CPU us/rec':>10} {'out msgs':>9}  load before/after"
        )
        for system, s in figures["systems"].items():
            rate, cpu = s["records_per_s"], s["cpu_us_per_record"]
            loads = " ".join(
                f"{r['loadavg_before'][0]:.1f}/{r['loadavg_after'][0]:.1f}" for r in s["runs"]
            )
            print(
                f"  {system:<21} {num(rate['median']):>12} {num(rate['min']):>9} "
                f"{num(rate['max']):>9} {num(cpu['median'], 1):>10} "
                f"{num(statistics.median(s['output_messages'])):>9}  {loads}"
            )
        print()
    if out["cold"]:
        print("cold start, a fresh process per system (seconds from its start)")
        print(f"  {'system':<21} {'started':>8} {'1st output':>10} {'all committed':>13}")
        for system, c in out["cold"].items():
            print(
                f"  {system:<21} {num(c['to_started_s'], 1):>8} "
                f"{num(c['to_first_output_s'], 1):>10} {num(c['to_all_committed_s'], 1):>13}"
            )
        print()
    if out["latency"]:
        lat = out["latency"]
        print(
            f"latency, {TRACKED} at {lat['rate_records_per_s']:,.0f} records/s: complete "
            f"p50/p99 {num(lat['complete_p50_ms'])}/{num(lat['complete_p99_ms'])} ms, "
            f"send-to-commit p50/p99 {num(lat['committed_p50_ms'])}/"
            f"{num(lat['committed_p99_ms'])} ms"
        )
        print()
    print(
        f"  {'figure (runs of a repeat paired)':<46} {'batch':>7} {'mean':>8} {'min':>7} "
        f"{'max':>7} {'medians':>7} {'target':>8}  met  per batch (min-max)"
    )
    for r in out["targets"]:
        met = {True: "yes", False: "NO", None: "-"}[r["met"]]
        by_batch = r.get("per_batch")
        batches = "-"
        if by_batch:
            batches = f"{by_batch['mean']:.2f} ({by_batch['min']:.2f}-{by_batch['max']:.2f})"
        print(
            f"  {r['name']:<46} {r['batch_size']:>7,} {num(r['mean'], 2):>8} "
            f"{num(r.get('min'), 2):>7} {num(r.get('max'), 2):>7} "
            f"{num(r.get('of_medians'), 2):>7} {r['target'] or '-':>8}  {met:<3}  {batches}"
        )


# --- the run ----------------------------------------------------------------------------


def unavailable(system: str) -> str | None:
    """Why ``system`` cannot run here, or None."""
    if system == "quix" and importlib.util.find_spec("quixstreams") is None:
        return "quixstreams is not installed (pip install -e '.[bench]')"
    if system == "spark_kafka" and not spark_kafka_jars():
        return "Spark's Kafka connector is not resolved (make spark-kafka)"
    return None


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
        "cores_usable": len(os.sched_getaffinity(0)),
        "kafka_python": version("kafka-python"),
        "crc32c": importlib.util.find_spec("crc32c") is not None,
        "kafka": kafka,
        "quixstreams": version("quixstreams"),
        "confluent_kafka": version("confluent-kafka"),
        "spark_kafka_connector": connector,
        "loadavg": loadavg(),
    }


def systems_named(text: str, parser) -> list[str]:
    if text == "all":
        return list(SYSTEMS)
    named = [s.strip() for s in text.split(",") if s.strip()]
    unknown = sorted(set(named) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown systems {unknown}; choose from {SYSTEMS}")
    return named


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--batch-sizes", default="20000,100000", help="records per batch, comma-separated"
    )
    parser.add_argument("--batches", type=int, default=10, help="timed batches per run")
    parser.add_argument("--warmup-batches", type=int, default=2, help="dropped before timing")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="runs per system and size")
    parser.add_argument("--trigger-ms", type=int, default=200, help="the Spark systems' trigger")
    parser.add_argument(
        "--window-seconds", type=int, default=WINDOW_SECONDS, help="the window systems' length"
    )
    parser.add_argument("--systems", default="all", help=f"comma-separated, of {SYSTEMS}")
    parser.add_argument(
        "--cold-systems", default="all", help="systems timed cold, once each ('' for none)"
    )
    parser.add_argument(
        "--no-warmup-round", action="store_true", help="no untimed run of each Spark system"
    )
    parser.add_argument(
        "--latency-seconds", type=float, default=30, help="length of the half-rate run (0: none)"
    )
    parser.add_argument("--latency-rate", type=float, help="instead of half the tracked rate")
    parser.add_argument(
        "--latency-lead-s", type=float, default=10, help="paced, untimed, before the timed run"
    )
    parser.add_argument(
        "--ackstream-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a source option for every ackstream system (e.g. ackstream.maxValueBytes=none)",
    )
    parser.add_argument("--bootstrap", help="an external Kafka (default: start Apache Kafka)")
    parser.add_argument("--timeout-s", type=float, help="per run (default: scaled)")
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument("--output", help="write the JSON here instead of benchmarks/results/")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.batch_sizes.split(",") if s.strip()]
    wanted = systems_named(args.systems, parser)
    skipped = {s: why for s in wanted if (why := unavailable(s))}
    systems = [s for s in wanted if s not in skipped]
    cold_systems = [s for s in systems_named(args.cold_systems, parser) if s in systems]
    for system, why in skipped.items():
        log(f"{system}: skipped, {why}")
    if not args.repeats and not args.latency_rate and args.latency_seconds > 0:
        parser.error("--repeats 0 (the latency run alone) needs --latency-rate")
    if (
        args.latency_seconds > 0
        and TRACKED in wanted
        and importlib.util.find_spec("confluent_kafka") is None
    ):
        parser.error(
            "the latency run produces with confluent-kafka: pip install -e '.[bench]', "
            "or --latency-seconds 0"
        )

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from broker import kafka_version

    workdir = tempfile.mkdtemp(prefix="ackstream-e2e-")
    broker, warm_worker, failed = None, None, True
    try:
        broker, bootstrap = own_broker(args, log)
        started = time.time()
        largest = max(sizes) * (args.batches + args.warmup_batches)
        ctx = types.SimpleNamespace(
            bootstrap=bootstrap,
            run=uuid.uuid4().hex[:6],  # topics and groups of this run (a shared broker)
            partitions=args.partitions,
            trigger_ms=args.trigger_ms,
            window_seconds=args.window_seconds,
            warmup_batches=args.warmup_batches,
            ackstream_options=ackstream_options(args.ackstream_option, parser),
            workdir=workdir,
            startup_timeout_s=300,
            timeout_s=args.timeout_s or max(300.0, largest / 300),
        )
        timed_sizes = sizes if args.repeats else []
        kinds = sorted({INPUT_KIND.get(s, "plain") for s in systems})
        inputs = {
            (size, kind): make_input(
                ctx, f"in-{size}-{kind}", size, args.warmup_batches, args.batches, kind
            )
            for size in (sizes if timed_sizes or cold_systems else ())
            for kind in kinds
        }

        def input_of(system: str, size: int) -> Input:
            return inputs[(size, INPUT_KIND.get(system, "plain"))]

        cold = {}
        for system in cold_systems:  # before the warm worker's JVM exists
            log(f"cold: {system}")
            cold[system] = run_fresh(system, input_of(system, sizes[0]), ctx, "cold", cold=True)

        if any(s in SPARK_SYSTEMS for s in systems):
            warm_worker = Worker(os.path.join(workdir, "spark-worker.log"))

        def run_warm(system: str, inp: Input, tag: str) -> dict:
            """``system`` in the shared Spark worker (a fresh process for the others).
            A Spark system that stalls there (Spark's stream-stream join has stopped
            committing once, its stream thread dead) gets a new shared worker, warmed
            by one dropped run of the same system, and is run again; the stall is kept
            with the result, and the systems after it run in the new worker."""
            nonlocal warm_worker
            if system not in SPARK_SYSTEMS:
                return run_fresh(system, inp, ctx, tag)
            try:
                return run_system(warm_worker, system, inp, ctx, tag)
            except Stalled as stall:
                log(f"{system}: stalled ({stall}); a new Spark worker, warmed, runs it again")
                warm_worker.close()
                warm_worker = Worker(os.path.join(workdir, f"spark-worker-{tag}.log"))
                run_system(warm_worker, system, inp, ctx, f"{tag}-rewarm")
                result = run_system(warm_worker, system, inp, ctx, f"{tag}-again")
                return {**result, "stalled_runs": [str(stall)]}

        runs: dict[int, dict[str, list[dict]]] = {}
        warmup_runs: dict[int, dict[str, float]] = {}
        for size in timed_sizes:
            runs[size] = {s: [] for s in systems}
            warmup_runs[size] = {}
            if not args.no_warmup_round and warm_worker is not None:
                for system in [s for s in systems if s in SPARK_SYSTEMS]:
                    log(f"{size:,} per batch, warm-up round (dropped): {system}")
                    result = run_warm(system, input_of(system, size), f"b{size}-warmup")
                    warmup_runs[size][system] = result["records_per_s"]
            for repeat in range(args.repeats):
                order = systems if repeat % 2 == 0 else systems[::-1]
                for position, system in enumerate(order):
                    log(f"{size:,} per batch, run {repeat + 1}/{args.repeats}: {system}")
                    result = run_warm(system, input_of(system, size), f"b{size}-r{repeat}")
                    runs[size][system].append({**result, "repeat": repeat, "position": position})
        latency = None
        if args.latency_seconds > 0 and warm_worker is not None and TRACKED in systems:
            rate = args.latency_rate or (
                statistics.median(r["records_per_s"] for r in runs[sizes[0]][TRACKED]) / 2
            )
            latency = latency_run(
                warm_worker, ctx, rate, args.latency_seconds, args.latency_lead_s, sizes[0]
            )
        out = {
            "benchmark": "e2e",
            "date": dt.datetime.now(dt.UTC).isoformat(),
            "machine": machine(kafka_version() if broker else None),
            "config": {
                **run_config(args, sizes),
                "trigger_ms": args.trigger_ms,
                "window_seconds": args.window_seconds,
                "vocabulary": len(vocabulary()),
                "event_time": "a batch's records span one window (2 s)",
                "message_timeout_ms": MESSAGE_TIMEOUT_MS,
                "latency_seconds": args.latency_seconds,
                "latency_lead_s": args.latency_lead_s,
                "ackstream_options": ctx.ackstream_options,
                "systems": systems,
                "skipped": skipped,
                "broker": "external" if args.bootstrap else "Apache Kafka, one KRaft node",
                "timing": (
                    "a run: from the first commit of its group covering the warm-up batches "
                    "to the one covering every input offset (a poller asks the broker every "
                    "50 ms); records_per_s: the records committed in between over that time; "
                    "cpu: the worker's process tree over the same span; the Spark systems "
                    "share one warm worker process, the others run in a fresh one each"
                ),
            },
            "sizes": {
                size: {
                    **inputs[(size, kinds[0] if "plain" not in kinds else "plain")].figures(),
                    "inputs": {kind: inputs[(size, kind)].figures() for kind in kinds},
                    "input_of": {s: INPUT_KIND.get(s, "plain") for s in systems},
                    "systems": {s: summarize(r) for s, r in runs[size].items()},
                }
                for size in timed_sizes
            },
            "warmup_round_records_per_s": warmup_runs,
            "cold": cold,
            "latency": latency,
            "targets": ratios(runs, latency),
            "loadavg_end": loadavg(),
            "wall_s": time.time() - started,
        }
        failed = False
    finally:
        if warm_worker is not None:
            warm_worker.close()
        stop_and_tidy(broker, workdir, failed, log, "logs")
    print_tables(out)
    if not args.no_save:
        log(f"written to {save(out, args.output, 'e2e')}")
    return out


def run_config(args: argparse.Namespace, sizes: list[int]) -> dict:
    """The figures' record of how a run was asked for that e2e.py and failure_path.py
    share: its batch sizes, batches, warm-up, partitions and repeats."""
    return {
        "batch_sizes": sizes,
        "batches": args.batches,
        "warmup_batches": args.warmup_batches,
        "warmup_round": not args.no_warmup_round,
        "partitions": args.partitions,
        "repeats": args.repeats,
    }


def own_broker(args: argparse.Namespace, log) -> tuple[object | None, str]:
    """The run's brokers: ``--bootstrap``'s, or Apache Kafka started on loopback for it
    (then returned, for :func:`stop_and_tidy`); and their address."""
    if args.bootstrap:
        return None, args.bootstrap
    from broker import KafkaBroker

    log("starting Apache Kafka on loopback")
    broker = KafkaBroker().start()
    return broker, broker.bootstrap


def stop_and_tidy(broker, workdir: str, failed: bool, log, kept: str) -> None:
    """Stop the run's own broker (none: external ones) and remove its working directory,
    or keep that after a failure and say so (``kept``: what it holds)."""
    if broker is not None:
        broker.stop()
    if failed:
        log(f"{kept} kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


def save(out: dict, output: str | None, name: str) -> str:
    """Write a run's figures to ``output``, or to ``results/<name>-<date>.json`` (never
    over an earlier run's file)."""
    path = output or unused(os.path.join(RESULTS, f"{name}-{dt.date.today()}.json"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(json.dumps(out, indent=1) + "\n")
    return path


def unused(path: str) -> str:
    """``path``, or ``path`` with -2, -3... before its extension when it exists."""
    stem, ext = os.path.splitext(path)
    n = 1
    while os.path.exists(path):
        n += 1
        path = f"{stem}-{n}{ext}"
    return path


if __name__ == "__main__":
    # a SIGTERM (timeout, kill) ends the run through main's finally blocks, so that
    # the broker and the workers it started are stopped, not left behind
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
