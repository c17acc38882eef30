"""The ``ackstream`` parser, and :func:`main`, which hands the parsed arguments to the
command's module.

Each command's module has ``add_parser(commands)``, which declares its subcommand and
sets ``handler``, and ``command(parser, args, extra) -> exit status``: ``parser`` is
the top-level parser, ``extra`` the options no parser knew (only ``bench`` takes any).
"""

from __future__ import annotations

import argparse
import difflib
import re

# the command modules by their own names: not through ``ackstream.cli``, whose face
# re-exports this module's names
import ackstream.cli.acker as acker
import ackstream.cli.bench as bench
import ackstream.cli.dead_letters as dead_letters
import ackstream.cli.demo as demo
import ackstream.cli.run as run
import ackstream.cli.status as status
from ackstream import __version__
from ackstream.cli.arguments import Formatter
from ackstream.cli.exits import EXIT_INTERRUPTED, EXIT_STATUS, EXIT_USAGE

__all__ = ["build_parser", "main"]

#: The commands' modules, in the order ``ackstream --help`` lists them.
COMMANDS = (demo, run, status, dead_letters, acker, bench)


class _Parser(argparse.ArgumentParser):
    """argparse that answers a mistyped command or choice with the one meant."""

    def error(self, message: str):
        typed = re.search(r"invalid choice: (['\"])(.*?)\1", message)
        choices = [c for a in self._actions if a.choices for c in a.choices]
        meant = difflib.get_close_matches(typed.group(2), choices, n=1) if typed else []
        if meant:
            self.exit(EXIT_USAGE, f"{self.prog}: error: {message}; did you mean {meant[0]!r}?\n")
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ackstream",
        description="Storm's guaranteed message processing for Spark Structured Streaming.",
        epilog="exit status:\n"
        + "\n".join(f"  {code:<5}{meaning}" for code, meaning in EXIT_STATUS.items()),
        formatter_class=Formatter,
    )
    parser.add_argument("--version", action="version", version=f"ackstream {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(commands)
    return parser


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
    return args.handler(parser, args, extra)
