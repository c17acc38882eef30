"""``ackstream status``: what became of a topology's roots, read from its channels
(:mod:`ackstream.ui.status` reads and sums them); ``--json``, ``--prometheus``
(:mod:`ackstream.ui.metrics`), ``--watch``."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import sys
import time

from ackstream.cli.arguments import add_figure_options, figure_sources
from ackstream.cli.exits import EXIT_OK, refused, unanswered
from ackstream.errors import AckstreamError
from ackstream.ui.metrics import exposition
from ackstream.ui.status import Status
from ackstream.ui.status_sources import StatusSource

__all__ = ["add_arguments", "command"]


def add_arguments(status: argparse.ArgumentParser) -> None:
    status.description = (
        "Counts roots (one per attempt; a replay is a new root) by outcome, from\n"
        "the ack and completion channels: pending (init record seen, no completion\n"
        "yet), acked, failed, timed out, replayed (failed or timed out and not\n"
        "dead-lettered), dead-lettered, and the complete latency of acked roots\n"
        "(p50/p90/p99); acked, replayed and dead-lettered a second over --window;\n"
        "failed roots by the stage their reason names; and per partition the end,\n"
        "committed offset and lag: as the source last saved them (local channel) or\n"
        "of the source's consumer group (--bootstrap). Reads files or topics only:\n"
        "no Spark session."
    )
    status.set_defaults(subparser=status)  # errors name the subcommand
    add_figure_options(status)
    status.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=2.0,
        default=None,
        metavar="SECONDS",
        help="read again every SECONDS (2 if not given) until Ctrl-C; on a terminal the "
        "report is redrawn in place",
    )
    output = status.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print one JSON object")
    output.add_argument(
        "--prometheus",
        action="store_true",
        help="print Prometheus' text exposition format (counters for totals, a histogram "
        "for the complete latency, gauges for levels), e.g. for a textfile collector; "
        "ackstream run --metrics-port and ackstream ui serve it over HTTP",
    )


def command(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> int:
    """``ackstream status``."""
    (source,) = figure_sources(parser, args, [args.topology])
    if args.watch is not None and args.watch <= 0:
        parser.error("--watch must be a positive number of seconds")
    if args.watch is None:
        return _once(source, args)
    return _watch(source, args)


def _read(source: StatusSource, args: argparse.Namespace) -> Status | int:
    """The status, or the exit status of a read that failed (its line printed)."""
    try:
        return source.read(args.window)
    except AckstreamError as problem:
        return refused(problem)
    except Exception as problem:  # kafka-python's errors (no broker, timeouts)
        if not (args.bootstrap or args.upstream_bootstrap):
            raise
        brokers = " or ".join(b for b in (args.bootstrap, args.upstream_bootstrap) if b)
        return unanswered(f"read from the brokers at {brokers}", problem)


def _shown(status: Status, args: argparse.Namespace) -> str:
    if args.prometheus:
        return exposition([status])
    return json.dumps(status.to_dict()) + "\n" if args.json else "\n".join(status.lines()) + "\n"


def _once(source: StatusSource, args: argparse.Namespace) -> int:
    status = _read(source, args)
    if isinstance(status, int):
        return status
    print(_shown(status, args), end="")
    return 0


def _watch(source: StatusSource, args: argparse.Namespace) -> int:
    """Read every ``--watch`` seconds until Ctrl-C: on a terminal the human report is
    redrawn in place (rich's live display; Ctrl-C ends the watch, exit status 0),
    elsewhere each reading is printed after
    the last (a blank line between two reports), as on a terminal without the ``ui``
    extra, which brings rich."""
    live = sys.stdout.isatty() and not (args.json or args.prometheus) and _has_rich()
    if live:
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text
    try:
        with (
            Live(console=Console(), auto_refresh=False) if live else contextlib.nullcontext()
        ) as shown:
            first = True
            while True:
                status = _read(source, args)
                if isinstance(status, int):
                    return status
                stamp = time.strftime("%H:%M:%S")
                if shown is not None:  # a terminal: redrawn in place
                    text = f"{_shown(status, args)}\nread at {stamp}, every {args.watch:g} s"
                    shown.update(Text(text), refresh=True)
                else:
                    print(
                        ("" if first or args.json else "\n") + _shown(status, args),
                        end="",
                        flush=True,
                    )
                first = False
                time.sleep(args.watch)
    except KeyboardInterrupt:  # the way a watch ends
        print("", file=sys.stderr)
        return EXIT_OK


def _has_rich() -> bool:
    """Whether rich (the ``ui`` extra) is installed, for the redrawn display."""
    try:
        return importlib.util.find_spec("rich") is not None
    except (ImportError, ValueError):
        return False
