"""A topology's figures as Prometheus metrics, from ``prometheus_client``.

:class:`StatusCollector` turns the :class:`~ackstream.ui.status.Status` of one or more
topologies into metric families, read again at every scrape: the figures live in the
channel, the checkpoint and the group's offsets (what ``ackstream status`` reads), not
in this process, so they are exposed the way Prometheus' docs advise for figures kept
elsewhere (a custom collector), and a restarted process reports the same counts.
One registry serves all three ways out: :func:`exposition` (``ackstream status
--prometheus``), :func:`serve_metrics` (``ackstream run --metrics-port``) and the live view's
``/metrics`` (:mod:`ackstream.ui.view`).

Every sample has the label ``topology``. The families (``ackstream_`` prefix):

======================================  =========  ===============================
name                                    type       labels
======================================  =========  ===============================
``roots_total``                         counter    ``outcome`` (acked, failed,
                                                   timed_out, rejected)
``roots_replayed_total``                counter
``dead_letters_total``                  counter
``records_read_total``                  counter
``failed_by_stage_total``               counter    ``stage``
``rejected_by_stage_total``             counter    ``stage``
``stage_tuples_total``                  counter    ``stage``, ``side`` (in, out)
``complete_latency_seconds``            histogram
``roots_pending``                       gauge
``held``                                gauge      ``stage``, ``of`` (tuples, roots)
``partition_end``, ``_committed``,      gauge      ``topic``, ``partition``
``_lag``
``paused_seconds``                      gauge
======================================  =========  ===============================

``paused_seconds``: how long a batch has waited for a sink that does not answer (the
topology is paused, :mod:`ackstream.topology.outage`), 0 when none waits; only for a
topology whose run state is known (a checkpoint).

The ``stage`` label of the failures per stage is bounded (:func:`bounded_stages`): at
most :data:`MAX_STAGE_LABELS` values a topology, each at most
:data:`MAX_STAGE_LABEL_CHARS` long, the rest under ``(other)``; no reason text.

Rates and quantiles are left to the server (``rate()``, ``histogram_quantile()``).

>>> from ackstream.ui.status import Status
>>> s = Status("words", "", 3, 1, 2, 0, 0, 0, 0, 0, 0, 0, None,
...            latency_histogram={"buckets": [[100, 1], [1000, 2]], "count": 2, "sum": 400.0})
>>> text = exposition([s])
>>> "# TYPE ackstream_complete_latency_seconds histogram" in text.splitlines()
True
>>> 'ackstream_roots_total{outcome="acked",topology="words"} 2.0' in text.splitlines()
True
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ackstream.ui.status import Status
from ackstream.ui.status_sources import StatusSource

__all__ = [
    "MAX_STAGE_LABELS",
    "Served",
    "MAX_STAGE_LABEL_CHARS",
    "OTHER_STAGES",
    "Statuses",
    "StatusCollector",
    "exposition",
    "bounded_stages",
    "families",
    "registry_of",
    "serve",
    "serve_metrics",
]

log = logging.getLogger(__name__)


#: The most ``stage`` label values a family of failures per stage takes per topology;
#: the others are summed under :data:`OTHER_STAGES`.
MAX_STAGE_LABELS = 20
#: The longest ``stage`` label value: a stage's name, not a reason's text.
MAX_STAGE_LABEL_CHARS = 64
OTHER_STAGES = "(other)"


def bounded_stages(by_stage: dict[str, int]) -> dict[str, int]:
    """``by_stage`` with a bounded set of keys, for the ``stage`` label: each cut to
    :data:`MAX_STAGE_LABEL_CHARS`, the :data:`MAX_STAGE_LABELS` most counted kept and
    the rest summed under :data:`OTHER_STAGES`. Failures are charged to the text their
    reason starts with, which for a reason with no stage's name in it is free text:
    unbounded label values would make a series per reason in Prometheus.

    >>> bounded_stages({"parse": 3, "x" * 100: 1})
    {'parse': 3, 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx': 1}
    >>> len(bounded_stages({f"reason {i}": i for i in range(50)}))
    21
    """
    cut: dict[str, int] = {}
    for stage, n in by_stage.items():
        key = stage[:MAX_STAGE_LABEL_CHARS]
        cut[key] = cut.get(key, 0) + n
    ranked = sorted(cut.items(), key=lambda kv: (-kv[1], kv[0]))
    kept = dict(ranked[:MAX_STAGE_LABELS])
    rest = sum(n for _, n in ranked[MAX_STAGE_LABELS:])
    if rest:
        kept[OTHER_STAGES] = kept.get(OTHER_STAGES, 0) + rest
    return kept


def families(statuses: Iterable[Status]) -> list[Metric]:
    """The metric families of ``statuses`` (one per topology; see the module doc)."""
    statuses = list(statuses)

    def counter(name: str, text: str, labels: Sequence[str] = ()) -> CounterMetricFamily:
        return CounterMetricFamily(f"ackstream_{name}", text, labels=["topology", *labels])

    def gauge(name: str, text: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
        return GaugeMetricFamily(f"ackstream_{name}", text, labels=["topology", *labels])

    roots = counter("roots", "Completed roots by outcome.", ["outcome"])
    replayed = counter("roots_replayed", "Failed or timed-out roots whose record is read again.")
    dead = counter("dead_letters", "Records dead-lettered.")
    read = counter(
        "records_read",
        "Records the source's batches read since it started (a local channel, or a "
        "checkpoint given).",
    )
    failed = counter(
        "failed_by_stage", "Failed and timed-out roots by the stage at fault.", ["stage"]
    )
    rejected = counter("rejected_by_stage", "Rejected roots by the stage at fault.", ["stage"])
    tuples = counter(
        "stage_tuples", "Tuples each stage and sink read and emitted.", ["stage", "side"]
    )
    latency = HistogramMetricFamily(
        "ackstream_complete_latency_seconds",
        "Complete latency (init to ack) of the acked roots.",
        labels=["topology"],
    )
    pending = gauge("roots_pending", "Roots with an init record and no completion yet.")
    held = gauge("held", "Tuples and roots a window or join stage holds.", ["stage", "of"])
    paused = gauge("paused_seconds", "How long a batch has waited for an unreachable sink.")
    parts = {
        name: gauge(f"partition_{name}", text, ["topic", "partition"])
        for name, text in (
            ("end", "The end offset of each upstream partition."),
            ("committed", "The offset the source's group committed, per partition."),
            ("lag", "Offsets not yet acked or dead-lettered, per partition."),
        )
    }
    for s in statuses:
        t = s.topology
        for outcome in ("acked", "failed", "timed_out", "rejected"):
            roots.add_metric([t, outcome], getattr(s, outcome))
        replayed.add_metric([t], s.replayed)
        if s.dead_lettered is not None:
            dead.add_metric([t], s.dead_lettered)
        if s.read is not None:
            read.add_metric([t], s.read)
        for family, by_stage in ((failed, s.failed_by_stage), (rejected, s.rejected_by_stage)):
            for stage, n in bounded_stages(by_stage or {}).items():
                family.add_metric([t, stage], n)
        for stage, sides in (s.stages or {}).items():
            for side, n in sides.items():
                tuples.add_metric([t, stage, side], n)
        if s.latency_histogram is not None:
            h = s.latency_histogram
            buckets = [(f"{le / 1000:g}", n) for le, n in h["buckets"]]
            latency.add_metric([t], [*buckets, ("+Inf", h["count"])], h["sum"] / 1000)
        pending.add_metric([t], s.pending)
        if s.run is not None:
            since = (s.run.get("paused") or {}).get("since_ms")
            paused.add_metric([t], 0.0 if since is None else max(0.0, time.time() - since / 1000))
        for stage, n in (s.held or {}).items():
            for what in ("tuples", "roots"):
                held.add_metric([t, stage, what], n[what])
        for topic, partitions in (s.partitions or {}).items():
            for p, m in partitions.items():
                for name, gauged in parts.items():
                    gauged.add_metric([t, topic, str(p)], m[name])
    every: list[Metric] = [
        roots,
        replayed,
        dead,
        read,
        failed,
        rejected,
        tuples,
        latency,
        pending,
        held,
        paused,
        *parts.values(),
    ]
    return [family for family in every if family.samples]


class StatusCollector(Collector):
    """A ``prometheus_client`` collector of the statuses ``read()`` returns at each
    scrape (a topology whose status cannot be read is left out, and logged)."""

    def __init__(self, read: Callable[[], Iterable[Status]]):
        self._read = read

    def collect(self) -> Iterator[Metric]:
        yield from families(self._read())

    def describe(self) -> list[Metric]:
        return []  # no read at registration: the families come with each scrape


def registry_of(read: Callable[[], Iterable[Status]]) -> CollectorRegistry:
    """A registry of its own (not the process-wide default) holding a
    :class:`StatusCollector` of ``read``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(read))
    return registry


def exposition(statuses: Iterable[Status]) -> str:
    """``statuses`` in Prometheus' text exposition format (``status --prometheus``)."""
    statuses = list(statuses)
    return generate_latest(registry_of(lambda: statuses)).decode()


class Statuses:
    """The statuses of some topologies, read at most every ``min_interval_s`` however
    often they are asked for (a scrape and the live view's page may ask together);
    ``sources()`` names them (it may change: ``ackstream run`` adds those it starts).
    Thread-safe; a topology that cannot be read keeps its last status."""

    def __init__(
        self,
        sources: Callable[[], Iterable[StatusSource]],
        window_s: float = 60.0,
        min_interval_s: float = 2.0,
    ):
        self.sources, self.window_s, self.min_interval_s = sources, window_s, min_interval_s
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self._last: dict[str, Status] = {}
        self.errors: dict[str, str] = {}  #: per topology, why its last read failed

    def __call__(self) -> list[Status]:
        with self._lock:
            if time.monotonic() - self._read_at >= self.min_interval_s:
                self._read_at = time.monotonic()
                for source in self.sources():
                    try:
                        self._last[source.topology] = source.read(self.window_s)
                        self.errors.pop(source.topology, None)
                    except Exception as error:  # a broker down: keep the last figures
                        log.warning("could not read the status of %s: %s", source.topology, error)
                        self.errors[source.topology] = f"{type(error).__name__}: {error}"
            return list(self._last.values())


def serve(
    port: int, read: Callable[[], Iterable[Status]], addr: str = "127.0.0.1"
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``/metrics`` on ``addr:port`` in a daemon thread (``prometheus_client``'s
    own server); returns ``(server, thread)``. ``port=0`` takes a free port:
    ``server.server_port`` tells which."""
    return start_http_server(port, addr=addr, registry=registry_of(read))


@dataclass
class Served:
    """A server this process runs in a thread: where it answers, and how to stop it."""

    url: str
    close: Callable[[], None]


def serve_metrics(
    read: Callable[[], Iterable[Status]], port: int, host: str = "127.0.0.1"
) -> Served:
    """Serve ``/metrics`` of ``read`` (e.g. :class:`Statuses`) on ``host:port`` with
    ``prometheus_client``'s own server (no web framework: ``run --metrics-port`` needs
    no ``ui`` extra); ``close()`` stops it."""
    server, thread = serve(port, read, addr=host)

    def close() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)

    return Served(f"http://{host}:{server.server_port}/", close)
