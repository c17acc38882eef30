"""The console of a long-running command (``ackstream run``, ``ackstream acker``): it
shows ackstream's own lines, and Ctrl-C asks the command to stop
(:func:`ackstream.spark.driver.interrupts`, which the command's wait polls).

:class:`LogFile`: Spark's JVM log, the stderr of the Python workers Spark starts, and
Python's logging records (pyspark's, py4j's, ackstream's, the topology file's) go to
one file, which the command names when it ends badly; ``verbose`` leaves them all on
the console instead. That includes the records of pyspark's loggers that write to
stderr of their own accord (:data:`ackstream.spark.driver.PYSPARK_ERROR_LOGGERS`).

No Spark import: ``ackstream --help`` stays fast.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Iterator

from ackstream.spark.driver import pyspark_error_loggers

__all__ = ["LogFile"]

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class LogFile:
    """A fresh file in the temporary folder for ``command``'s logs (none if
    ``verbose``); Python's logging writes there while the object is entered."""

    def __init__(self, command: str, verbose: bool = False):
        self.path: str | None = None
        if not verbose:
            fd, self.path = tempfile.mkstemp(prefix=f"ackstream-{command}-", suffix=".log")
            os.close(fd)
        self._handler: logging.Handler | None = None
        self._pyspark_handlers: dict[logging.Logger, list[logging.Handler]] = {}

    def __enter__(self) -> LogFile:
        if self.path is not None:
            self._handler = logging.FileHandler(self.path)
            self._handler.setFormatter(logging.Formatter(_FORMAT))
            logging.getLogger().addHandler(self._handler)
            for logger in pyspark_error_loggers():
                self._pyspark_handlers[logger] = logger.handlers
                logger.handlers = [self._handler]  # not addHandler: pyspark's sets JSON
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handler is not None:
            for logger, handlers in self._pyspark_handlers.items():
                logger.handlers = handlers
            self._pyspark_handlers = {}
            logging.getLogger().removeHandler(self._handler)
            self._handler.close()
            self._handler = None

    @contextlib.contextmanager
    def launching(self) -> Iterator[None]:
        """While Spark's JVM is launched from this process: the JVM inherits the log
        as its stderr, and so do the Python workers it starts later."""
        if self.path is None:
            yield
            return
        sys.stderr.flush()
        console = os.dup(2)
        with open(self.path, "a") as log:
            os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(console, 2)
            os.close(console)

    def named(self) -> str:
        """`` (log: PATH)`` for a line that ends the command, or "" if ``verbose``."""
        return "" if self.path is None else f" (log: {self.path})"

    def discard(self) -> None:
        """The command ended well: nobody will read the log."""
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)
