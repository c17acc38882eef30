"""The ``ackstream`` command (also ``python -m ackstream``)."""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["main", "build_parser"]


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ackstream",
        description="Storm's guaranteed message processing for Spark Structured Streaming.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo", help="run the acker demo on the embedded default (no broker needed)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    demo.add_argument("--roots", type=int, default=_env_int("ACKSTREAM_DEMO_ROOTS", 5000),
                      help="upstream records to track (env ACKSTREAM_DEMO_ROOTS)")
    demo.add_argument("--fail-every", type=int, default=50,
                      help="a bolt fails every N-th tree")
    demo.add_argument("--lose-every", type=int, default=97,
                      help="every N-th tree loses an ack and times out")
    demo.add_argument("--message-timeout-ms", type=int, default=3000,
                      help="Storm's topology.message.timeout, in ms")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        for name in ("roots", "fail_every", "lose_every", "message_timeout_ms"):
            if getattr(args, name) <= 0:
                parser.error(f"--{name.replace('_', '-')} must be a positive number")
        return _demo(args)
    return 2


def _demo(args) -> int:
    from ackstream.demo import run_acker_demo
    from ackstream.errors import AckstreamError
    from ackstream.session import local_session

    try:
        spark = local_session("ackstream-demo")
    except AckstreamError as problem:
        print(f"ackstream: {problem}", file=sys.stderr)
        return 1
    try:
        summary = run_acker_demo(spark, roots=args.roots, fail_every=args.fail_every,
                                 lose_every=args.lose_every,
                                 message_timeout_ms=args.message_timeout_ms)
    finally:
        spark.stop()
    print(
        f"\nroots {summary.roots}  ack records {summary.records}  in {summary.seconds:.1f}s\n"
        f"acked {summary.acked}  failed {summary.failed}  timed out {summary.timed_out}"
        f"  (expected {summary.expected})\n"
        f"complete latency p50 {summary.p50_ms:.0f} ms  p99 {summary.p99_ms:.0f} ms"
    )
    if not summary.accounted_for:
        print("ackstream: not every root was accounted for", file=sys.stderr)
        return 1
    print("every root accounted for")
    return 0
