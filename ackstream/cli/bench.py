"""``ackstream bench [NAME]``: a benchmark of the source checkout
(``benchmarks/NAME.py``), run with this Python; options bench does not know are
passed on to it."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import ackstream

__all__ = ["add_arguments", "command"]


def _checkout_benchmarks() -> Path:
    return Path(ackstream.__file__).resolve().parents[1] / "benchmarks"


def add_arguments(bench: argparse.ArgumentParser) -> None:
    bench.description = (
        "Runs benchmarks/<name>.py of the source checkout with this Python.\n"
        "Options bench does not know are passed on to the benchmark; name the\n"
        "benchmark before them (ackstream bench acker --records 100000) or write\n"
        "--records=100000. Benchmarks are not part of the installed package."
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


def command(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> int:
    """``ackstream bench``: the benchmark's own exit status, ``extra`` passed on to it."""
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
