"""The Spark queries of a long-running command (``run``, ``acker``): the session it
makes, the wait for its queries with a progress line every few seconds, one line per
query that failed, and the stop."""

from __future__ import annotations

import logging
import sys
import time

from ackstream import launch
from ackstream.cli.exits import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, status_of
from ackstream.console import LogFile, interrupts
from ackstream.errors import cause_of
from ackstream.status import source_metrics
from ackstream.topology.running import stop_queries

__all__ = ["local_session", "stop", "stopping", "supervise", "wait"]

log = logging.getLogger(__name__)


def local_session(args, app_name: str, log_file: LogFile):
    """The command's Spark session (``--cores``, ``--master``, ``--remote``); a JVM
    launched for it writes its log to ``log_file``."""
    with log_file.launching():
        return launch.local_session(
            app_name, cores=args.cores, master=args.master, remote=args.remote
        )


def supervise(queries, timeout: float | None, until_idle: float | None, log_file: LogFile) -> int:
    """Wait for the queries as :func:`wait` does, Ctrl-C included; a line for each
    failed query; the exit status."""
    with interrupts() as pressed:
        code = wait(queries, timeout, until_idle, pressed)
    return _failures(queries, log_file) if code == EXIT_FAILED else code


def stopping(code: int, log_file: LogFile) -> None:
    """Say so when Ctrl-C stops the command (each query first ends its batch in progress)."""
    if code == EXIT_INTERRUPTED:
        print(f"ackstream: interrupted, stopping the queries{log_file.named()}", file=sys.stderr)


def wait(
    queries, timeout: float | None, until_idle: float | None, pressed, every_s: float = 5.0
) -> int:
    """Poll until every query ended (0), or one failed (1 at once: its peers would run
    on without it), or the timeout passed, or the queries have worked (read rows, or
    moved an ``ackstream`` source's counts or commits: see :func:`_work_of`) and then
    not for ``until_idle`` seconds (0), or the event ``pressed`` is set (130: Ctrl-C, see
    :func:`~ackstream.console.interrupts`). Prints each query's progress every
    ``every_s``."""
    start, last_active, printed = time.monotonic(), None, time.monotonic()
    seen: dict = {}
    rows: dict = {}
    work: dict = {}
    while any(q.isActive for q in queries):
        if pressed.is_set():
            return EXIT_INTERRUPTED
        now = time.monotonic()
        if any(not q.isActive and q.exception() is not None for q in queries):
            return EXIT_FAILED
        for q in queries:
            progress = q.lastProgress
            if progress and seen.get(q.id) != progress.get("batchId"):
                rows[q.id] = rows.get(q.id, 0) + progress.get("numInputRows", 0)
                moved = _work_of(progress)
                if progress.get("numInputRows", 0) > 0 or (q.id in work and moved != work[q.id]):
                    last_active = now
                seen[q.id], work[q.id] = progress.get("batchId"), moved
        if now - printed >= every_s:
            printed = now
            print(
                f"[{now - start:6.1f}s] "
                + "; ".join(
                    f"{q.name}: batch {seen.get(q.id, '-')}, {rows.get(q.id, 0)} rows read"
                    for q in queries
                ),
                file=sys.stderr,
                flush=True,
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


def _work_of(progress) -> dict | None:
    """What moves in a query's progress when it works, besides ``numInputRows``: the
    ``ackstream`` source's outcome counts, roots in flight and committed offsets
    (Spark's count leaves out the records Spark's Kafka reader reads for that source).
    Not the partitions' end and lag, which move with the producers."""
    metrics = source_metrics(progress)
    if metrics is None:
        return None
    committed = {
        (topic, partition): part.get("committed")
        for topic, parts in metrics.get("partitions", {}).items()
        for partition, part in parts.items()
    }
    return {**{k: v for k, v in metrics.items() if k != "partitions"}, "committed": committed}


def _failures(queries, log_file: LogFile) -> int:
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


def stop(queries) -> None:
    """Stop the queries, each topology query before its acker."""
    stop_queries(queries)
