"""``ackstream acker``: a topology's acker query in a process of its own (the topology
started with ``acker=False``), until stopped (:mod:`ackstream.acker.query` starts it)."""

from __future__ import annotations

import argparse

from ackstream.acker.query import start_acker
from ackstream.channels.base import Channel
from ackstream.channels.kafka import KafkaChannel
from ackstream.channels.local import LocalChannel
from ackstream.cli.arguments import (
    add_channel_options,
    add_session_options,
    add_verbose,
    check_channel_options,
    command_kafka_options,
)
from ackstream.cli.console import LogFile
from ackstream.cli.exits import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, refused
from ackstream.cli.queries import local_session, stop, stopping, supervise
from ackstream.config.source import default_channel_dir, parse_duration_ms
from ackstream.errors import AckstreamError

__all__ = ["add_arguments", "command"]


def add_arguments(acker: argparse.ArgumentParser) -> None:
    acker.description = (
        "Runs the acker query of a topology started elsewhere with acker=False:\n"
        "ack records in from the channel, completions out to it. The pending\n"
        "roots live in the checkpoint: restarted with the same --checkpoint\n"
        "(after a crash, too), it resumes them. Stops on Ctrl-C or --timeout."
    )
    acker.set_defaults(subparser=acker)
    add_channel_options(acker)
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
    add_verbose(acker)
    add_session_options(acker)


def command(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> int:
    """``ackstream acker``."""
    check_channel_options(parser, args)
    if args.ackers < 1 or args.trigger_ms < 1:
        parser.error("--ackers and --trigger-ms must be positive")
    kafka_options = command_kafka_options(parser, args)
    try:
        timeout_ms = parse_duration_ms("--message-timeout", args.message_timeout)
    except AckstreamError as problem:
        parser.error(str(problem))
    log_file = LogFile("acker", args.verbose)
    with log_file:
        code = _run_acker(args, kafka_options, timeout_ms, log_file)
    if code == EXIT_OK:
        log_file.discard()
    return code


def _run_acker(
    args: argparse.Namespace, kafka_options: dict[str, str], timeout_ms: int, log_file: LogFile
) -> int:
    """Start the acker query, wait for it, stop it; the exit status."""
    try:
        spark = local_session(args, f"ackstream-acker-{args.topology}", log_file)
    except AckstreamError as problem:
        return refused(problem)
    channel: Channel
    if args.bootstrap:
        channel = KafkaChannel(
            args.bootstrap, args.topology, args.ackers, kafka_options=kafka_options
        )  # one acks partition per shard
    else:
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
        code = supervise([query], args.timeout, None, log_file)
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except AckstreamError as problem:
        code = refused(problem)
    finally:
        stopping(code, log_file)
        if query is not None:
            stop([query])
        spark.stop()
    return code
