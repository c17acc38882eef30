"""``ackstream dead-letters list|replay``: read a topology's dead letters, send chosen
ones back to their source topic (:mod:`ackstream.sinks.dead_letters` reads and sends
them, :mod:`ackstream.sinks.replay_log` marks them replayed)."""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys

from ackstream.cli.arguments import (
    Formatter,
    add_channel_options,
    add_dead_letter_options,
    check_dead_letter_topic,
    command_kafka_options,
)
from ackstream.cli.exits import EXIT_FAILED, unanswered
from ackstream.config.source import default_channel_dir
from ackstream.sinks.dead_letters import (
    read_dead_letters,
    replay_dead_letters,
    select_dead_letters,
)
from ackstream.sinks.replay_log import FileReplayLog, ReplayLog, TopicReplayLog, letter_name
from ackstream.vocabulary.clock import now_ms

__all__ = ["add_arguments", "command"]


def add_arguments(dead: argparse.ArgumentParser) -> None:
    dead.description = (
        "Reads the dead letters a topology wrote: from --dead-letters DIR (Parquet),\n"
        "else with --bootstrap from its dead-letter topic, else from\n"
        "<channel>/dead_letters. Reads files or topics only: no Spark session."
    )
    actions = dead.add_subparsers(dest="action", required=True)
    for name, text in (
        ("list", "one line per dead letter: where from, attempts, when it died, reason"),
        (
            "replay",
            "send chosen dead letters back to their source topic and partition (key, value "
            "and headers as they were, plus an ackstream.replay_of header); prints what it "
            "would send unless --yes. The dead letters stay and are marked replayed "
            "(_replayed.jsonl in their folder, or the topic <dead-letter topic>.replayed): "
            "a second replay leaves them out unless --again",
        ),
    ):
        action = actions.add_parser(
            name, help=text, description=text, formatter_class=Formatter, allow_abbrev=False
        )
        action.set_defaults(subparser=action)  # errors name the subcommand
        add_channel_options(action)
        add_dead_letter_options(action)
        action.add_argument(
            "--reason", default=None, help="only letters whose reason contains this text"
        )
        action.add_argument(
            "--record",
            action="append",
            default=[],
            metavar="TOPIC:PARTITION:OFFSET",
            help="only this record's letter (repeatable)",
        )
        action.add_argument("--limit", type=int, default=None, help="at most this many letters")
    actions.choices["replay"].add_argument(
        "--yes", action="store_true", help="send them (without it: only say what would be sent)"
    )
    actions.choices["replay"].add_argument(
        "--again", action="store_true", help="send letters that were replayed before too"
    )


def command(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> int:
    """``ackstream dead-letters list|replay``."""
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be a positive number")
    records = []
    for text in args.record:
        topic, _, rest = text.rpartition(":")
        match = re.fullmatch(r"(.+):(\d+)", topic) if rest.isdigit() else None
        if not match:
            parser.error(f"--record {text!r}: give TOPIC:PARTITION:OFFSET, e.g. orders:0:42")
        records.append((match.group(1), int(match.group(2)), int(rest)))
    check_dead_letter_topic(parser, args)
    if args.action == "replay" and not args.bootstrap:
        parser.error("replay needs --bootstrap HOST:PORT: the brokers of the source topics")
    kafka_options = command_kafka_options(parser, args, one_shot=True)
    if args.dead_letters:
        where, letters = args.dead_letters, read_dead_letters(args.dead_letters)
        marks: ReplayLog = FileReplayLog(args.dead_letters)
    elif args.bootstrap:
        topic = args.dead_letter_topic or f"{args.topology}.dead"
        where = f"topic {topic} on {args.bootstrap}"
        marks = TopicReplayLog(args.bootstrap, topic, kafka_options)
        try:
            letters = read_dead_letters(
                bootstrap=args.bootstrap, topic=topic, kafka_options=kafka_options
            )
        except Exception as problem:  # kafka-python's errors (no broker, timeouts)
            return unanswered(f"read {where}", problem)
    else:
        folder = os.path.join(args.channel or default_channel_dir(args.topology), "dead_letters")
        if not os.path.isdir(folder):
            parser.error(
                f"no dead letters at {folder}: pass --dead-letters DIR, --channel DIR (the "
                "source's ackstream.channel) or --bootstrap HOST:PORT (a dead-letter topic)"
            )
        where, letters, marks = folder, read_dead_letters(folder), FileReplayLog(folder)
    try:
        replayed = marks.replayed()
    except Exception as problem:  # kafka-python's errors (no broker, timeouts)
        return unanswered(f"read which letters were replayed ({where})", problem)
    rows = select_dead_letters(letters, reason=args.reason, records=records)
    skipped = 0
    if args.action == "replay" and not args.again:  # the limit counts letters to send
        skipped = sum(letter_name(r) in replayed for r in rows)
        rows = [r for r in rows if letter_name(r) not in replayed]
    rows = rows[: args.limit]
    for r in rows:
        at = replayed.get(letter_name(r))
        mark = "" if at is None else f"  (replayed {_utc(at)})"
        died = "" if r["written_ms"] is None else f"died {_utc(r['written_ms'])}  "
        print(
            f"{r['topic']}[{r['partition']}]@{r['offset']}  attempts={r['attempts']}  "
            f"{died}{r['reason']}{mark}"
        )
    print(f"{len(rows)} of {letters.num_rows} dead letters in {where}")
    if skipped:
        print(f"{skipped} chosen letters were replayed before: left out (--again sends them)")
    if args.action == "list":
        return 0
    if not args.yes:
        print(f"dry run: pass --yes to send these {len(rows)} to their source topics")
        return 0
    try:
        sent = replay_dead_letters(rows, args.bootstrap, kafka_options=kafka_options)
    except ValueError as problem:
        print(f"ackstream: {problem}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as problem:  # kafka-python's errors (no broker, timeouts)
        return unanswered(f"send the letters to their topics on {args.bootstrap}", problem)
    try:
        marks.mark([letter_name(r) for r in rows], now_ms())
    except Exception as problem:  # sent, not marked: a second replay would send again
        print(
            f"ackstream: replayed {sent}, but could not mark them replayed ({problem}): a "
            "second replay without --record or --reason would send them again",
            file=sys.stderr,
        )
        return 1
    print(f"replayed {sent} to their source topics on {args.bootstrap}")
    return 0


def _utc(ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")
