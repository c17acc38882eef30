"""The live view: a web page of one or more topologies, and their Prometheus metrics.

``ackstream ui`` serves it on its own, ``ackstream run --ui PORT`` beside the
topologies the run starts. The page shows, per topology, the stage graph with the
tuples each stage read and emitted and the roots it failed or rejected, the acked,
failed, replayed and dead-lettered roots a second over time, the complete latency's
percentiles over time, the lag per partition, the pending (in flight) and held
(waiting in windows and joins) counts, and the dead letters with their reasons and
a replay action the page asks to confirm. It reads what ``ackstream status`` reads
(:class:`~ackstream.ui.status_sources.StatusSource`: the channel, the checkpoint, the group's
offsets), so it shows a topology's history with no query running, and redraws
itself every few seconds.

It needs the ``ui`` extra (``pip install 'ackstream[ui]'``): starlette, uvicorn and
plotly; nothing an executor imports imports this module. It is a Starlette application
(:func:`app`), served by uvicorn in a thread of its own (:func:`serve_view`); its
plots are plotly.js, which the ``plotly`` package ships and the view serves from this
process (nothing is loaded from elsewhere: a browser with no internet access shows
it). Its routes:

- ``/``: the page; ``/static/...``: its script, style sheet and plotly.js;
- ``/api/topologies``: what the page shows, as JSON;
- ``POST /api/replay``: ``{"topology": name, "letters": ["topic:partition:offset",
  ...], "confirmed": true}`` sends those dead letters back to their source topic (as
  ``ackstream dead-letters replay --yes`` does) and marks them replayed;
- ``/metrics``: the Prometheus text (:mod:`ackstream.ui.metrics`), answered there
  (no redirect to ``/metrics/``).

Only the page itself may replay (:mod:`ackstream.ui.access`): the page carries a
token the server made at its start, which every state-changing request must send
with the page's own origin and a JSON body; a view served beyond loopback needs an
access token, which every request then carries.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from ackstream.errors import OptionError
from ackstream.sinks.dead_letters import replay_dead_letters, select_dead_letters
from ackstream.sinks.replay_log import letter_name
from ackstream.ui.access import AccessToken, SameOrigin, is_loopback, new_page_token
from ackstream.ui.metrics import Served, Statuses, registry_of
from ackstream.ui.status import Status
from ackstream.ui.status_sources import StatusSource
from ackstream.vocabulary.clock import now_ms

__all__ = [
    "DEAD_LETTERS_SHOWN",
    "SHOWN_CHARS",
    "TOKEN_META",
    "app",
    "check_host",
    "letter_text",
    "serve_view",
]

log = logging.getLogger(__name__)

STATIC = os.path.join(os.path.dirname(__file__), "static")
#: The most dead letters the page lists per topology (the newest by record); the count
#: above the list is of all of them.
DEAD_LETTERS_SHOWN = 200
#: The tag of index.html the page token is written into (the page reads it from there).
TOKEN_META = '<meta name="ackstream-token" content="">'


def _plotly_js() -> str:
    """plotly.js as the ``plotly`` package ships it."""
    import plotly

    return os.path.join(os.path.dirname(plotly.__file__), "package_data", "plotly.min.js")


def check_host(host: str, access_token: str | None) -> None:
    """Refuse to serve the view beyond loopback without an access token: anyone who
    can reach the address could read the figures and replay dead letters."""
    if not is_loopback(host) and not access_token:
        raise OptionError(
            "--host",
            host,
            "a loopback address (127.0.0.1, ::1, localhost), or set --access-token TOKEN "
            "(or ACKSTREAM_UI_TOKEN) so that only those given the token can use the view",
        )


def app(
    statuses: Statuses,
    title: str = "ackstream",
    access_token: str | None = None,
    page_token: str | None = None,
) -> ASGIApp:
    """The live view of the topologies ``statuses`` reads (see the module doc), behind
    :mod:`ackstream.ui.access`'s guards: state-changing requests only from its page
    (which carries ``page_token``, random unless given), and with ``access_token``
    every request must hold it."""
    page_token = page_token or new_page_token()
    with open(os.path.join(STATIC, "index.html"), encoding="utf-8") as file:
        page = file.read()
    if TOKEN_META not in page:
        raise RuntimeError(f"index.html lost its {TOKEN_META} tag: the page could not replay")
    page = page.replace(TOKEN_META, TOKEN_META.replace('""', f'"{page_token}"'))
    registry = registry_of(statuses)

    def sources() -> dict[str, StatusSource]:
        return {s.topology: s for s in statuses.sources()}

    async def index(request: Request) -> HTMLResponse:
        return HTMLResponse(page, headers={"cache-control": "no-store"})

    async def plotly_js(request: Request) -> FileResponse:
        return FileResponse(_plotly_js(), media_type="text/javascript")

    def topologies(request: Request) -> JSONResponse:  # sync: Starlette runs it in a thread
        shown = {s.topology: s for s in statuses()}
        out = []
        for name, source in sources().items():
            status = shown.get(name)
            out.append(
                {
                    "name": name,
                    "status": None if status is None else status.to_dict(),
                    "graph": _graph(source, status),
                    "error": statuses.errors.get(name),
                    "dead_letters": _letters(source),
                    "can_replay": source.source_brokers is not None,
                }
            )
        return JSONResponse({"title": title, "read_ms": now_ms(), "topologies": out})

    async def replay(request: Request) -> JSONResponse:
        asked = await request.json()
        source = sources().get(asked.get("topology"))
        if source is None:
            return JSONResponse({"error": "no such topology"}, status_code=404)
        if asked.get("confirmed") is not True:
            return JSONResponse({"error": "a replay must be confirmed"}, status_code=400)
        if source.source_brokers is None:
            return JSONResponse(
                {"error": "the source's brokers are not known: use ackstream dead-letters"},
                status_code=400,
            )
        names = set(asked.get("letters") or ())
        from starlette.concurrency import run_in_threadpool

        try:
            sent = await run_in_threadpool(_replay, source, names)
        except Exception as error:  # kafka-python's errors, a letter with no value
            return JSONResponse({"error": f"{type(error).__name__}: {error}"}, status_code=502)
        return JSONResponse({"replayed": sent})

    async def no_icon(request: Request) -> Response:
        return Response(status_code=204)

    def metrics(request: Request) -> Response:  # sync: a scrape reads the channel
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    view = Starlette(
        routes=[
            Route("/", index),
            Route("/favicon.ico", no_icon),
            Route("/static/plotly.min.js", plotly_js),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
            Route("/api/topologies", topologies),
            Route("/api/replay", replay, methods=["POST"]),
            Route("/metrics", metrics),
        ]
    )
    guarded = SameOrigin(view, page_token, loopback_only=not access_token)
    return AccessToken(guarded, access_token) if access_token else guarded


def _graph(source: StatusSource, status: Status | None) -> dict[str, Any]:
    """The stage graph as ``{"nodes": [...], "edges": [[from, to], ...], "kinds": {node:
    kind}}``: the declared graph the status read (:attr:`Status.graph`), else the edges
    a started topology gives (:attr:`StatusSource.edges`), else the stages and sinks in
    the order their counts were saved, each reading the one before."""
    declared = None if status is None else status.graph
    if declared:
        nodes = declared["nodes"]
        return {
            "nodes": [n["name"] for n in nodes],
            "edges": [[stream, n["name"]] for n in nodes for stream in n["after"]],
            "kinds": {n["name"]: n["kind"] for n in nodes},
        }
    names = list((status.stages if status is not None else None) or {})
    if source.edges:
        nodes = ["spout", *dict.fromkeys(n for edge in source.edges for n in edge if n != "spout")]
        return {"nodes": nodes, "edges": [list(e) for e in source.edges]}
    nodes = ["spout", *names]
    return {"nodes": nodes, "edges": [[a, b] for a, b in zip(nodes, nodes[1:])]}


def _letters(source: StatusSource) -> dict[str, Any]:
    """The dead letters of ``source`` for the page: where, how many, and the newest
    :data:`DEAD_LETTERS_SHOWN` with their reasons, when they were written (died) and
    when they were replayed."""
    try:
        where, letters, marks = source.dead_letters_at()
        replayed = marks.replayed()
    except Exception as error:  # a broker that does not answer: say so on the page
        return {"where": None, "count": None, "rows": [], "error": f"{error}"}
    rows = select_dead_letters(letters)[-DEAD_LETTERS_SHOWN:]
    return {
        "where": where,
        "count": letters.num_rows,
        "rows": [
            {
                "letter": letter_name(r),
                "topic": r["topic"],
                "partition": r["partition"],
                "offset": r["offset"],
                "attempts": r["attempts"],
                "reason": r["reason"],
                "key": letter_text(r["key"]),
                "value": letter_text(r["value"]),
                "timestamp_ms": r["timestamp_ms"],
                "written_ms": r["written_ms"],
                "replayed_ms": replayed.get(letter_name(r)),
            }
            for r in reversed(rows)
        ],
        "error": None,
    }


#: The most characters of a dead letter's key or value the page shows.
SHOWN_CHARS = 80


def letter_text(data: bytes | None) -> str | None:
    """A key or value for the page: its text (undecodable bytes replaced), cut at
    :data:`SHOWN_CHARS` with an ellipsis."""
    if data is None:
        return None
    text = data.decode("utf-8", errors="replace")
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def _replay(source: StatusSource, names: set[str]) -> int:
    """Send the dead letters named ``names`` back to their topics, then mark them."""
    _, letters, marks = source.dead_letters_at()
    rows = [r for r in select_dead_letters(letters) if letter_name(r) in names]
    assert source.source_brokers is not None
    sent = replay_dead_letters(rows, source.source_brokers, kafka_options=source.kafka_options)
    marks.mark([letter_name(r) for r in rows], now_ms())
    log.info("replayed %d dead letters of %s from the live view", sent, source.topology)
    return sent


def serve_view(
    statuses: Statuses, port: int, host: str = "127.0.0.1", access_token: str | None = None
) -> Served:
    """Serve :func:`app` on ``host:port`` (0: a free port) in a daemon thread, once it
    answers; ``close()`` stops it. A ``host`` beyond loopback needs ``access_token``
    (:func:`check_host`)."""
    check_host(host, access_token)
    view = app(statuses, access_token=access_token)
    server = uvicorn.Server(
        uvicorn.Config(view, host=host, port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, name="ackstream-ui", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise OSError(f"the live view could not listen on {host}:{port}")
        time.sleep(0.05)
    bound = server.servers[0].sockets[0].getsockname()[1]

    def close() -> None:
        server.should_exit = True
        thread.join(timeout=10)

    return Served(f"http://{host}:{bound}/", close)
