"""A micro-batch that fails as a whole, and the deadline that ends a hung one.

Most failures are a row's: a bolt raises or returns what does not fit, and only that
row's roots fail (:mod:`ackstream.topology.bolts`). Some fail the batch's Spark jobs
instead: a SQL or DataFrame stage raising at run time (a cast, ``raise_error``), a
Python worker dying on one record, or a stage that hangs. Storm's answer to a bolt
that never acks is the message timeout; here a batch running past the topology's
``batch_deadline_ms`` has its Spark jobs cancelled. Either way the batch's roots
complete as ``batch_failed``: the source replays them in smaller batches of their
own until the record at fault fails alone (:mod:`ackstream.sources.isolation`), so
one poison record costs that record, not the topology.

Errors that no record causes stop the query as before: ackstream's own errors
(options, a stage that loses its lineage), Spark's analysis errors (a SQL stage
naming a column that does not exist fails every batch alike), and a cancellation
that is not the deadline's (the query is being stopped).

A sink that does not answer is neither: the batch waits for it
(:mod:`ackstream.topology.outage`), and the deadline is held meanwhile, so that
``batch_deadline_ms`` counts the time the batch ran, not the time it waited.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.errors import AnalysisException

from ackstream.errors import AckstreamError, cause_of, worker_exit
from ackstream.spark.session import is_connect
from ackstream.vocabulary.records import BATCH_FAILED, completions_of

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "BatchDeadline",
    "batch_failed_completions",
    "cancel_batches",
    "current_deadline",
    "failure_reason",
    "isolates",
    "job_tag",
]

log = logging.getLogger(__name__)

#: Words of Spark's error when a job it ran was cancelled.
_CANCELLED = ("cancelled", "canceled", "interrupted")

#: The deadline of the batch each thread runs, and the deadlines entered, by tag.
_current = threading.local()
_entered: dict[str, BatchDeadline] = {}


def job_tag(topology_name: str) -> str:
    """The Spark job tag of a topology's batches (a tag may hold no comma; a topology
    name holds letters, digits, '.', '_' and '-' only)."""
    return f"ackstream-batch-{topology_name}"


class BatchDeadline:
    """Within ``with``: the Spark jobs the calling thread runs carry ``tag``; once
    ``deadline_ms`` passes they are cancelled and :attr:`passed` is set. No deadline
    (None): only the tag, so that :func:`cancel_batches` can still end them.

    While :meth:`held` (the batch waits for a sink that does not answer) the deadline
    does not run down, nor for the time :meth:`credit` gives back (the writes that found
    the sink unreachable). ``folder``: where the batch says it waits (the topology query's
    checkpoint folder; see :mod:`ackstream.topology.outage`); :attr:`stopped` is set
    when :func:`cancel_batches` ends the batch (the topology stops)."""

    def __init__(
        self, spark: SparkSession, tag: str, deadline_ms: int | None, folder: str | None = None
    ):
        self.spark, self.tag, self.deadline_ms, self.folder = spark, tag, deadline_ms, folder
        self.passed = False
        self.stopped = threading.Event()
        self._done = threading.Event()
        self._timer: threading.Thread | None = None
        self._held_s = 0.0  # the time held so far
        self._held_since: float | None = None
        self._started = time.monotonic()

    def __enter__(self) -> BatchDeadline:
        _tags(self.spark).add(self.tag)
        _current.deadline = _entered[self.tag] = self
        self._started = time.monotonic()
        if self.deadline_ms is not None:
            self._timer = threading.Thread(target=self._watch, daemon=True)
            self._timer.start()
        return self

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Within: the time does not count against the deadline."""
        self._held_since = time.monotonic()
        try:
            yield
        finally:
            self._held_s += time.monotonic() - self._held_since
            self._held_since = None

    def credit(self, seconds: float) -> None:
        """``seconds`` the batch spent do not count against the deadline (a write that
        found its sink unreachable), unless it has passed already."""
        self._held_s += seconds

    def _left_s(self) -> float:
        """The deadline's seconds left (the time held not counted); none pass while held."""
        now, since = time.monotonic(), self._held_since
        held = self._held_s + (0.0 if since is None else now - since)
        return (self.deadline_ms or 0) / 1000 - (now - self._started - held)

    def _watch(self) -> None:
        """At the deadline, cancel the batch's jobs; then again each second until the
        batch ends, so that no later job of the batch (one that reads the same hung
        stage again) outlives it."""
        while True:
            held, left = self._held_since is not None, self._left_s()
            if not held and left <= 0:
                break
            if self._done.wait(1.0 if held else left):
                return
        self.passed = True
        log.warning(
            "batch deadline of %d ms passed: cancelling the jobs of %s", self.deadline_ms, self.tag
        )
        while True:
            try:
                _tags(self.spark).cancel(self.tag)
            except Exception:  # the batch may have ended meanwhile: nothing to cancel
                log.debug("cancelling the jobs of %s failed", self.tag, exc_info=True)
            if self._done.wait(1.0):
                return

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        _current.deadline = None
        if _entered.get(self.tag) is self:
            del _entered[self.tag]
        _tags(self.spark).remove(self.tag)


def current_deadline() -> BatchDeadline | None:
    """The deadline of the batch the calling thread runs, if it runs one."""
    return getattr(_current, "deadline", None)


def cancel_batches(spark: SparkSession, tag: str) -> None:
    """Cancel the running Spark jobs that carry ``tag`` (a no-op when none does), and
    end the wait of a batch of theirs for a sink that does not answer."""
    entered = _entered.get(tag)
    if entered is not None:
        entered.stopped.set()
    _tags(spark).cancel(tag)


class _ContextTags:
    """Job tags of a classic session's SparkContext: they reach every session of the
    application, so a stream's own session (a clone of the user's) is tagged alike."""

    def __init__(self, spark: SparkSession):
        self.context = spark.sparkContext

    def add(self, tag: str) -> None:
        self.context.addJobTag(tag)

    def remove(self, tag: str) -> None:
        self.context.removeJobTag(tag)

    def cancel(self, tag: str) -> None:
        self.context.cancelJobsWithTag(tag)


class _SessionTags:
    """Operation tags of a Spark Connect session (it has no SparkContext)."""

    def __init__(self, spark: SparkSession):
        self.spark = spark

    def add(self, tag: str) -> None:
        self.spark.addTag(tag)

    def remove(self, tag: str) -> None:
        self.spark.removeTag(tag)

    def cancel(self, tag: str) -> None:
        self.spark.interruptTag(tag)


def _tags(spark: SparkSession) -> _ContextTags | _SessionTags:
    return _SessionTags(spark) if is_connect(spark) else _ContextTags(spark)


def isolates(error: BaseException, deadline: BatchDeadline) -> bool:
    """Whether the batch's ``error`` may be one record's, so that its roots are failed
    and isolated, rather than the topology's, which stops the query (see module doc)."""
    if deadline.passed:
        return True
    if isinstance(error, (AckstreamError, AnalysisException)) or not isinstance(error, Exception):
        return False
    text = str(error)
    if any(f"{name}:" in text for name in ("StageError", "OptionError", "EnvironmentProblem")):
        return False  # ackstream's own error, raised in a task (a read task's, a bolt's)
    return not any(word in text.lower() for word in _CANCELLED)


def failure_reason(error: BaseException, deadline: BatchDeadline, stages: list[str]) -> str:
    """Why a batch failed, for its roots' completions (and a dead letter's reason)."""
    if deadline.passed:
        return (
            f"batch_deadline_ms={deadline.deadline_ms} passed in one of the stages "
            f"{', '.join(stages)}: its Spark jobs were cancelled"
        )
    exited = worker_exit(str(error))
    if exited is not None:  # py4j's first line would say only "error calling o1.getResult"
        where = ", ".join(repr(stage) for stage in stages)
        return f"a Python worker exited unexpectedly in one of the stages {where}" + (
            f": {exited}" if exited else " (Spark gives no exit code)"
        )
    return cause_of(str(error))


def batch_failed_completions(inits: pa.Table, reason: str, now_ms: int) -> pa.Table:
    """A ``batch_failed`` completion per root of ``inits`` (init records, one per root
    of the failed batch), with ``reason``."""
    return completions_of(inits, BATCH_FAILED, now_ms, reason)
