"""A sink that does not answer: the batch waits for it, charging no record.

A sink whose brokers time out or cannot be reached raises
:class:`~ackstream.errors.Unreachable`. That is the environment's fault, not the rows',
and Storm's and Kafka Connect's users expect such an outage to pause the topology, not
to fail, replay and dead-letter its records. So the batch waits: it sleeps, 1 s at first
and twice as long each time up to 30 s (:data:`FIRST_WAIT_S`, :data:`MAX_WAIT_S`),
asks the sink's probe (``Unreachable.answers``, e.g. a metadata request) after each
sleep, and once it answers writes the batch again; an outage seen again by that write
goes on waiting. Meanwhile:

- no new batch starts (Spark runs one batch of a query at a time) and no record of the
  batch is charged: its roots' timeouts start once the batch commits;
- the batch's deadline is held (:meth:`~ackstream.topology.batch_failure.BatchDeadline.held`):
  ``batch_deadline_ms`` counts the time the batch ran, not the time it waited, nor that
  of the writes that found the sink unreachable (each bounded by the sink, e.g. by
  ``KafkaSink``'s ``flush_timeout_s``; a deadline that passes during one still cancels
  it: keep the deadline well above such a write);
- the wait says so: one line when it begins and one when it ends, on stderr and in
  the log, and while it lasts the file
  :data:`~ackstream.topology.described.PAUSED_FILE` in the topology query's
  checkpoint folder, which the run's status reads
  (:func:`~ackstream.topology.described.read_run`).

The wait has no bound of its own: it ends when the sink answers, or when the topology
stops (``stop()`` ends it; the batch is then not committed, and its records replay
when the topology starts again), or when the probe finds the sink's topic gone
(:class:`~ackstream.errors.EnvironmentProblem`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from ackstream.errors import AckstreamError, Unreachable
from ackstream.topology.batch_failure import BatchDeadline, current_deadline
from ackstream.topology.described import PAUSED_FILE
from ackstream.vocabulary.clock import now_ms

__all__ = ["FIRST_WAIT_S", "MAX_WAIT_S", "StoppedWaiting", "written_through"]

log = logging.getLogger(__name__)

#: The first wait for an unreachable sink, doubled after each probe it does not answer...
FIRST_WAIT_S = 1.0
#: ... up to this.
MAX_WAIT_S = 30.0

T = TypeVar("T")


class StoppedWaiting(AckstreamError):
    """The topology stopped while a batch waited for its sink: the batch is not
    committed, and its records replay when the topology starts again."""


def written_through(write: Callable[[], T], topology: str, batch_id: int) -> T:
    """``write()``, again each time it raises :class:`Unreachable` once the sink's
    probe answers (see the module doc); its result."""
    waiting: _Waiting | None = None
    try:
        while True:
            began = time.monotonic()
            try:
                result = write()
            except Unreachable as outage:
                deadline = current_deadline()
                if deadline is not None:  # the time the write waited for the sink
                    deadline.credit(time.monotonic() - began)
                if waiting is None:
                    waiting = _Waiting(topology, batch_id, outage, deadline)
                waiting.until_answered(outage)
                continue
            if waiting is not None:
                waiting.ended()
            return result
    finally:
        if waiting is not None:
            waiting.forget()


class _Waiting:
    """One batch's wait for its sink: when it began, the next sleep, and where it is said."""

    def __init__(
        self, topology: str, batch_id: int, outage: Unreachable, deadline: BatchDeadline | None
    ):
        self.topology, self.batch_id, self.deadline = topology, batch_id, deadline
        self.what = outage.what
        self.since_ms, self.began = now_ms(), time.monotonic()
        self.wait_s = FIRST_WAIT_S
        folder = None if deadline is None else deadline.folder
        self.path = None if folder is None else os.path.join(folder, PAUSED_FILE)
        _say(
            f"topology {topology}: sink {self.what} unreachable since "
            f"{_utc(self.since_ms)}: {outage.error}; batch {batch_id} waits (no record is "
            f"charged), retrying every {FIRST_WAIT_S:g} s doubling to {MAX_WAIT_S:g} s"
        )

    def until_answered(self, outage: Unreachable) -> None:
        """Sleep, then probe, until the probe answers (the deadline held meanwhile)."""
        held = self.deadline.held() if self.deadline is not None else contextlib.nullcontext()
        with held:
            while True:  # each sleep twice the last: also after a write that failed again
                self._record(outage.error)
                self._sleep(self.wait_s)
                self.wait_s = min(MAX_WAIT_S, self.wait_s * 2)
                if outage.answers():
                    log.info("topology %s: %s answers; writing again", self.topology, self.what)
                    return

    def ended(self) -> None:
        _say(
            f"topology {self.topology}: sink {self.what} reachable again after "
            f"{time.monotonic() - self.began:.0f} s; batch {self.batch_id} written"
        )

    def forget(self) -> None:
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)

    def _sleep(self, seconds: float) -> None:
        """Sleep ``seconds``; raise :class:`StoppedWaiting` as soon as the topology stops
        (its ``stop()`` cancels the batch; under Spark Connect, where that does not reach
        this process, once its query is seen stopped, after each sleep)."""
        stopped = self.deadline is not None and (
            self.deadline.stopped.wait(seconds) or not _active(self.deadline, self.topology)
        )
        if self.deadline is None:
            time.sleep(seconds)
        if stopped:
            raise StoppedWaiting(
                f"topology {self.topology} stopped while batch {self.batch_id} waited for "
                f"sink {self.what}: the batch was not committed, its records replay at "
                "the next start"
            )

    def _record(self, error: str) -> None:
        if self.path is None:
            return
        said = {"sink": self.what, "since_ms": self.since_ms, "error": error[:500]}
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            hidden = self.path + ".tmp"
            with open(hidden, "w") as f:
                json.dump({**said, "retry_s": self.wait_s}, f)
            os.replace(hidden, self.path)
        except OSError as problem:  # a full disk must not end the wait
            log.warning("could not write %s: %s", self.path, problem)


def _active(deadline: BatchDeadline, name: str) -> bool:
    """Whether the query ``name`` still runs, as far as the batch's session can tell:
    True unless it lists the query stopped (a stream's clone of the session lists no
    query; the stop's cancellation ends the wait there)."""
    try:
        listed = [q for q in deadline.spark.streams.active if q.name == name]
        return not listed or any(q.isActive for q in listed)
    except Exception:  # a session that cannot say
        return True


def _say(line: str) -> None:
    """A line for the console (``ackstream run``'s, a notebook's) and the log."""
    log.warning(line)
    print(f"ackstream: {line}", file=sys.stderr, flush=True)


def _utc(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))
