"""``ackstream run FILE``: run a topology file with a local Spark session, wait for its
queries, stop them cleanly on Ctrl-C, ``--timeout`` or ``--until-idle``."""

from __future__ import annotations

import argparse
import logging
import os
import runpy
import sys
import traceback

from pyspark.sql import SparkSession

from ackstream.cli.arguments import add_session_options, add_verbose, env_float
from ackstream.cli.exits import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, refused, status_of
from ackstream.cli.queries import local_session, stop, stopping, supervise
from ackstream.console import LogFile
from ackstream.errors import AckstreamError, cause_of
from ackstream.sources.datasource import register

__all__ = ["RUN_HELP", "add_arguments", "command"]

log = logging.getLogger(__name__)

RUN_HELP = """\
Run FILE as a script (as `python FILE` would, __name__ == "__main__") with a local
Spark session already made: the global `spark` holds it, and the `ackstream` source
is registered. The file declares its topology and starts it (Topology(...).start(...))
and may return at once. `run` then waits until every query the file started has
ended, or Ctrl-C, --timeout or --until-idle, and stops those queries (the topology
query first, then its acker). Exit status: 0, 1 if the file or a query failed,
3 if what failed is the environment (a broker that does not answer, a missing
topic), 130 on Ctrl-C, or the code of a sys.exit() in the file (its queries are
stopped first). With --until-idle, choose a time longer than the retry backoff
(ackstream.retryMaxDelay) if replays should finish before the stop.

The console shows progress and, when the run ends badly, one line saying why and
naming a log file (in the temporary folder) that holds Spark's log, Python's logging
and the full error; --verbose leaves all of that on the console instead.

A topology file, e.g. words.py:

    from pyspark.sql import functions as F
    from ackstream import LocalChannel, MemorySink, Topology

    topology = (Topology("words", spark, LocalChannel("/tmp/words/channel"))
                .explode(F.split(F.col("value").cast("string"), " "), "word")
                .sink(MemorySink()))
    frame = topology.read_stream({"ackstream.upstream": "generator"})
    topology.start(frame, "/tmp/words/checkpoint")
"""


def add_arguments(run: argparse.ArgumentParser) -> None:
    run.description = RUN_HELP
    run.set_defaults(subparser=run)  # errors name the subcommand
    run.add_argument("file", help="the topology file (a Python script)")
    run.add_argument(
        "--timeout",
        type=float,
        default=env_float("ACKSTREAM_RUN_TIMEOUT"),
        metavar="SECONDS",
        help="stop the queries after this long (env ACKSTREAM_RUN_TIMEOUT)",
    )
    run.add_argument(
        "--until-idle",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop the queries once they have read rows and then none for this long",
    )
    add_verbose(run)
    add_session_options(run)


def command(parser: argparse.ArgumentParser, args, extra: list[str]) -> int:
    """``ackstream run``; its errors name the subcommand."""
    return _run(args.subparser, args)


def _run(parser: argparse.ArgumentParser, args) -> int:
    for name in ("timeout", "until_idle"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be a positive number of seconds")
    if not os.path.isfile(args.file):
        parser.error(f"no topology file at {args.file}")
    log_file = LogFile("run", args.verbose)
    with log_file:
        code = _run_file(args, log_file)
    if code == EXIT_OK:
        log_file.discard()
    return code


def _run_file(args, log_file: LogFile) -> int:
    """Run the topology file, wait for its queries, stop them; the exit status."""
    spark, made = SparkSession.getActiveSession(), False
    if spark is None:
        try:
            spark = local_session(args, "ackstream-run", log_file)
            made = True
        except AckstreamError as problem:
            return refused(problem)
    register(spark)
    before = {q.id for q in spark.streams.active}
    started, code = [], EXIT_FAILED
    try:
        runpy.run_path(args.file, init_globals={"spark": spark}, run_name="__main__")
        started = [q for q in spark.streams.active if q.id not in before]
        code = supervise(started, args.timeout, args.until_idle, log_file)
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except SystemExit as ended:  # the file called sys.exit()
        code = ended.code if isinstance(ended.code, int) else (0 if ended.code is None else 1)
    except Exception as error:  # noqa: BLE001 - whatever the user's file raises is reported
        log.exception("%s failed", args.file)
        cause = cause_of("".join(traceback.format_exception(error)))
        print(f"ackstream: {args.file} failed: {cause}{log_file.named()}", file=sys.stderr)
        code = status_of(cause)
    finally:
        started = started or [q for q in spark.streams.active if q.id not in before]
        stopping(code, log_file)
        stop(started)
        if made:
            spark.stop()
    return code
