"""``ackstream run FILE``: run a topology file with a local Spark session, wait for its
queries, stop them cleanly on Ctrl-C, ``--timeout`` or ``--until-idle``."""

from __future__ import annotations

import argparse
import logging
import os
import runpy
import sys
import traceback
from typing import TYPE_CHECKING, cast

from pyspark.sql import SparkSession

from ackstream.cli.arguments import (
    add_session_options,
    add_spark_conf_options,
    add_verbose,
    env_float,
    spark_conf,
)
from ackstream.cli.console import LogFile
from ackstream.cli.exits import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    check_ui_extra,
    refused,
    status_of,
)
from ackstream.cli.queries import Progress, local_session, stop, stopping, supervise
from ackstream.errors import AckstreamError, cause_of
from ackstream.sources.datasource import register
from ackstream.topology.declared import started as started_topologies

if TYPE_CHECKING:
    from ackstream.topology.dsl import Topology
    from ackstream.ui.metrics import Served

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

The session is local[--cores] unless --master or --remote says otherwise, with
Spark's own UI on (its address is in the first lines; --no-spark-ui switches it
off) and the settings of --conf and --packages: e.g. --packages
org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0 brings Spark's Kafka connector,
with which Spark reads and writes the records (the fast path). --metrics-port PORT
serves the topologies' Prometheus metrics at http://127.0.0.1:PORT/metrics, and
--ui PORT the live view (see `ackstream ui --help`) with /metrics beside it.

The console shows progress every 5 s, the roots acked, replayed and
dead-lettered with it, and, when the run ends badly, one line saying why and
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
    run.add_argument(
        "--no-spark-ui",
        dest="spark_ui",
        action="store_false",
        help="switch Spark's own UI off (it is on, at http://127.0.0.1:4040 or the next free port)",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve the started topologies' Prometheus metrics at "
        "http://127.0.0.1:PORT/metrics while the run lasts",
    )
    run.add_argument(
        "--ui",
        type=int,
        default=None,
        metavar="PORT",
        help="serve the live view of the started topologies at http://127.0.0.1:PORT/ "
        "(and their metrics at /metrics) while the run lasts; needs the ui extra",
    )
    add_verbose(run)
    add_session_options(run)
    add_spark_conf_options(run)


def command(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> int:
    """``ackstream run``."""
    for name in ("timeout", "until_idle"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be a positive number of seconds")
    if not os.path.isfile(args.file):
        parser.error(f"no topology file at {args.file}")
    if args.ui is not None:
        check_ui_extra(parser, "ackstream run --ui")
    for name in ("metrics_port", "ui"):
        port = getattr(args, name)
        if port is not None and not 0 <= port <= 65535:
            parser.error(f"--{name.replace('_', '-')} must be a port number, 0 to 65535")
    conf = {"spark.ui.enabled": str(args.spark_ui).lower(), **spark_conf(parser, args)}
    if args.remote:  # a Connect server has its own UI and settings
        conf = {}
    log_file = LogFile("run", args.verbose)
    with log_file:
        code = _run_file(args, log_file, conf)
    if code == EXIT_OK:
        log_file.discard()
    return code


def _run_file(args: argparse.Namespace, log_file: LogFile, conf: dict[str, str]) -> int:
    """Run the topology file, wait for its queries, stop them; the exit status."""
    progress = Progress()
    spark, made = SparkSession.getActiveSession(), False
    if spark is None:
        where = args.remote or args.master or f"local[{args.cores}]"
        progress.say(f"Spark is starting ({where})")
        try:
            spark = local_session(args, "ackstream-run", log_file, conf)
            made = True
        except AckstreamError as problem:
            return refused(problem)
        ui = None if args.remote else spark.sparkContext.uiWebUrl
        progress.say(f"Spark is up{f': its UI at {ui}' if ui else ''}")
    register(spark)
    before = {q.id for q in spark.streams.active}
    known = len(started_topologies())
    started, code, servers = [], EXIT_FAILED, []
    try:
        runpy.run_path(args.file, init_globals={"spark": spark}, run_name="__main__")
        started = [q for q in spark.streams.active if q.id not in before]
        servers = _serve(args, started_topologies()[known:], progress)
        code = supervise(started, args.timeout, args.until_idle, log_file, progress)
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
        for server in servers:
            server.close()
        if made:
            spark.stop()
    return code


def _serve(
    args: argparse.Namespace, topologies: list[tuple[object, str]], progress: Progress
) -> list[Served]:
    """The metrics endpoint and the live view the options ask for, serving the
    ``(topology, checkpoint)`` pairs the file started; each says where it is."""
    if args.metrics_port is None and args.ui is None:
        return []
    from ackstream.ui.metrics import Statuses, serve_metrics
    from ackstream.ui.status_sources import StatusSource

    # the started topologies are Topology objects (declared keeps them untyped: it sits below)
    sources = [
        StatusSource.of_topology(cast("Topology", t), checkpoint) for t, checkpoint in topologies
    ]
    statuses = Statuses(lambda: sources)
    servers: list[Served] = []
    if args.metrics_port is not None:
        servers.append(serve_metrics(statuses, args.metrics_port))
        progress.say(f"metrics at {servers[-1].url}metrics")
    if args.ui is not None:
        from ackstream.ui.view import serve_view  # the ui extra's web server

        servers.append(serve_view(statuses, args.ui))
        progress.say(f"live view at {servers[-1].url}")
    return servers
