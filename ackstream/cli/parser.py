"""The ``ackstream`` parser, and :func:`main`, which hands the parsed arguments to the
chosen command's module.

:data:`COMMANDS` names each command's module and its line in ``ackstream --help``.
Only the chosen command's module is imported: it imports what the command runs
(Spark, Arrow, pandas) at its top, and ``ackstream --help`` imports none of it.

Each command's module has ``add_arguments(parser)``, which declares the command's
description and options on its parser, and ``command(parser, args, extra) -> exit
status``: ``parser`` is the command's own (it sets itself as ``subparser``, so that its
errors name the subcommand), else the top-level parser; ``extra`` the options no parser
knew (only ``bench`` takes any).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import re
from types import ModuleType
from typing import NamedTuple, NoReturn

from ackstream import __version__
from ackstream.cli.arguments import Formatter
from ackstream.cli.exits import EXIT_INTERRUPTED, EXIT_STATUS, EXIT_USAGE

__all__ = ["COMMANDS", "Command", "build_parser", "main"]


class Command(NamedTuple):
    """A command: the module that declares and runs it, its line in ``--help``."""

    module: str
    summary: str


#: The commands, in the order ``ackstream --help`` lists them.
COMMANDS = {
    "demo": Command(
        "ackstream.cli.demo",
        "run a word-split topology on the embedded default (no broker needed): generator "
        "upstream, local channel, injected failures, a summary at the end",
    ),
    "run": Command("ackstream.cli.run", "run a topology file with a local Spark session"),
    "status": Command(
        "ackstream.cli.status", "what became of a topology's roots, from its channels"
    ),
    "dead-letters": Command(
        "ackstream.cli.dead_letters",
        "list a topology's dead letters, or replay chosen ones to their topic",
    ),
    "ui": Command(
        "ackstream.cli.ui",
        "serve the live view of topologies (stages, rates, latency, lag, dead letters) "
        "and their Prometheus metrics",
    ),
    "acker": Command(
        "ackstream.cli.acker", "run a topology's acker query in this process, until stopped"
    ),
    "bench": Command("ackstream.cli.bench", "run a benchmark from the source checkout"),
}


class _Parser(argparse.ArgumentParser):
    """argparse that answers a mistyped command, choice or option with the one meant."""

    def error(self, message: str) -> NoReturn:
        typed = re.search(r"invalid choice: (['\"])(.*?)\1", message)
        choices = [c for a in self._actions if a.choices for c in a.choices]
        meant = difflib.get_close_matches(typed.group(2), choices, n=1) if typed else []
        unknown = re.match(r"unrecognized arguments: (.*)", message)
        if unknown:  # an option mistyped: the nearest this command takes
            options = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
            for word in unknown.group(1).split():
                if word.startswith("--"):
                    meant = meant or difflib.get_close_matches(word.split("=")[0], options, n=1)
        if meant:
            self.exit(EXIT_USAGE, f"{self.prog}: error: {message}; did you mean {meant[0]!r}?\n")
        super().error(message)


def build_parser(*declared: str) -> argparse.ArgumentParser:
    """The ``ackstream`` parser: every command by name and summary, and the options of
    the ``declared`` commands (which imports their modules)."""
    parser = _Parser(
        prog="ackstream",
        description="Storm's guaranteed message processing for Spark Structured Streaming.",
        epilog="exit status:\n"
        + "\n".join(f"  {code:<5}{meaning}" for code, meaning in EXIT_STATUS.items()),
        formatter_class=Formatter,
        allow_abbrev=False,  # --package is a mistake, not --packages
    )
    parser.add_argument("--version", action="version", version=f"ackstream {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        # undeclared, a command leaves its options, --help too, to the declared parser
        subparser = commands.add_parser(
            name,
            help=command.summary,
            formatter_class=Formatter,
            add_help=name in declared,
            allow_abbrev=False,
        )
        if name in declared:
            _module(name).add_arguments(subparser)
    return parser


def _module(name: str) -> ModuleType:
    # the one import of a command's module, made when the command is chosen: only its
    # module imports Spark, Arrow or pandas, and only when it runs
    return importlib.import_module(COMMANDS[name].module)


def main(argv: list[str] | None = None) -> int:
    try:
        return _command(argv)
    except KeyboardInterrupt:  # a second Ctrl-C, or one before a command could take it
        return EXIT_INTERRUPTED


def _command(argv: list[str] | None) -> int:
    # which command: ackstream --help, --version and a missing command end here
    chosen, _ = build_parser().parse_known_args(argv)
    parser = build_parser(chosen.command)
    args, extra = parser.parse_known_args(argv)
    # a command with a parser of its own (set as its ``subparser``) names itself in errors
    own = getattr(args, "subparser", parser)
    if extra and args.command != "bench":  # only bench passes options on
        own.error(f"unrecognized arguments: {' '.join(extra)}")
    code: int = _module(args.command).command(own, args, extra)
    return code
