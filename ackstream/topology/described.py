"""What a started topology says of itself beside its checkpoint: its declared graph,
and whether it runs.

``ackstream status --checkpoint`` and the live view read the topology's history from
its channel and checkpoint, with or without the process that runs it; these two files
in ``<checkpoint>/topology`` tell them what the channel cannot:

- :data:`GRAPH_FILE`, written at ``start()``: the stages and sinks, the streams each
  reads, each stage's kind, and the reason a ``fail_where`` or ``reject_where`` stage
  gives when it is a fixed text. ``status`` draws the graph from it, and charges a
  failure whose reason does not begin with a stage's name to the stage whose fixed
  reason it is.
- :data:`RUN_FILE`, kept by a Spark streaming listener in the process that started
  the query: that process's pid and host, when it started, its last batch (id,
  duration, rows and input and processing rates, from the source's own count of
  the records it read: Spark's ``numInputRows`` leaves out what its Kafka connector
  reads), the records read since it started, when it was last heard from (each
  progress, and each idle trigger Spark reports), when it stopped and why, and
  Spark's UI address. A process that is killed says nothing: :func:`read_run` then
  tells by the pid (on the same host) that it is gone, or by the silence (from
  elsewhere) that it does not respond.
- :data:`PAUSED_FILE`, while a batch waits for a sink that does not answer
  (:mod:`ackstream.topology.outage`): the sink, since when and why; :func:`read_run`
  gives it as the run's ``paused``.

Under Spark Connect the listener would run beside the server, not here: the run file
then says when the query started and nothing after.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column
from pyspark.sql.streaming import StreamingQueryListener

from ackstream.spark.session import is_connect
from ackstream.topology.graph import SPOUT
from ackstream.vocabulary.clock import now_ms

__all__ = [
    "GRAPH_FILE",
    "PAUSED_FILE",
    "RUN_FILE",
    "SILENT_MS",
    "RunRecorder",
    "describe",
    "read_graph",
    "read_run",
    "record_run",
    "source_metrics",
    "sql_text",
    "write_graph",
]

log = logging.getLogger(__name__)

#: The declared graph's file in a topology query's checkpoint folder.
GRAPH_FILE = "ackstream-graph.json"
#: The run's state file in a topology query's checkpoint folder.
RUN_FILE = "ackstream-run.json"
#: How long a running query may go unheard before :func:`read_run` says it does not
#: respond (at least: twice its last batch's duration, if longer). Spark reports an idle
#: trigger every ``spark.sql.streaming.noDataProgressEventInterval`` (10 s by default).
SILENT_MS = 60_000
#: In a topology query's checkpoint folder while a batch waits for its sink: ``{"sink",
#: "since_ms", "error", "retry_s"}``.
PAUSED_FILE = "ackstream-paused.json"


def sql_text(column: Column | str) -> str:
    """``column`` as SQL text (``((offset % 7) = 3)``), not pyspark's repr
    (``Column<'=(%(offset, 7), 3)'>``: Spark prints an expression's operators as calls);
    a string as it is."""
    text = str(column)
    if isinstance(column, str):
        return text
    if text.startswith("Column<'") and text.endswith("'>"):
        text = text[len("Column<'") : -len("'>")]
    try:
        return _infix(text)
    except ValueError:  # not the call form: as Spark printed it
        return text


#: Spark's operators, printed as calls (``=(a, b)``), written between their operands.
_INFIX = {
    "=": "=", "==": "=", "<=>": "<=>", "!=": "!=", "<": "<", "<=": "<=", ">": ">",
    ">=": ">=", "+": "+", "-": "-", "*": "*", "/": "/", "%": "%", "and": "AND", "or": "OR",
}  # fmt: skip


def _infix(text: str) -> str:
    """``=(%(offset, 7), 3)`` -> ``((offset % 7) = 3)``, ``!(x)`` -> ``(NOT x)``,
    ``isNull(x)`` -> ``(x IS NULL)``; other calls and atoms as they are. Raises
    ValueError on unbalanced text."""
    text = text.strip()
    cut = text.find("(")
    if cut <= 0 or not text.endswith(")") or text[0] in "'\"`":
        return text
    name, args = text[:cut].strip(), _split(text[cut + 1 : -1])
    parts = [_infix(a) for a in args]
    if name.lower() in _INFIX and len(parts) == 2:
        return f"({parts[0]} {_INFIX[name.lower()]} {parts[1]})"
    if name in ("!", "not") and len(parts) == 1:
        return f"(NOT {parts[0]})"
    if name in ("isNull", "isNotNull") and len(parts) == 1:
        return f"({parts[0]} IS {'NOT ' if name == 'isNotNull' else ''}NULL)"
    return f"{name}({', '.join(parts)})"


def _split(text: str) -> list[str]:
    """The comma-separated arguments of a call, commas in quotes or parentheses kept."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ValueError(text)
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth or quote:
        raise ValueError(text)
    return [*parts, text[start:]] if text.strip() else parts


def describe(stages: Sequence[Any], sinks: Sequence[Any]) -> dict[str, Any]:
    """The declared graph: ``{"nodes": [{"name", "kind", "after", "reason"}, ...]}``,
    the spout first, then stages and sinks in declaration order (a topological order);
    ``reason`` is a fail or reject stage's fixed reason text, else None."""
    nodes: list[dict[str, Any]] = [{"name": SPOUT, "kind": "spout", "after": [], "reason": None}]
    for stage in stages:
        reason = getattr(stage, "fixed_reason", None)
        nodes.append(
            {"name": stage.name, "kind": stage.kind, "after": list(stage.after), "reason": reason}
        )
    for sink in sinks:
        nodes.append(
            {
                "name": sink.name,
                "kind": f"sink: {type(sink.sink).__name__}",
                "after": list(sink.after),
                "reason": None,
            }
        )
    return {"nodes": nodes}


def write_graph(folder: str, graph: dict[str, Any]) -> None:
    """Write ``graph`` (:func:`describe`) to ``folder``'s :data:`GRAPH_FILE`, replaced whole."""
    _write(os.path.join(folder, GRAPH_FILE), graph)


def read_graph(folder: str) -> dict[str, Any] | None:
    """The graph :func:`write_graph` wrote in ``folder``, or None."""
    return _read(os.path.join(folder, GRAPH_FILE))


def read_run(folder: str, now: int | None = None) -> dict[str, Any] | None:
    """The run state a :class:`RunRecorder` keeps in ``folder``, or None: ``{"state":
    "running" | "stopped" | "not responding", "pid", "host", "started_ms",
    "heard_ms", "stopped_ms", "error", "spark_ui", "read", "last_batch": {"id",
    "duration_ms", "input_per_s", "processed_per_s", "rows", "ended_ms"} | None,
    "paused": {"sink", "since_ms", "error", "retry_s"} | None}``: ``paused`` while a
    batch of the running query waits for its sink (a pause file older than the run's
    start is a killed process's, not this run's).

    The file says running until its process says otherwise; what it says is checked
    (``now``: the time to check against, ms), unless the query runs under Spark
    Connect (``"listened": false``): a process on this host that is gone is
    ``"stopped"`` without a ``stopped_ms`` (it was killed or crashed: the error says
    so), one not heard from for :data:`SILENT_MS` (or twice its last batch's
    duration) ``"not responding"`` since ``heard_ms``."""
    run = _read(os.path.join(folder, RUN_FILE))
    if run is not None:
        paused = _read(os.path.join(folder, PAUSED_FILE))
        running = run.get("state") == "running"
        since = None if paused is None else paused.get("since_ms")
        fresh = isinstance(since, int) and since >= (run.get("started_ms") or 0)
        run["paused"] = paused if running and fresh else None
    if run is None or run.get("state") != "running" or run.get("listened") is False:
        return run  # a query under Spark Connect runs whatever becomes of this process
    pid, host = run.get("pid"), run.get("host")
    if pid and host == socket.gethostname() and not _alive(pid):
        said = f"its process (pid {pid} on {host}) ended without stopping the query: killed?"
        return {**run, "state": "stopped", "stopped_ms": None, "error": said}
    batch_ms = (run.get("last_batch") or {}).get("duration_ms") or 0
    if (now_ms() if now is None else now) - run["heard_ms"] > max(SILENT_MS, 2 * batch_ms):
        return {**run, "state": "not responding"}
    return run


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` is there on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's
        return True
    return True


def source_metrics(progress: Any) -> dict[str, Any] | None:
    """The ``ackstream`` source's metrics in a ``StreamingQueryProgress`` (as
    ``query.lastProgress`` or a listener's event gives it, or its JSON as a dict):
    acked, failed, timed_out, rejected, replayed and dead_lettered since the checkpoint
    began, pending roots, records ``read`` since the source started, and per topic and
    partition ``end``, ``committed`` and ``lag``. Spark shows them as the source's
    ``latestOffset`` (see ``Spout.metrics``). None if no source reported them.

    >>> source_metrics({"sources": [{"latestOffset": '{"acked": 3, "pending": 1, '
    ...                              '"partitions": {"t": {"0": {"lag": 1}}}}'}]})["acked"]
    3
    """
    for source in (progress or {}).get("sources", ()):
        latest = source.get("latestOffset")
        try:
            latest = json.loads(latest) if isinstance(latest, str) else latest
        except ValueError:
            continue
        if isinstance(latest, dict) and {"pending", "partitions"} <= latest.keys():
            return latest
    return None


def record_run(folder: str, running: Any) -> None:
    """Keep the run file of ``running`` (a started topology's
    :class:`~ackstream.topology.running.RunningTopology`) in ``folder`` from now on."""
    spark = running.spark
    connect = is_connect(spark)
    spark_ui = None if connect else spark.sparkContext.uiWebUrl
    recorder = RunRecorder(folder, str(running.query.id), spark_ui, listened=not connect)
    if not connect:
        recorder.streams = spark.streams
        spark.streams.addListener(recorder)


class RunRecorder(StreamingQueryListener):
    """Keeps :data:`RUN_FILE` of the query ``query_id`` (see the module doc). Spark
    calls it for every query of the session: it answers to its own only, and takes
    itself off the session's ``streams`` (when given) once its query has stopped.
    ``listened``: whether Spark will call it (not under Spark Connect, where the query
    runs in the server: then neither this process's end nor its silence says anything
    of the query's)."""

    streams: Any = None

    def __init__(self, folder: str, query_id: str, spark_ui: str | None, *, listened: bool = True):
        self.path = os.path.join(folder, RUN_FILE)
        self.query_id = query_id
        self.state: dict[str, Any] = {
            "state": "running",
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_ms": now_ms(),
            "heard_ms": now_ms(),
            "stopped_ms": None,
            "error": None,
            "spark_ui": spark_ui,
            "listened": listened,
            "read": None,
            "last_batch": None,
        }
        self._save()

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's name
        pass

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802 - Spark's name
        """The batch's rows are the records the source counted read since the last
        progress (an idle trigger's planning included), else Spark's ``numInputRows``;
        its input rate is those rows over the time since the last progress, its
        processing rate over the batch's duration, as Spark's rates are."""
        progress = event.progress
        if str(progress.id) != self.query_id:
            return
        now = now_ms()
        metrics = source_metrics(progress)
        read = None if metrics is None else metrics.get("read")
        if read is None:
            rows = progress.numInputRows
        else:  # a source that started again counts from 0
            before = self.state["read"] or 0
            rows = read - before if read >= before else read
        took = (progress.durationMs or {}).get("triggerExecution")
        since = self.state["last_batch"]["ended_ms"] if self.state["last_batch"] else None
        waited = now - (self.state["started_ms"] if since is None else since)
        self.state["heard_ms"], self.state["read"] = now, read
        self.state["last_batch"] = {
            "id": progress.batchId,
            "duration_ms": took,
            "input_per_s": _per_s(rows, waited),
            "processed_per_s": _per_s(rows, took),
            "rows": rows,
            "ended_ms": now,
        }
        self._save()

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802 - Spark's name
        if str(event.id) == self.query_id:
            self.state["heard_ms"] = now_ms()
            self._save()

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802 - Spark's name
        if str(event.id) != self.query_id:
            return
        self.state.update(state="stopped", stopped_ms=now_ms(), heard_ms=now_ms())
        said = (event.exception or "").strip()
        self.state["error"] = said.splitlines()[0][:500] if said else None
        self._save()
        if self.streams is not None:  # not from Spark's listener thread, which calls this
            streams, self.streams = self.streams, None
            threading.Thread(target=streams.removeListener, args=(self,), daemon=True).start()

    def _save(self) -> None:
        try:
            _write(self.path, self.state)
        except OSError as error:  # a full disk must not stop Spark's listener bus
            log.warning("could not write %s: %s", self.path, error)


def _per_s(rows: int | None, ms: int | None) -> float | None:
    return None if rows is None or not ms else rows * 1000 / ms


def _write(path: str, value: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    hidden = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")
    with open(hidden, "w") as f:
        json.dump(value, f)
    os.replace(hidden, path)


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            value: dict[str, Any] = json.load(f)
            return value
    except (FileNotFoundError, ValueError):
        return None
