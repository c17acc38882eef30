"""``ackstream demo``: the main job on the embedded default (no broker), a summary at
the end (:mod:`ackstream.demo` runs it)."""

from __future__ import annotations

import argparse
import sys

from ackstream.cli.arguments import env_int
from ackstream.cli.exits import EXIT_USAGE, refused
from ackstream.demo import run_demo
from ackstream.errors import AckstreamError
from ackstream.sources.launch import local_session

__all__ = ["add_arguments", "command"]


def add_arguments(demo: argparse.ArgumentParser) -> None:
    demo.add_argument(
        "--records",
        type=int,
        default=env_int("ACKSTREAM_DEMO_RECORDS", 2000),
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


def command(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> int:
    """``ackstream demo``; its errors are the top parser's."""
    for name in ("records", "poison_every", "message_timeout_ms", "max_per_batch"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be a positive number")
    return _demo(args)


def _demo(args: argparse.Namespace) -> int:
    if not 0 <= args.fail_percent <= 100 or args.max_retries < 0:
        print("ackstream: --fail-percent must be 0 to 100 and --max-retries >= 0", file=sys.stderr)
        return EXIT_USAGE
    try:
        spark = local_session("ackstream-demo")
    except AckstreamError as problem:
        return refused(problem)
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
        f"{s.dead_lettered}, failed {s.failed}, timed out {s.timed_out}, committed "
        f"{s.committed}, lost {s.lost}\ncomplete latency: first batch "
        f"{s.cold_batch_ms:.0f} ms (cold: Spark start-up), {warm}\n"
        "next: ackstream status --topology demo"
    )
    if not s.accounted_for:
        print("ackstream: not every record was accounted for", file=sys.stderr)
        return 1
    print("every record accounted for: acked or dead-lettered, committed, none lost")
    return 0
