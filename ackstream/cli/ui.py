"""``ackstream ui``: serve the live view (:mod:`ackstream.ui.view`) of one or more
topologies, and their Prometheus metrics, until Ctrl-C."""

from __future__ import annotations

import argparse
import os
import sys

from ackstream.cli.arguments import add_figure_options, figure_sources
from ackstream.cli.exits import EXIT_OK, check_ui_extra
from ackstream.errors import OptionError

__all__ = ["add_arguments", "command"]


def add_arguments(ui: argparse.ArgumentParser) -> None:
    ui.description = (
        "Serves a web page of topologies at http://HOST:PORT/: per topology the stage\n"
        "graph (tuples in and out, failures per stage), acked / failed / replayed /\n"
        "dead-lettered roots a second and the complete latency's percentiles over\n"
        "time, lag per partition, roots in flight and held, and the dead letters with\n"
        "a replay button (it asks to confirm). It reads what `ackstream status` reads\n"
        "(the channel, --checkpoint, the group's offsets), every few seconds, so it\n"
        "works with no topology running. Prometheus metrics at /metrics.\n"
        "`ackstream run FILE --ui PORT` serves the same beside a run.\n\n"
        "Only the page itself can replay (its origin, a JSON body and the token the\n"
        "server wrote into it). A --host beyond loopback needs --access-token. It\n"
        "needs the ui extra: pip install 'ackstream[ui]'."
    )
    ui.set_defaults(subparser=ui)  # errors name the subcommand
    add_figure_options(ui)
    ui.add_argument("--port", type=int, default=8050, help="the port to serve on (0: a free one)")
    ui.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to serve on; one beyond loopback needs --access-token",
    )
    ui.add_argument(
        "--access-token",
        metavar="TOKEN",
        help="a secret every request must carry: open /?token=TOKEN once (a cookie keeps "
        "it), or send Authorization: Bearer TOKEN, e.g. from Prometheus (env "
        "ACKSTREAM_UI_TOKEN); required with a --host beyond loopback",
    )


def command(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> int:
    """``ackstream ui``."""
    check_ui_extra(parser, "ackstream ui")
    names = [n.strip() for n in args.topology.split(",") if n.strip()]
    if not names:
        parser.error("--topology: give a topology's name (several: a,b,c)")
    sources = figure_sources(parser, args, names)
    if not 0 <= args.port <= 65535:
        parser.error("--port must be a port number, 0 to 65535")
    import uvicorn

    from ackstream.ui.metrics import Statuses
    from ackstream.ui.view import app, check_host

    # read here, not as the option's default: --help would print the secret
    args.access_token = args.access_token or os.environ.get("ACKSTREAM_UI_TOKEN")
    try:
        check_host(args.host, args.access_token)
    except OptionError as problem:
        parser.error(str(problem))
    statuses = Statuses(lambda: sources, window_s=args.window)
    view = app(statuses, access_token=args.access_token)
    print(
        f"ackstream: the live view of {', '.join(names)} at http://{args.host}:{args.port}/ "
        f"(metrics at /metrics){' (open it with ?token=TOKEN)' if args.access_token else ''}; "
        "Ctrl-C stops it",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(view, host=args.host, port=args.port, log_level="warning")
    return EXIT_OK
