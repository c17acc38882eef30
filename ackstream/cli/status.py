"""``ackstream status``: what became of a topology's roots, read from its channels
(:mod:`ackstream.status` reads and sums them); ``--json``, ``--prometheus``."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace

from ackstream.cli.arguments import (
    add_channel_options,
    add_dead_letter_options,
    command_kafka_options,
)
from ackstream.cli.exits import refused, unanswered
from ackstream.config import default_channel_dir
from ackstream.errors import AckstreamError
from ackstream.status import group_lag, held_in, kafka_status, local_status, stages_in

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
    add_channel_options(status)
    add_dead_letter_options(status)
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


def command(parser: argparse.ArgumentParser, args, extra: list[str]) -> int:
    """``ackstream status``; its errors name the subcommand."""
    return _status(args.subparser, args)


def _status(parser: argparse.ArgumentParser, args) -> int:
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
                group = args.group or f"ackstream-{args.topology}"
                lag = group_lag(args.upstream_bootstrap, group, kafka_options)
                status = replace(status, partitions=lag)
    except AckstreamError as problem:
        return refused(problem)
    except Exception as problem:  # kafka-python's errors (no broker, timeouts)
        if not (args.bootstrap or args.upstream_bootstrap):
            raise
        brokers = " or ".join(b for b in (args.bootstrap, args.upstream_bootstrap) if b)
        return unanswered(f"read from the brokers at {brokers}", problem)
    if args.checkpoint:
        status = replace(status, held=held_in(args.checkpoint), stages=stages_in(args.checkpoint))
    if args.prometheus:
        print(status.prometheus(), end="")
    else:
        print(json.dumps(status.to_dict()) if args.json else "\n".join(status.lines()))
    return 0
