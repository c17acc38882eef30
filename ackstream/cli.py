"""The ``ackstream`` command (also ``python -m ackstream``).

- ``ackstream demo``: the main job on the embedded default (no broker).
- ``ackstream run FILE``: run a topology file with a local Spark session, wait
  for its queries, stop them cleanly on Ctrl-C, ``--timeout`` or ``--until-idle``.
- ``ackstream status``: pending, acked, failed, replayed and dead-lettered roots,
  complete-latency percentiles, rates over a window, failures by stage and lag per
  partition, read from a topology's channels (``--json``, ``--prometheus``).
- ``ackstream dead-letters list|replay``: read a topology's dead letters, send
  chosen ones back to their source topic.
- ``ackstream acker``: a topology's acker query in a process of its own (the
  topology started with ``acker=False``), until stopped.
- ``ackstream bench [acker]``: the benchmark from the source checkout.

Options default to environment variables (shown in ``--help``). Errors are one line,
``ackstream: ...``, saying what failed and what to do. ``run`` and ``acker`` write
Spark's log, and the full text of an error, to a file the last line names (or to the
console with ``--verbose``).

Exit status (:data:`EXIT_STATUS`): 0 done; 1 a query or the topology file failed;
2 a usage error (an option, a file or folder named on the command line); 3 an
environment problem (Java, a broker that does not answer, a missing topic); 130
interrupted (Ctrl-C); ``bench`` exits as its benchmark does, ``run`` as the file's
own ``sys.exit()``.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ackstream.console import LogFile, interrupts
from ackstream.errors import AckstreamError, EnvironmentProblem, cause_of

if TYPE_CHECKING:  # names for annotations only: a command imports what it runs
    from ackstream.channels.base import Channel
    from ackstream.sinks.replay_log import ReplayLog

__all__ = ["EXIT_STATUS", "build_parser", "main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_ENVIRONMENT, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
#: What each exit status of the command means (also in ``ackstream --help``).
EXIT_STATUS = {
    EXIT_OK: "done",
    EXIT_FAILED: "a query or the topology file failed",
    EXIT_USAGE: "a usage error: an option, or a file or folder named on the command line",
    EXIT_ENVIRONMENT: "an environment problem: Java, a broker that does not answer, a topic",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def _env_float(name: str) -> float | None:
    value = os.environ.get(name)
    return float(value) if value else None


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown in --help, descriptions kept as written."""


class _Parser(argparse.ArgumentParser):
    """argparse that answers a mistyped command or choice with the one meant."""

    def error(self, message: str):
        typed = re.search(r"invalid choice: (['\"])(.*?)\1", message)
        choices = [c for a in self._actions if a.choices for c in a.choices]
        meant = difflib.get_close_matches(typed.group(2), choices, n=1) if typed else []
        if meant:
            self.exit(EXIT_USAGE, f"{self.prog}: error: {message}; did you mean {meant[0]!r}?\n")
        super().error(message)


def _checkout_benchmarks() -> Path:
    import ackstream

    return Path(ackstream.__file__).resolve().parents[1] / "benchmarks"


def build_parser() -> argparse.ArgumentParser:
    from ackstream import __version__

    parser = _Parser(
        prog="ackstream",
        description="Storm's guaranteed message processing for Spark Structured Streaming.",
        epilog="exit status:\n"
        + "\n".join(f"  {code:<5}{meaning}" for code, meaning in EXIT_STATUS.items()),
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="version", version=f"ackstream {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="run a word-split topology on the embedded default (no broker needed): "
        "generator upstream, local channel, injected failures, a summary at the end",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    demo.add_argument(
        "--records",
        type=int,
        default=_env_int("ACKSTREAM_DEMO_RECORDS", 2000),
        help="generated upstream records (env ACKSTREAM_DEMO_RECORDS)",
    )
    demo.add_argument(
        "--fail-percent",
        type=int,
        default=3,
        help="percent of word tuples a bolt fails on their first attempt",
    )
    demo.add_argument(
        "--poison-every",
        type=int,
        default=500,
        help="every N-th record always fails and is dead-lettered",
    )
    demo.add_argument("--max-retries", type=int, default=2, help="replays before a dead letter")
    demo.add_argument(
        "--max-per-batch",
        type=int,
        default=250,
        help="new records per micro-batch (maxOffsetsPerTrigger): the first batch is cold, "
        "the later ones show the warm latency",
    )
    demo.add_argument(
        "--message-timeout-ms",
        type=int,
        default=10_000,
        help="Storm's topology.message.timeout, in ms",
    )
    _add_run(commands)
    _add_status(commands)
    _add_dead_letters(commands)
    _add_acker(commands)
    _add_bench(commands)
    return parser


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


def _add_run(commands) -> None:
    run = commands.add_parser(
        "run",
        help="run a topology file with a local Spark session",
        description=RUN_HELP,
        formatter_class=_Formatter,
    )
    run.set_defaults(subparser=run)  # errors name the subcommand
    run.add_argument("file", help="the topology file (a Python script)")
    run.add_argument(
        "--timeout",
        type=float,
        default=_env_float("ACKSTREAM_RUN_TIMEOUT"),
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
    _add_verbose(run)
    _add_session_options(run)


def _add_verbose(command) -> None:
    command.add_argument(
        "--verbose",
        action="store_true",
        help="Spark's log, Python's logging and full errors on the console, not in a log file",
    )


def _add_status(commands) -> None:
    status = commands.add_parser(
        "status",
        help="what became of a topology's roots, from its channels",
        description="Counts roots (one per attempt; a replay is a new root) by outcome, from\n"
        "the ack and completion channels: pending (init record seen, no completion\n"
        "yet), acked, failed, timed out, replayed (failed or timed out and not\n"
        "dead-lettered), dead-lettered, and the complete latency of acked roots\n"
        "(p50/p90/p99); acked, replayed and dead-lettered a second over --window;\n"
        "failed roots by the stage their reason names; and per partition the end,\n"
        "committed offset and lag: as the source last saved them (local channel) or\n"
        "of the source's consumer group (--bootstrap). Reads files or topics only:\n"
        "no Spark session.",
        formatter_class=_Formatter,
    )
    status.set_defaults(subparser=status)  # errors name the subcommand
    _add_channel_options(status)
    _add_dead_letter_options(status)
    status.add_argument(
        "--window", type=float, default=60.0, metavar="SECONDS", help="the rates' window"
    )
    status.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="the topology's checkpoint (as given to Topology.start): adds the tuples "
        "each stage and sink read and emitted, and the tuples and roots its window "
        "stages hold",
    )
    status.add_argument(
        "--group",
        metavar="GROUP",
        help="with --bootstrap or --upstream-bootstrap: the source's kafka.group.id, for "
        "the lag (default ackstream-<topology>)",
    )
    status.add_argument(
        "--upstream-bootstrap",
        metavar="HOST:PORT",
        help="the brokers of the topics the source reads, where its group commits, when "
        "they are not the channel's (--bootstrap): the lag is read there (with a local "
        "channel too, instead of the figures the source saved)",
    )
    output = status.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print one JSON object")
    output.add_argument(
        "--prometheus",
        action="store_true",
        help="print Prometheus' text exposition format (counters for totals, gauges for "
        "levels), e.g. for a textfile collector",
    )


def _add_dead_letters(commands) -> None:
    dead = commands.add_parser(
        "dead-letters",
        help="list a topology's dead letters, or replay chosen ones to their topic",
        description="Reads the dead letters a topology wrote: from --dead-letters DIR (Parquet),\n"
        "else with --bootstrap from its dead-letter topic, else from\n"
        "<channel>/dead_letters. Reads files or topics only: no Spark session.",
        formatter_class=_Formatter,
    )
    actions = dead.add_subparsers(dest="action", required=True)
    for name, text in (
        ("list", "one line per dead letter: where from, attempts, reason"),
        (
            "replay",
            "send chosen dead letters back to their source topic and partition (key, value "
            "and headers as they were, plus an ackstream.replay_of header); prints what it "
            "would send unless --yes. The dead letters stay and are marked replayed "
            "(_replayed.jsonl in their folder, or the topic <dead-letter topic>.replayed): "
            "a second replay leaves them out unless --again",
        ),
    ):
        action = actions.add_parser(name, help=text, description=text, formatter_class=_Formatter)
        action.set_defaults(subparser=action)  # errors name the subcommand
        _add_channel_options(action)
        _add_dead_letter_options(action)
        action.add_argument(
            "--reason", default=None, help="only letters whose reason contains this text"
        )
        action.add_argument(
            "--record",
            action="append",
            default=[],
            metavar="TOPIC:PARTITION:OFFSET",
            help="only this record's letter (repeatable)",
        )
        action.add_argument("--limit", type=int, default=None, help="at most this many letters")
    actions.choices["replay"].add_argument(
        "--yes", action="store_true", help="send them (without it: only say what would be sent)"
    )
    actions.choices["replay"].add_argument(
        "--again", action="store_true", help="send letters that were replayed before too"
    )


def _add_dead_letter_options(command) -> None:
    """--dead-letters and --dead-letter-topic: where a topology's dead letters are."""
    command.add_argument(
        "--dead-letters",
        metavar="DIR",
        default=None,
        help="dead-letter Parquet folder (unset: <channel>/dead_letters with "
        "--channel, the dead-letter topic with --bootstrap)",
    )
    command.add_argument(
        "--dead-letter-topic",
        metavar="TOPIC",
        default=None,
        help="with --bootstrap: the ackstream.deadLetterTopic (unset: <topology>.dead)",
    )


def _add_channel_options(command) -> None:
    """--topology, --channel and --bootstrap: which ack and completion channels."""
    command.add_argument(
        "--topology",
        default=os.environ.get("ACKSTREAM_TOPOLOGY", "ackstream"),
        help="the topology's name, ackstream.topology (env ACKSTREAM_TOPOLOGY)",
    )
    command.add_argument(
        "--channel",
        metavar="DIR",
        default=os.environ.get("ACKSTREAM_CHANNEL"),
        help="the local channel directory, ackstream.channel (env "
        "ACKSTREAM_CHANNEL; unset: the topology's default directory)",
    )
    command.add_argument(
        "--bootstrap",
        metavar="HOST:PORT",
        default=os.environ.get("ACKSTREAM_BOOTSTRAP"),
        help="use the Kafka channel (<topology>.acks, <topology>.done) on "
        "this broker instead (env ACKSTREAM_BOOTSTRAP)",
    )
    command.add_argument(
        "--command-config",
        metavar="FILE",
        default=os.environ.get("ACKSTREAM_COMMAND_CONFIG"),
        help="with --bootstrap: a Kafka client properties file (security.protocol, "
        "ssl.*, sasl.jaas.config...), as Kafka's own tools take (env "
        "ACKSTREAM_COMMAND_CONFIG)",
    )


def _add_acker(commands) -> None:
    acker = commands.add_parser(
        "acker",
        help="run a topology's acker query in this process, until stopped",
        description="Runs the acker query of a topology started elsewhere with acker=False:\n"
        "ack records in from the channel, completions out to it. The pending\n"
        "roots live in the checkpoint: restarted with the same --checkpoint\n"
        "(after a crash, too), it resumes them. Stops on Ctrl-C or --timeout.",
        formatter_class=_Formatter,
    )
    acker.set_defaults(subparser=acker)
    _add_channel_options(acker)
    acker.add_argument(
        "--checkpoint",
        metavar="DIR",
        required=True,
        help="the acker query's checkpoint (keep it across restarts)",
    )
    acker.add_argument(
        "--ackers", type=int, default=2, help="shards; fixed for the life of the checkpoint"
    )
    acker.add_argument(
        "--message-timeout",
        default="30s",
        metavar="DURATION",
        help='Storm\'s topology.message.timeout ("30s", "2 min", ms)',
    )
    acker.add_argument("--trigger-ms", type=int, default=500, help="micro-batch interval")
    acker.add_argument(
        "--timeout", type=float, default=None, metavar="SECONDS", help="stop after this long"
    )
    _add_verbose(acker)
    _add_session_options(acker)


def _add_session_options(command) -> None:
    """Where the command's Spark session runs: local[N], a master, or a Connect server."""
    command.add_argument(
        "--cores",
        type=int,
        default=_env_int("ACKSTREAM_CORES", 2),
        help="local[N] cores when the command makes a local session (env ACKSTREAM_CORES)",
    )
    where = command.add_mutually_exclusive_group()
    where.add_argument(
        "--master",
        default=os.environ.get("ACKSTREAM_MASTER"),
        metavar="URL",
        help="Spark master instead of local[N], e.g. spark://host:7077 (env ACKSTREAM_MASTER); "
        "the executors must import ackstream: install it on every host, or set "
        "spark.submit.pyFiles in spark-defaults.conf",
    )
    where.add_argument(
        "--remote",
        default=os.environ.get("ACKSTREAM_REMOTE"),
        metavar="URL",
        help="a Spark Connect server instead of a session in this process, e.g. "
        "sc://host:15002 (env ACKSTREAM_REMOTE)",
    )


def _add_bench(commands) -> None:
    bench = commands.add_parser(
        "bench",
        help="run a benchmark from the source checkout",
        description="Runs benchmarks/<name>.py of the source checkout with this Python.\n"
        "Options bench does not know are passed on to the benchmark; name the\n"
        "benchmark before them (ackstream bench acker --records 100000) or write\n"
        "--records=100000. Benchmarks are not part of the installed package.",
        formatter_class=_Formatter,
    )
    bench.set_defaults(subparser=bench)  # errors name the subcommand
    bench.add_argument(
        "name", nargs="?", default="acker", choices=["acker"], help="which benchmark"
    )
    bench.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    bench.add_argument(
        "--benchmarks",
        metavar="DIR",
        default=os.environ.get("ACKSTREAM_BENCHMARKS", str(_checkout_benchmarks())),
        help="where the benchmark scripts are (env ACKSTREAM_BENCHMARKS)",
    )


def main(argv: list[str] | None = None) -> int:
    try:
        return _command(argv)
    except KeyboardInterrupt:  # a second Ctrl-C, or one before a command could take it
        return EXIT_INTERRUPTED


def _command(argv: list[str] | None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "bench":  # only bench passes options on
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "demo":
        for name in ("records", "poison_every", "message_timeout_ms", "max_per_batch"):
            if getattr(args, name) <= 0:
                parser.error(f"--{name.replace('_', '-')} must be a positive number")
        return _demo(args)
    if args.command == "run":
        return _run(args.subparser, args)
    if args.command == "status":
        return _status(args.subparser, args)
    if args.command == "dead-letters":
        return _dead_letters(args.subparser, args)
    if args.command == "acker":
        return _acker(args.subparser, args)
    if args.command == "bench":
        return _bench(args, extra)
    return EXIT_USAGE


def _demo(args) -> int:
    from ackstream.demo import run_demo
    from ackstream.launch import local_session

    if not 0 <= args.fail_percent <= 100 or args.max_retries < 0:
        print("ackstream: --fail-percent must be 0 to 100 and --max-retries >= 0", file=sys.stderr)
        return EXIT_USAGE
    try:
        spark = local_session("ackstream-demo")
    except AckstreamError as problem:
        return _refused(problem)
    try:
        s = run_demo(
            spark,
            records=args.records,
            fail_percent=args.fail_percent,
            poison_every=args.poison_every,
            max_retries=args.max_retries,
            message_timeout_ms=args.message_timeout_ms,
            max_per_batch=args.max_per_batch,
        )
    finally:
        spark.stop()
    warm = (
        "no later batch"
        if s.warm_p50_ms != s.warm_p50_ms  # NaN: every record was in the first batch
        else f"later batches p50 {s.warm_p50_ms:.0f} ms  p99 {s.warm_p99_ms:.0f} ms"
    )
    print(
        f"\nrecords {s.records} in {s.seconds:.1f}s: acked {s.acked}, dead-lettered "
        f"{s.dead_lettered}, replayed attempts {s.replayed}, committed {s.committed}, "
        f"lost {s.lost}\ncomplete latency: first batch {s.cold_batch_ms:.0f} ms (cold: "
        f"Spark start-up), {warm}\nnext: ackstream status --topology demo"
    )
    if not s.accounted_for:
        print("ackstream: not every record was accounted for", file=sys.stderr)
        return 1
    print("every record accounted for: acked or dead-lettered, committed, none lost")
    return 0


def _run(parser: argparse.ArgumentParser, args) -> int:
    for name in ("timeout", "until_idle"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be a positive number of seconds")
    if not os.path.isfile(args.file):
        parser.error(f"no topology file at {args.file}")
    log = LogFile("run", args.verbose)
    with log:
        code = _run_file(args, log)
    if code == EXIT_OK:
        log.discard()
    return code


def _run_file(args, log: LogFile) -> int:
    """Run the topology file, wait for its queries, stop them; the exit status."""
    import logging
    import runpy
    import traceback

    from pyspark.sql import SparkSession

    from ackstream.sources.datasource import register

    spark, made = SparkSession.getActiveSession(), False
    if spark is None:
        try:
            spark = _local_session(args, "ackstream-run", log)
            made = True
        except AckstreamError as problem:
            return _refused(problem)
    register(spark)
    before = {q.id for q in spark.streams.active}
    started, code = [], EXIT_FAILED
    try:
        runpy.run_path(args.file, init_globals={"spark": spark}, run_name="__main__")
        started = [q for q in spark.streams.active if q.id not in before]
        code = _supervise(started, args.timeout, args.until_idle, log)
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except SystemExit as stop:  # the file called sys.exit()
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except Exception as error:  # noqa: BLE001 - whatever the user's file raises is reported
        logging.getLogger(__name__).exception("%s failed", args.file)
        cause = cause_of("".join(traceback.format_exception(error)))
        print(f"ackstream: {args.file} failed: {cause}{log.named()}", file=sys.stderr)
        code = _status_of(cause)
    finally:
        started = started or [q for q in spark.streams.active if q.id not in before]
        _stopping(code, log)
        _stop(started)
        if made:
            spark.stop()
    return code


def _local_session(args, app_name: str, log: LogFile):
    """The command's Spark session (``--cores``, ``--master``, ``--remote``); a JVM
    launched for it writes its log to ``log``."""
    from ackstream.launch import local_session

    with log.launching():
        return local_session(app_name, cores=args.cores, master=args.master, remote=args.remote)


def _refused(problem: AckstreamError) -> int:
    """Print ackstream's error as the command's last line; its exit status."""
    print(f"ackstream: {problem}", file=sys.stderr)
    return EXIT_ENVIRONMENT if isinstance(problem, EnvironmentProblem) else EXIT_FAILED


def _status_of(cause: str) -> int:
    """The exit status of a failure whose :func:`~ackstream.errors.cause_of` is ``cause``."""
    return EXIT_ENVIRONMENT if cause.startswith(f"{EnvironmentProblem.__name__}: ") else EXIT_FAILED


def _supervise(queries, timeout: float | None, until_idle: float | None, log: LogFile) -> int:
    """Wait for the queries as :func:`_wait` does, Ctrl-C included; a line for each
    failed query; the exit status."""
    with interrupts() as pressed:
        code = _wait(queries, timeout, until_idle, pressed)
    return _failures(queries, log) if code == EXIT_FAILED else code


def _stopping(code: int, log: LogFile) -> None:
    """Say so when Ctrl-C stops the command (its queries may take a trigger to stop)."""
    if code == EXIT_INTERRUPTED:
        print(f"ackstream: interrupted, stopping the queries{log.named()}", file=sys.stderr)


def _wait(
    queries, timeout: float | None, until_idle: float | None, pressed, every_s: float = 5.0
) -> int:
    """Poll until every query ended (0), or one failed (1 at once: its peers would run
    on without it), or the timeout passed, or the queries have read rows and then none
    for ``until_idle`` seconds (0), or the event ``pressed`` is set (130: Ctrl-C, see
    :func:`~ackstream.console.interrupts`). Prints each query's progress every
    ``every_s``."""
    start, last_active, printed = time.monotonic(), None, time.monotonic()
    seen: dict = {}
    rows: dict = {}
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
                if progress.get("numInputRows", 0) > 0:
                    last_active = now
                seen[q.id] = progress.get("batchId")
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


def _failures(queries, log: LogFile) -> int:
    """One line per failed query, saying why (its full error goes to ``log``); the exit
    status: 3 if every cause is the environment, else 1."""
    import logging

    codes = []
    for q in queries:
        if q.exception() is not None:
            error = str(q.exception())
            logging.getLogger(__name__).error("query %s failed:\n%s", q.name, error)
            cause = cause_of(error)
            print(f"ackstream: query {q.name} failed: {cause}{log.named()}", file=sys.stderr)
            codes.append(_status_of(cause))
    return min(codes, default=EXIT_FAILED)


def _stop(queries) -> None:
    from ackstream.topology.running import stop_queries

    stop_queries(queries)


#: How long a one-shot command (status, dead-letters) waits for brokers that do not
#: answer before it says so; queries ride out outages for OUTAGE_LIMIT_S (120 s) instead.
ONE_SHOT_BOOTSTRAP_TIMEOUT_MS = 10_000


def command_kafka_options(
    parser: argparse.ArgumentParser, args, one_shot: bool = False
) -> dict[str, str]:
    """The ``kafka.*`` client options of ``--command-config`` (none without it); a file
    that is missing or holds a setting no Kafka client knows stops the command. A
    ``one_shot`` command gives up on silent brokers after
    :data:`ONE_SHOT_BOOTSTRAP_TIMEOUT_MS` unless the file sets ``bootstrap.timeout.ms``."""
    from ackstream.errors import OptionError
    from ackstream.kafka.settings import properties_file_options

    options = {"kafka.bootstrap.timeout.ms": str(ONE_SHOT_BOOTSTRAP_TIMEOUT_MS)} if one_shot else {}
    if not args.command_config:
        return options
    if not (args.bootstrap or getattr(args, "upstream_bootstrap", None)):
        parser.error("--command-config needs --bootstrap HOST:PORT (or ACKSTREAM_BOOTSTRAP)")
    try:
        return {**options, **properties_file_options(args.command_config)}
    except OptionError as problem:
        parser.error(str(problem))


def _acker(parser: argparse.ArgumentParser, args) -> int:
    from ackstream.config import parse_duration_ms

    if args.channel and args.bootstrap:
        parser.error("--channel and --bootstrap are both set: give one")
    if args.ackers < 1 or args.trigger_ms < 1:
        parser.error("--ackers and --trigger-ms must be positive")
    kafka_options = command_kafka_options(parser, args)
    try:
        timeout_ms = parse_duration_ms("--message-timeout", args.message_timeout)
    except AckstreamError as problem:
        parser.error(str(problem))
    log = LogFile("acker", args.verbose)
    with log:
        code = _run_acker(args, kafka_options, timeout_ms, log)
    if code == EXIT_OK:
        log.discard()
    return code


def _run_acker(args, kafka_options: dict, timeout_ms: int, log: LogFile) -> int:
    """Start the acker query, wait for it, stop it; the exit status."""
    from ackstream.acker.query import start_acker
    from ackstream.config import default_channel_dir

    try:
        spark = _local_session(args, f"ackstream-acker-{args.topology}", log)
    except AckstreamError as problem:
        return _refused(problem)
    if args.bootstrap:
        from ackstream.channels.kafka import KafkaChannel

        channel: Channel = KafkaChannel(args.bootstrap, args.topology, kafka_options=kafka_options)
    else:
        from ackstream.channels.local import LocalChannel

        channel = LocalChannel(args.channel or default_channel_dir(args.topology))
    query, code = None, EXIT_FAILED
    try:
        query = start_acker(
            spark,
            channel,
            checkpoint=args.checkpoint,
            ackers=args.ackers,
            message_timeout_ms=timeout_ms,
            trigger_ms=args.trigger_ms,
            query_name=f"{args.topology}.acker",
        )
        print(f"ackstream acker: {query.name} running, checkpoint {args.checkpoint}", flush=True)
        code = _supervise([query], args.timeout, None, log)
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except AckstreamError as problem:
        code = _refused(problem)
    finally:
        _stopping(code, log)
        if query is not None:
            _stop([query])
        spark.stop()
    return code


def _status(parser: argparse.ArgumentParser, args) -> int:
    import json

    from ackstream.config import default_channel_dir
    from ackstream.status import kafka_status, local_status

    if args.channel and args.bootstrap:
        parser.error(
            "--channel and --bootstrap are both set (check ACKSTREAM_CHANNEL and "
            "ACKSTREAM_BOOTSTRAP): give one"
        )
    channel = args.channel
    if not args.bootstrap:
        channel = channel or default_channel_dir(args.topology)
        if not os.path.isdir(channel):
            where = "" if args.channel else f" (the default of topology {args.topology!r})"
            parser.error(
                f"no channel directory at {channel}{where}: pass --channel DIR (the "
                "source's ackstream.channel) or --bootstrap HOST:PORT, or set "
                "ACKSTREAM_CHANNEL / ACKSTREAM_BOOTSTRAP / ACKSTREAM_TOPOLOGY"
            )
    if args.window <= 0:
        parser.error("--window must be a positive number of seconds")
    kafka_options = command_kafka_options(parser, args, one_shot=True)
    if args.checkpoint and not os.path.isdir(args.checkpoint):
        parser.error(f"--checkpoint {args.checkpoint}: no such directory")
    if args.dead_letter_topic and not args.bootstrap:
        parser.error("--dead-letter-topic needs --bootstrap HOST:PORT (or ACKSTREAM_BOOTSTRAP)")
    if args.group and not (args.bootstrap or args.upstream_bootstrap):
        parser.error("--group needs --bootstrap or --upstream-bootstrap HOST:PORT")
    try:
        if args.bootstrap:
            status = kafka_status(
                args.bootstrap,
                args.topology,
                args.dead_letters,
                args.dead_letter_topic,
                window_s=args.window,
                group_id=args.group,
                kafka_options=kafka_options,
                upstream_bootstrap=args.upstream_bootstrap,
            )
        else:
            status = local_status(channel, args.topology, args.dead_letters, window_s=args.window)
            if args.upstream_bootstrap:
                from dataclasses import replace

                from ackstream.status import group_lag

                group = args.group or f"ackstream-{args.topology}"
                lag = group_lag(args.upstream_bootstrap, group, kafka_options)
                status = replace(status, partitions=lag)
    except AckstreamError as problem:
        return _refused(problem)
    except Exception as problem:  # kafka-python's errors (no broker, timeouts)
        if not (args.bootstrap or args.upstream_bootstrap):
            raise
        brokers = " or ".join(b for b in (args.bootstrap, args.upstream_bootstrap) if b)
        return _unanswered(f"read from the brokers at {brokers}", problem)
    if args.checkpoint:
        from dataclasses import replace

        from ackstream.status import held_in, stages_in

        status = replace(status, held=held_in(args.checkpoint), stages=stages_in(args.checkpoint))
    if args.prometheus:
        print(status.prometheus(), end="")
    else:
        print(json.dumps(status.to_dict()) if args.json else "\n".join(status.lines()))
    return 0


def _unanswered(doing: str, problem: Exception) -> int:
    """Say that a one-shot command could not do ``doing`` with Kafka, and what to check."""
    import traceback

    said = cause_of("".join(traceback.format_exception_only(problem)))
    print(
        f"ackstream: could not {doing}: {said}. Check that the brokers are up and "
        "reachable from here (--bootstrap, and --command-config for a secured listener)",
        file=sys.stderr,
    )
    return EXIT_ENVIRONMENT


def _dead_letters(parser: argparse.ArgumentParser, args) -> int:
    from ackstream.clock import now_ms
    from ackstream.config import default_channel_dir
    from ackstream.sinks.dead_letters import (
        read_dead_letters,
        replay_dead_letters,
        select_dead_letters,
    )
    from ackstream.sinks.replay_log import FileReplayLog, TopicReplayLog, letter_name

    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be a positive number")
    records = []
    for text in args.record:
        topic, _, rest = text.rpartition(":")
        match = re.fullmatch(r"(.+):(\d+)", topic) if rest.isdigit() else None
        if not match:
            parser.error(f"--record {text!r}: give TOPIC:PARTITION:OFFSET, e.g. orders:0:42")
        records.append((match.group(1), int(match.group(2)), int(rest)))
    if args.dead_letter_topic and not args.bootstrap:
        parser.error("--dead-letter-topic needs --bootstrap HOST:PORT (or ACKSTREAM_BOOTSTRAP)")
    if args.action == "replay" and not args.bootstrap:
        parser.error("replay needs --bootstrap HOST:PORT: the brokers of the source topics")
    kafka_options = command_kafka_options(parser, args, one_shot=True)
    if args.dead_letters:
        where, letters = args.dead_letters, read_dead_letters(args.dead_letters)
        marks: ReplayLog = FileReplayLog(args.dead_letters)
    elif args.bootstrap:
        topic = args.dead_letter_topic or f"{args.topology}.dead"
        where = f"topic {topic} on {args.bootstrap}"
        marks = TopicReplayLog(args.bootstrap, topic, kafka_options)
        try:
            letters = read_dead_letters(
                bootstrap=args.bootstrap, topic=topic, kafka_options=kafka_options
            )
        except Exception as problem:  # kafka-python's errors (no broker, timeouts)
            return _unanswered(f"read {where}", problem)
    else:
        folder = os.path.join(args.channel or default_channel_dir(args.topology), "dead_letters")
        if not os.path.isdir(folder):
            parser.error(
                f"no dead letters at {folder}: pass --dead-letters DIR, --channel DIR (the "
                "source's ackstream.channel) or --bootstrap HOST:PORT (a dead-letter topic)"
            )
        where, letters, marks = folder, read_dead_letters(folder), FileReplayLog(folder)
    try:
        replayed = marks.replayed()
    except Exception as problem:  # kafka-python's errors (no broker, timeouts)
        return _unanswered(f"read which letters were replayed ({where})", problem)
    rows = select_dead_letters(letters, reason=args.reason, records=records)
    skipped = 0
    if args.action == "replay" and not args.again:  # the limit counts letters to send
        skipped = sum(letter_name(r) in replayed for r in rows)
        rows = [r for r in rows if letter_name(r) not in replayed]
    rows = rows[: args.limit]
    for r in rows:
        at = replayed.get(letter_name(r))
        mark = "" if at is None else f"  (replayed {_utc(at)})"
        print(
            f"{r['topic']}[{r['partition']}]@{r['offset']}  attempts={r['attempts']}  "
            f"{r['reason']}{mark}"
        )
    print(f"{len(rows)} of {letters.num_rows} dead letters in {where}")
    if skipped:
        print(f"{skipped} chosen letters were replayed before: left out (--again sends them)")
    if args.action == "list":
        return 0
    if not args.yes:
        print(f"dry run: pass --yes to send these {len(rows)} to their source topics")
        return 0
    try:
        sent = replay_dead_letters(rows, args.bootstrap, kafka_options=kafka_options)
    except ValueError as problem:
        print(f"ackstream: {problem}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as problem:  # kafka-python's errors (no broker, timeouts)
        return _unanswered(f"send the letters to their topics on {args.bootstrap}", problem)
    try:
        marks.mark([letter_name(r) for r in rows], now_ms())
    except Exception as problem:  # sent, not marked: a second replay would send again
        print(
            f"ackstream: replayed {sent}, but could not mark them replayed ({problem}): a "
            "second replay without --record or --reason would send them again",
            file=sys.stderr,
        )
        return 1
    print(f"replayed {sent} to their source topics on {args.bootstrap}")
    return 0


def _utc(ms: int) -> str:
    import datetime

    moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _bench(args, extra: list[str]) -> int:
    import subprocess

    script = Path(args.benchmarks) / f"{args.name}.py"
    if not script.is_file():
        print(
            f"ackstream: benchmark {args.name!r} not found at {script}. Benchmarks ship with "
            "the source checkout, not with the installed package: run this from a clone of "
            "the repository, or pass --benchmarks DIR (env ACKSTREAM_BENCHMARKS).",
            file=sys.stderr,
        )
        return 1
    forwarded = (["--quick"] if args.quick else []) + extra
    return subprocess.run(
        [sys.executable, str(script), *forwarded], cwd=script.parent.parent, check=False
    ).returncode
