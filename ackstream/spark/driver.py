"""The driver process around pyspark's calls into the JVM: Ctrl-C, and pyspark's loggers.

- :func:`interrupts`: Ctrl-C sets an event the caller polls, instead of raising
  ``KeyboardInterrupt`` wherever the main thread is: pyspark's own handler cancels
  Spark's jobs and raises, and a ``KeyboardInterrupt`` in the middle of a py4j call
  breaks that call's connection (py4j then logs its tracebacks). A second Ctrl-C
  raises ``KeyboardInterrupt``, for a stop that does not return. A started
  topology's wait (:mod:`ackstream.topology.awaiting`) and the long-running commands
  (:mod:`ackstream.cli.queries`) poll it.
- :data:`PYSPARK_ERROR_LOGGERS`: pyspark's loggers that write each Spark error they
  convert to stderr of their own accord; the topology quiets them while it analyses
  a stage, and a command's log file (:class:`ackstream.cli.console.LogFile`) takes
  their records.

No Spark import at the top: ``ackstream --help`` stays fast.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import types
from collections.abc import Iterator

__all__ = ["PYSPARK_ERROR_LOGGERS", "interrupts", "pyspark_error_loggers"]

#: pyspark's loggers that write each Spark error carrying a query context, the JVM's
#: stack trace with it, to stderr whenever pyspark converts one, also one ackstream
#: handles (a batch that fails as a whole); they do not propagate to the root logger.
PYSPARK_ERROR_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")


def pyspark_error_loggers() -> list[logging.Logger]:
    """The loggers of :data:`PYSPARK_ERROR_LOGGERS`, made as pyspark makes them."""
    # imported here, not above: only what runs Spark asks for them, and ackstream --help
    # stays fast
    from pyspark.logger import PySparkLogger

    return [PySparkLogger.getLogger(name) for name in PYSPARK_ERROR_LOGGERS]


@contextlib.contextmanager
def interrupts() -> Iterator[threading.Event]:
    """An event Ctrl-C sets (see the module doc); the handler before is restored after.
    Outside the main thread, where no signal handler can be set, an event never set."""
    pressed = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield pressed
        return

    def first(signum: int, frame: types.FrameType | None) -> None:
        pressed.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    before = signal.signal(signal.SIGINT, first)
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, before)
