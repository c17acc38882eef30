"""The end-state checks of the broker-failure tests (tests/kafka/test_broker_failures.py),
over tests/fault_driver.py's topology: every input offset acked or dead-lettered (exactly
the poison), never both; every word written; no commit ahead of its completion (a
background poller of the group's commits). The chaos suite (tests/test_chaos.py) has its
own, seeded, version of these checks; the two should become one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from test_chaos import CommitRecorder as ChaosCommitRecorder

from ackstream.vocabulary.records import NOTICES

from helpers import consume, first_outcomes, sentences, wait_for

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


class CommitRecorder(ChaosCommitRecorder):
    """The chaos suite's commit poller on the fault topology's two partitions."""

    def __init__(self, bootstrap: str, group: str, topic: str):
        super().__init__(bootstrap, group, topic, partitions=2)


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

    rows, first_ack, letters, dead = first_outcomes(bootstrap, name)
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
            if r["status"] not in ("acked", *NOTICES) and (r["partition"], r["offset"]) != poison
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
