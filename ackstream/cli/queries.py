"""The Spark queries of a long-running command (``run``, ``acker``): the session it
makes, the wait for its queries with a progress line every few seconds, one line per
query that failed, and the stop."""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ackstream.cli.console import LogFile
from ackstream.cli.exits import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, status_of
from ackstream.errors import cause_of
from ackstream.sources import launch
from ackstream.spark.driver import interrupts
from ackstream.topology.running import stop_queries
from ackstream.ui.status import source_metrics

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = [
    "Progress",
    "local_session",
    "progress_of",
    "rows_read",
    "stop",
    "stopping",
    "supervise",
    "wait",
]

log = logging.getLogger(__name__)


def local_session(
    args: argparse.Namespace, app_name: str, log_file: LogFile, conf: dict[str, str] | None = None
) -> SparkSession:
    """The command's Spark session (``--cores``, ``--master``, ``--remote``, ``conf``);
    a JVM launched for it writes its log to ``log_file``."""
    with log_file.launching():
        return launch.local_session(
            app_name, cores=args.cores, conf=conf, master=args.master, remote=args.remote
        )


class Progress:
    """The command's progress lines on stderr, each ``[  12.3s] ...``: the seconds since
    the command began, then what is going on."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.start:6.1f}s] {text}", file=sys.stderr, flush=True)


def supervise(
    queries: Sequence[StreamingQuery],
    timeout: float | None,
    until_idle: float | None,
    log_file: LogFile,
    progress: Progress | None = None,
) -> int:
    """Wait for the queries as :func:`wait` does, Ctrl-C included; a line for each
    failed query; the exit status."""
    with interrupts() as pressed:
        code = wait(queries, timeout, until_idle, pressed, progress=progress)
    return _failures(queries, log_file) if code == EXIT_FAILED else code


def stopping(code: int, log_file: LogFile) -> None:
    """Say so when Ctrl-C stops the command (each query first ends its batch in progress)."""
    if code == EXIT_INTERRUPTED:
        print(f"ackstream: interrupted, stopping the queries{log_file.named()}", file=sys.stderr)


def wait(
    queries: Sequence[StreamingQuery],
    timeout: float | None,
    until_idle: float | None,
    pressed: threading.Event,
    every_s: float = 5.0,
    progress: Progress | None = None,
) -> int:
    """Poll until every query ended (0), or one failed (1 at once: its peers would run
    on without it), or the timeout passed, or the queries have read rows and then none
    for ``until_idle`` seconds (0), or the event ``pressed`` is set (130: Ctrl-C, see
    :func:`~ackstream.spark.driver.interrupts`). Prints each query's progress
    (:func:`progress_of`) every ``every_s``, the first time at once."""
    progress = progress or Progress()
    start, printed = time.monotonic(), float("-inf")
    last_active: float | None = None
    seen: dict[str, int | None] = {}  # per query id, the batch id of its last progress
    counted: dict[str, str | None] = {}  # ... and that progress's time: counted once
    rows: dict[str, int] = {}
    while any(q.isActive for q in queries):
        if pressed.is_set():
            return EXIT_INTERRUPTED
        now = time.monotonic()
        if any(not q.isActive and q.exception() is not None for q in queries):
            return EXIT_FAILED
        for q in queries:
            last = q.lastProgress
            if last:
                before = rows.get(q.id, 0)
                rows[q.id] = rows_read(last, before, counted.get(q.id) == last.get("timestamp"))
                if rows[q.id] > before:
                    last_active = now
                seen[q.id], counted[q.id] = last.get("batchId"), last.get("timestamp")
        if now - printed >= every_s:
            printed = now
            progress.say(
                "; ".join(
                    progress_of(q.name, seen.get(q.id), rows.get(q.id, 0), q.lastProgress)
                    for q in queries
                )
            )
        if timeout is not None and now - start >= timeout:
            print(
                f"ackstream: --timeout {timeout:g}s reached, stopping the queries", file=sys.stderr
            )
            return EXIT_OK
        if until_idle is not None and last_active is not None and now - last_active >= until_idle:
            print(
                f"ackstream: no rows read for {until_idle:g}s, stopping the queries",
                file=sys.stderr,
            )
            return EXIT_OK
        pressed.wait(0.2)
    return EXIT_FAILED if any(q.exception() is not None for q in queries) else EXIT_OK


def progress_of(name: str, batch: int | None, rows: int, progress: dict[str, Any] | None) -> str:
    """One query's part of a progress line: before its first batch, that Spark is
    starting it; then its batch, the rows read and, for a topology whose source reports
    them, its roots acked, replayed and dead-lettered since its checkpoint began.

    >>> progress_of("words", None, 0, None)
    'words: Spark is starting (no batch yet)'
    >>> progress_of("words", 4, 120, {"sources": [{"latestOffset": '{"pending": 2, '
    ...     '"partitions": {}, "acked": 110, "replayed": 3, "dead_lettered": 1}'}]})
    'words: batch 4, 120 rows read, 110 acked, 3 replayed, 1 dead-lettered, 2 pending'
    """
    if batch is None:
        return f"{name}: Spark is starting (no batch yet)"
    line = f"{name}: batch {batch}, {rows} rows read"
    metrics = source_metrics(progress)
    if metrics:
        line += "".join(
            f", {metrics.get(key, 0)} {said}"
            for key, said in (
                ("acked", "acked"),
                ("replayed", "replayed"),
                ("dead_lettered", "dead-lettered"),
                ("pending", "pending"),
            )
        )
        if metrics.get("waiting"):  # replays waiting for their backoff
            line += f", {metrics['waiting']} waiting to replay"
    return line


def rows_read(progress: dict[str, Any], before: int, counted: bool) -> int:
    """The rows a query has read as of ``progress``, its last ``StreamingQueryProgress``,
    given ``before``, its count as of the one before, and whether ``progress`` was
    ``counted`` already. An ``ackstream`` source's own count when it reports one (the
    records of the batches it planned since it started: Spark's ``numInputRows`` leaves
    out what its Kafka connector reads for it); else ``numInputRows`` added once per
    progress, idle triggers' included (Spark reports those under the id of the batch
    that comes next, so counting a batch id once would miss that batch).

    >>> rows_read({"numInputRows": 0, "sources": [{"latestOffset": '{"pending": 0, '
    ...     '"partitions": {}, "read": 22}'}]}, 0, False)
    22
    >>> rows_read({"numInputRows": 5, "sources": []}, 10, False)
    15
    >>> rows_read({"numInputRows": 5, "sources": []}, 15, True)
    15
    """
    metrics = source_metrics(progress)
    if metrics is not None and "read" in metrics:
        return int(metrics["read"])
    return before if counted else before + int(progress.get("numInputRows", 0))


def _failures(queries: Sequence[StreamingQuery], log_file: LogFile) -> int:
    """One line per failed query, saying why (its full error goes to ``log_file``); the
    exit status: 3 if every cause is the environment, else 1."""
    codes = []
    for q in queries:
        if q.exception() is not None:
            error = str(q.exception())
            log.error("query %s failed:\n%s", q.name, error)
            cause = cause_of(error)
            print(f"ackstream: query {q.name} failed: {cause}{log_file.named()}", file=sys.stderr)
            codes.append(status_of(cause))
    return min(codes, default=EXIT_FAILED)


def stop(queries: Sequence[StreamingQuery]) -> None:
    """Stop the queries, each topology query before its acker."""
    stop_queries(queries)
