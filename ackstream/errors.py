"""Errors callers can catch by type; each names what is at fault and what to do."""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = [
    "AckstreamError",
    "OptionError",
    "EnvironmentProblem",
    "StageError",
    "Unreachable",
    "cause_of",
    "worker_exit",
]

_SECRET = re.compile(r"password|secret|jaas|token|credential", re.IGNORECASE)


class AckstreamError(Exception):
    """Root of every error ackstream raises on purpose."""


class OptionError(AckstreamError, ValueError):
    """An option has a value ackstream cannot use. The value of an option whose name
    says it holds a secret (a password, a JAAS config) is never shown."""

    def __init__(self, option: str, value: object, allowed: str):
        if _SECRET.search(str(option)) and value is not None:
            value = "***"
        self.option, self.value, self.allowed = option, value, allowed
        super().__init__(f"option {option!r} = {value!r} is not valid: expected {allowed}")


class EnvironmentProblem(AckstreamError, RuntimeError):
    """Something outside ackstream (Java, a broker, a path) is missing or wrong."""

    def __init__(self, what: str, fix: str):
        self.what, self.fix = what, fix
        super().__init__(f"{what}. {fix}")


class StageError(AckstreamError, ValueError):
    """A bolt stage is declared or written so that ackstream cannot track its tuples."""

    def __init__(self, stage: str, problem: str):
        self.stage, self.problem = stage, problem
        super().__init__(f"stage {stage!r}: {problem}")


class Unreachable(AckstreamError):
    """A sink's destination (a broker) timed out or could not be reached: the
    environment's fault, not the rows'. The batch waits, charging no record, and asks
    ``answers()`` (a cheap probe, e.g. a metadata request; True once it answers) until
    it may write again (:mod:`ackstream.topology.outage`)."""

    def __init__(self, what: str, error: str, answers: Callable[[], bool]):
        self.what, self.error, self.answers = what, error, answers
        super().__init__(f"{what} unreachable: {error}")


def cause_of(text: str) -> str:
    """The line of an error's text that says what went wrong, as ``Type: message``:
    ackstream's own error if the text holds one, else the last Python exception, else
    its first line. The text may be a Python traceback or Spark's wrapping of one (a
    ``StreamingQueryException``, an ``AnalysisException``, py4j's "An exception was
    raised by the Python Proxy"), whose Python tracebacks sit inside its message.

    >>> cause_of("An exception was raised by the Python Proxy. Return Message: "
    ...          "Traceback (most recent call last):\\n  File 'x.py', line 1, in f\\n"
    ...          "ackstream.errors.StageError: stage 'm': lost _root\\n\\n=== Query ===")
    "StageError: stage 'm': lost _root"
    >>> cause_of("Traceback (most recent call last):\\n  File 'x.py', line 1, in f\\n"
    ...          "kafka.errors.KafkaTimeoutError: KafkaTimeoutError: Expiring 1 record(s)")
    'KafkaTimeoutError: Expiring 1 record(s)'

    A failed Spark job seen through py4j names the task's own error, not py4j's call:

    >>> cause_of("An error occurred while calling o7.getResult.\\n: org.apache.spark."
    ...          "SparkException: Job aborted due to stage failure: Task 3 in stage 2.0 "
    ...          "failed 1 times, most recent failure: Lost task 3.0 in stage 2.0 (TID 9) "
    ...          "(host executor driver): java.lang.OutOfMemoryError: Java heap space\\n"
    ...          "\\tat java.base/java.util.Arrays.copyOf(Arrays.java:3537)")
    'OutOfMemoryError: Java heap space'
    """
    raised, in_traceback = [], False
    for line in text.splitlines():
        if in_traceback and line and not line[0].isspace():
            raised.append(line)  # the line after a traceback's frames
            in_traceback = False
        in_traceback = in_traceback or line.rstrip().endswith("Traceback (most recent call last):")
    ours = [line for line in raised if line.startswith("ackstream.")]
    first = [line.strip() for line in text.splitlines() if line.strip()][:1]
    task = re.search(r"most recent failure: Lost task [^\n]*?\) ?\([^)\n]*\): ([^\n]+)", text)
    if task is not None:  # a Spark job's failure: the task's own error
        first = [task.group(1).strip()]
    found = (ours or raised or first or [""])[-1]
    named = re.match(r"(?:\w+\.)*(\w+): (?:\1: )?(.*)", found)
    return f"{named.group(1)}: {named.group(2)}" if named else found


#: Spark's words when the process of a Python worker ended in the middle of a task.
_WORKER_EXITED = "Python worker exited unexpectedly (crashed)"


def worker_exit(text: str) -> str | None:
    """What Spark's error ``text`` says of a Python worker whose process ended in the
    middle of a task (``os._exit``, a signal, the out-of-memory killer, a crash): None
    when it tells of none, else the line Spark adds to its words, "" when it adds none.
    With ``spark.python.worker.faulthandler.enabled`` a crash adds the fault handler's
    first line; Spark 4.3 adds no exit code.

    >>> worker_exit("SparkException: Python worker exited unexpectedly (crashed). "
    ...             "Consider setting 'spark.python.worker.faulthandler.enabled'...")
    ''
    >>> worker_exit("SparkException: Python worker exited unexpectedly (crashed): "
    ...             "Fatal Python error: Segmentation fault\\n\\nCurrent thread 0x1:")
    'Fatal Python error: Segmentation fault'
    >>> worker_exit("ValueError: not a number") is None
    True
    """
    at = text.find(_WORKER_EXITED)
    if at < 0:
        return None
    after = text[at + len(_WORKER_EXITED) :]
    added = after[1:] if after.startswith(":") else after[2:] if after.startswith(" -") else ""
    return (added.splitlines() or [""])[0].strip()
