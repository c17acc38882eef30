"""The options several commands share, and how their help is laid out.

Options default to environment variables, shown in ``--help``. Nothing here imports
Spark, pandas or Arrow: building the parser keeps ``ackstream --help`` fast.
"""

from __future__ import annotations

import argparse
import math
import os
from typing import TYPE_CHECKING

from ackstream.config.source import default_channel_dir
from ackstream.errors import OptionError
from ackstream.kafka.settings import properties_file_options

if TYPE_CHECKING:
    from ackstream.ui.status_sources import StatusSource

__all__ = [
    "ONE_SHOT_BOOTSTRAP_TIMEOUT_MS",
    "Formatter",
    "add_channel_options",
    "add_dead_letter_options",
    "add_figure_options",
    "add_session_options",
    "add_spark_conf_options",
    "add_verbose",
    "check_channel_options",
    "check_dead_letter_topic",
    "check_figure_options",
    "command_kafka_options",
    "env_float",
    "env_int",
    "figure_sources",
    "spark_conf",
]

#: How long a one-shot command (status, dead-letters) waits for brokers that do not
#: answer before it says so; queries ride out outages for OUTAGE_LIMIT_S (120 s) instead.
ONE_SHOT_BOOTSTRAP_TIMEOUT_MS = 10_000


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def env_float(name: str) -> float | None:
    value = os.environ.get(name)
    return float(value) if value else None


class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown in --help, descriptions kept as written; a flag's (``--verbose``,
    ``--no-spark-ui``) and an unset one's are not: ``(default: True)`` beside
    ``--no-spark-ui`` reads as if the flag were on."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.nargs == 0 or action.default in (None, False):
            return action.help
        return super()._get_help_string(action)


def add_verbose(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--verbose",
        action="store_true",
        help="Spark's log, Python's logging and full errors on the console, not in a log file",
    )


def add_session_options(command: argparse.ArgumentParser) -> None:
    """Where the command's Spark session runs: local[N], a master, or a Connect server."""
    command.add_argument(
        "--cores",
        type=int,
        default=env_int("ACKSTREAM_CORES", 2),
        help="local[N] cores when the command makes a local session (env ACKSTREAM_CORES)",
    )
    where = command.add_mutually_exclusive_group()
    where.add_argument(
        "--master",
        default=os.environ.get("ACKSTREAM_MASTER"),
        metavar="URL",
        help="Spark master instead of local[N], e.g. spark://host:7077 (env ACKSTREAM_MASTER); "
        "the executors must import ackstream: install it on every host, or set "
        "spark.submit.pyFiles in spark-defaults.conf",
    )
    where.add_argument(
        "--remote",
        default=os.environ.get("ACKSTREAM_REMOTE"),
        metavar="URL",
        help="a Spark Connect server instead of a session in this process, e.g. "
        "sc://host:15002 (env ACKSTREAM_REMOTE)",
    )


def add_spark_conf_options(command: argparse.ArgumentParser) -> None:
    """--conf KEY=VALUE (repeatable) and --packages: Spark settings of the command's
    session, as spark-submit takes them."""
    command.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting of the session the command makes (repeatable), as "
        "spark-submit's --conf, e.g. --conf spark.sql.shuffle.partitions=4",
    )
    command.add_argument(
        "--packages",
        metavar="COORDINATES",
        default=None,
        help="Maven coordinates of jars for the session (spark.jars.packages), comma "
        "separated, e.g. org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0 for Spark's "
        "Kafka connector (the fast path: Spark reads and writes the records)",
    )


def spark_conf(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, str]:
    """The settings of ``--conf`` and ``--packages`` (added to a ``spark.jars.packages``
    given with ``--conf``); a ``--conf`` without ``=`` stops the command."""
    conf: dict[str, str] = {}
    for given in args.conf:
        key, equals, value = given.partition("=")
        if not equals or not key.strip():
            parser.error(f"--conf {given!r}: expected KEY=VALUE, e.g. spark.ui.port=4050")
        conf[key.strip()] = value
    if args.packages:
        before = conf.get("spark.jars.packages")
        conf["spark.jars.packages"] = ",".join(p for p in (before, args.packages) if p)
    if conf and args.remote:
        parser.error(
            "--conf and --packages set up a session made here; a Spark Connect server "
            "(--remote) has its own settings"
        )
    return conf


#: the channel options: flag, metavar, default and help; each also read from its
#: environment variable, ``ACKSTREAM_`` and the flag's name
_CHANNEL_OPTIONS = (
    ("--topology", None, "ackstream", "the topology's name, ackstream.topology"),
    (
        "--channel",
        "DIR",
        None,
        "the local channel directory, ackstream.channel (unset: the topology's default directory)",
    ),
    (
        "--bootstrap",
        "HOST:PORT",
        None,
        "use the Kafka channel (<topology>.acks, <topology>.done) on this broker instead",
    ),
    (
        "--command-config",
        "FILE",
        None,
        "with --bootstrap: a Kafka client properties file (security.protocol, ssl.*, "
        "sasl.jaas.config...), as Kafka's own tools take",
    ),
)


def add_channel_options(command: argparse.ArgumentParser) -> None:
    """--topology, --channel and --bootstrap: which ack and completion channels."""
    for flag, metavar, default, text in _CHANNEL_OPTIONS:
        env = "ACKSTREAM_" + flag[2:].upper().replace("-", "_")
        command.add_argument(
            flag, metavar=metavar, default=os.environ.get(env, default), help=f"{text} (env {env})"
        )


def add_dead_letter_options(command: argparse.ArgumentParser) -> None:
    """--dead-letters and --dead-letter-topic: where a topology's dead letters are."""
    command.add_argument(
        "--dead-letters",
        metavar="DIR",
        default=None,
        help="dead-letter Parquet folder (unset: <channel>/dead_letters with "
        "--channel, the dead-letter topic with --bootstrap)",
    )
    command.add_argument(
        "--dead-letter-topic",
        metavar="TOPIC",
        default=None,
        help="with --bootstrap: the ackstream.deadLetterTopic (unset: <topology>.dead)",
    )


def add_figure_options(command: argparse.ArgumentParser) -> None:
    """The options of the commands that read a topology's figures (``status``, ``ui``):
    where its channel and dead letters are, its checkpoint, the source's group, the
    brokers the source reads and the rates' window."""
    add_channel_options(command)
    add_dead_letter_options(command)
    command.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="the topology's checkpoint (as given to Topology.start): adds the tuples "
        "each stage and sink read and emitted, and the rows its windows and joins hold",
    )
    command.add_argument(
        "--group",
        metavar="GROUP",
        help="with --bootstrap or --upstream-bootstrap: the source's kafka.group.id, for "
        "the lag (default ackstream-<topology>)",
    )
    command.add_argument(
        "--upstream-bootstrap",
        metavar="HOST:PORT",
        help="the brokers of the topics the source reads, where its group commits, when "
        "they are not the channel's (--bootstrap): the lag is read there (with a local "
        "channel too, instead of the figures the source saved), and dead letters are "
        "replayed there",
    )
    command.add_argument(
        "--window", type=float, default=60.0, metavar="SECONDS", help="the rates' window"
    )


def check_channel_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Stop the command on both channels of :func:`add_channel_options` given: either
    may come from its environment variable, unseen on the command line."""
    if args.channel and args.bootstrap:
        parser.error(
            "--channel and --bootstrap are both set (check ACKSTREAM_CHANNEL and "
            "ACKSTREAM_BOOTSTRAP): give one"
        )


def check_dead_letter_topic(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Stop the command on a ``--dead-letter-topic`` without brokers to read it from."""
    if args.dead_letter_topic and not args.bootstrap:
        parser.error("--dead-letter-topic needs --bootstrap HOST:PORT (or ACKSTREAM_BOOTSTRAP)")


def check_figure_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Stop the command on :func:`add_figure_options` that cannot go together or a
    ``--window`` that is not a positive number of seconds (``status`` and ``ui``)."""
    check_channel_options(parser, args)
    if not (math.isfinite(args.window) and args.window > 0):
        parser.error(f"--window {args.window:g}: give a positive number of seconds, e.g. 60")
    if args.checkpoint and not os.path.isdir(args.checkpoint):
        parser.error(f"--checkpoint {args.checkpoint}: no such directory")
    check_dead_letter_topic(parser, args)
    if args.group and not (args.bootstrap or args.upstream_bootstrap):
        parser.error("--group needs --bootstrap or --upstream-bootstrap HOST:PORT")


def figure_sources(
    parser: argparse.ArgumentParser, args: argparse.Namespace, topologies: list[str]
) -> list[StatusSource]:
    """Check the figure options (:func:`check_figure_options`), then say where ``status``
    and ``ui`` read the figures of each of ``topologies``: its channel and what the other
    figure options name. Several topologies cannot share one's folders (``--channel``,
    ``--checkpoint``, ``--dead-letters``); a channel directory that does not exist stops
    the command."""
    from ackstream.ui.status_sources import StatusSource  # Arrow: not while the parser is built

    check_figure_options(parser, args)
    if len(topologies) > 1 and (args.channel or args.checkpoint or args.dead_letters):
        parser.error("--channel, --checkpoint and --dead-letters name one topology's folders")
    channels = [_figure_channel(parser, args, topology) for topology in topologies]
    kafka_options = command_kafka_options(parser, args, one_shot=True)
    return [
        StatusSource(
            topology,
            channel=channel,
            bootstrap=args.bootstrap,
            kafka_options=kafka_options,
            dead_letters=args.dead_letters,
            dead_letter_topic=args.dead_letter_topic,
            group=args.group,
            upstream_bootstrap=args.upstream_bootstrap,
            checkpoint=args.checkpoint,
        )
        for topology, channel in zip(topologies, channels, strict=True)
    ]


def _figure_channel(
    parser: argparse.ArgumentParser, args: argparse.Namespace, topology: str
) -> str | None:
    """The channel directory of ``topology`` the figure options name (none with
    ``--bootstrap``: the brokers hold its channel); one that does not exist stops the
    command, saying how to name the right one."""
    if args.bootstrap:
        return None
    channel: str = args.channel or default_channel_dir(topology)
    if not os.path.isdir(channel):
        where = "" if args.channel else f" (the default of topology {topology!r})"
        parser.error(
            f"no channel directory at {channel}{where}: pass --channel DIR (the "
            "source's ackstream.channel) or --bootstrap HOST:PORT, or set "
            "ACKSTREAM_CHANNEL / ACKSTREAM_BOOTSTRAP / ACKSTREAM_TOPOLOGY"
        )
    return channel


def command_kafka_options(
    parser: argparse.ArgumentParser, args: argparse.Namespace, one_shot: bool = False
) -> dict[str, str]:
    """The ``kafka.*`` client options of ``--command-config`` (none without it); a file
    that is missing or holds a setting no Kafka client knows stops the command. A
    ``one_shot`` command gives up on silent brokers after
    :data:`ONE_SHOT_BOOTSTRAP_TIMEOUT_MS` unless the file sets ``bootstrap.timeout.ms``."""
    options = {"kafka.bootstrap.timeout.ms": str(ONE_SHOT_BOOTSTRAP_TIMEOUT_MS)} if one_shot else {}
    if not args.command_config:
        return options
    if not (args.bootstrap or getattr(args, "upstream_bootstrap", None)):
        parser.error("--command-config needs --bootstrap HOST:PORT (or ACKSTREAM_BOOTSTRAP)")
    try:
        return {**options, **properties_file_options(args.command_config)}
    except OptionError as problem:
        parser.error(str(problem))
