"""Waiting for a started topology in a plain ``python`` or ``spark-submit`` script,
where Ctrl-C must stop it cleanly: :func:`await_topology`.

A ``KeyboardInterrupt`` raised while the main thread is inside py4j's call to
``awaitTermination`` breaks that call's connection, and py4j and pyspark then log
tracebacks by the dozen. Here Ctrl-C only sets an event
(:func:`~ackstream.spark.driver.interrupts`) the wait polls between short calls; the
topology stops (its batch in progress first), one line says so, the session stops
(so that the Python workers Spark started end without their own tracebacks), and
the script exits with status 130 as an interrupted command does. A second Ctrl-C raises
``KeyboardInterrupt`` at once.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Protocol

from ackstream.spark.driver import interrupts

__all__ = ["await_topology"]

#: How long one call into the JVM waits before Ctrl-C is looked at again (s).
POLL_S = 0.5


class Stoppable(Protocol):
    """What waiting reads of a started topology (``RunningTopology`` is one)."""

    query: Any
    spark: Any

    def stop(self) -> None: ...


def await_topology(running: Stoppable, timeout_s: float | None = None) -> bool:
    """Block until the topology query of ``running`` (a
    :class:`~ackstream.topology.RunningTopology`) stops (True; its error raised if it
    failed) or ``timeout_s`` passes (False). Ctrl-C: see the module doc."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    with interrupts() as pressed:
        while not pressed.is_set():
            wait = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            if wait <= 0:
                return False
            if running.query.awaitTermination(wait):
                return True
    print(
        f"ackstream: interrupted, stopping topology {running.query.name}",
        file=sys.stderr,
        flush=True,
    )
    running.stop()
    if running.spark is not None:  # the workers Spark started end with it, quietly
        running.spark.stop()
    raise SystemExit(130)
