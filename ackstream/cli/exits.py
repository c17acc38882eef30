"""How a command ends: its exit status (:data:`EXIT_STATUS`) and, when it ends badly,
one last line, ``ackstream: ...``, saying what failed and what to do; and the line of a
command that needs the ``ui`` extra where it is not installed."""

from __future__ import annotations

import argparse
import importlib.util
import sys
import traceback

from ackstream.errors import AckstreamError, EnvironmentProblem, cause_of

__all__ = [
    "EXIT_ENVIRONMENT",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_STATUS",
    "EXIT_USAGE",
    "UI_EXTRA_MODULES",
    "check_ui_extra",
    "refused",
    "status_of",
    "unanswered",
]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_ENVIRONMENT, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
#: What each exit status of the command means (also in ``ackstream --help``).
EXIT_STATUS = {
    EXIT_OK: "done",
    EXIT_FAILED: "a query or the topology file failed",
    EXIT_USAGE: "a usage error: an option, or a file or folder named on the command line",
    EXIT_ENVIRONMENT: "an environment problem: Java, a broker that does not answer, a topic",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}


def refused(problem: AckstreamError) -> int:
    """Print ackstream's error as the command's last line; its exit status."""
    print(f"ackstream: {problem}", file=sys.stderr)
    return EXIT_ENVIRONMENT if isinstance(problem, EnvironmentProblem) else EXIT_FAILED


def status_of(cause: str) -> int:
    """The exit status of a failure whose :func:`~ackstream.errors.cause_of` is ``cause``."""
    return EXIT_ENVIRONMENT if cause.startswith(f"{EnvironmentProblem.__name__}: ") else EXIT_FAILED


def unanswered(doing: str, problem: Exception) -> int:
    """Say that a one-shot command could not do ``doing`` with Kafka, and what to check."""
    said = cause_of("".join(traceback.format_exception_only(problem)))
    print(
        f"ackstream: could not {doing}: {said}. Check that the brokers are up and "
        "reachable from here (--bootstrap, and --command-config for a secured listener)",
        file=sys.stderr,
    )
    return EXIT_ENVIRONMENT


#: What the ``ui`` extra brings that the live view imports (``pip install 'ackstream[ui]'``).
UI_EXTRA_MODULES = ("starlette", "uvicorn", "plotly")


def check_ui_extra(parser: argparse.ArgumentParser, what: str) -> None:
    """Stop ``what`` (``ackstream ui``, ``ackstream run --ui``) with one line if the
    ``ui`` extra is not installed: the core install, what executors need, has no web
    server and no plotly."""
    missing = []
    for module in UI_EXTRA_MODULES:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a finder that refuses it, a broken install
            found = False
        if not found:
            missing.append(module)
    if missing:
        parser.exit(EXIT_ENVIRONMENT, f"{what} needs the ui extra: pip install 'ackstream[ui]'\n")
