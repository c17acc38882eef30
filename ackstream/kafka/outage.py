"""How long the brokers have failed to answer, and when that is too long.

A broker restarted from its log, a leader election or a stall makes Kafka calls fail
for a while. The long-lived callers (the source's planner, the acks topic's planner,
the spout's completion polls) see such a failure as "no news yet" and try again with a
fresh client; only an outage longer than
:data:`~ackstream.kafka.settings.OUTAGE_LIMIT_S` (as long as Spark's Kafka source
waits) fails the query, naming the brokers and what to check.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ackstream.errors import EnvironmentProblem
from ackstream.kafka.settings import OUTAGE_LIMIT_S

__all__ = ["RETRY_PAUSE_S", "Outage", "is_outage"]

#: The pause between two attempts at a broker call, each with a new client.
RETRY_PAUSE_S = 1.0

log = logging.getLogger(__name__)


class Outage:
    """The failures of one caller's Kafka calls since its last answer.

    >>> clock = iter([0.0, 60.0, 121.0])
    >>> outage = Outage("127.0.0.1:9092", clock=lambda: next(clock))
    >>> outage.failed("offsets", TimeoutError("no answer"))  # 0 s: a warning
    >>> outage.failed("offsets", TimeoutError("no answer"))  # 60 s: a warning
    >>> # 121 s: too long
    >>> outage.failed("offsets", TimeoutError("no answer"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ackstream.errors.EnvironmentProblem: ...
    """

    def __init__(self, bootstrap: str, clock: Callable[[], float] = time.monotonic):
        self.bootstrap, self.clock = bootstrap, clock
        self.since: float | None = None  # the clock's time of the first failure

    def failed(self, what: str, error: BaseException) -> None:
        """Record a failed call; raise :class:`EnvironmentProblem` once the brokers have
        failed for longer than ``OUTAGE_LIMIT_S``, else log a warning."""
        now = self.clock()
        self.since = now if self.since is None else self.since
        if now - self.since > OUTAGE_LIMIT_S:
            raise EnvironmentProblem(
                f"the Kafka brokers at {self.bootstrap} did not answer ({what}) for "
                f"{now - self.since:.0f} s: {error!r}",
                "Check that the brokers are up; a slow cluster may need a larger "
                "kafka.request.timeout.ms.",
            ) from error
        log.warning("%s: no answer from the brokers at %s (%r)", what, self.bootstrap, error)

    def answered(self) -> None:
        """A call succeeded: the outage, if any, is over."""
        self.since = None


def is_outage(error: BaseException) -> bool:
    """Whether a Kafka ``error`` may pass once the brokers answer again (a timeout, a
    connection lost, a leader moving, a client that gave up on them), rather than a
    refusal that asking again cannot change: credentials, permissions, a protocol the
    brokers lack, a client's own configuration."""
    from kafka import errors

    lasting = (
        errors.AuthorizationError,
        errors.SaslAuthenticationFailedError,
        errors.UnsupportedVersionError,
        errors.InvalidTopicError,
        errors.KafkaConfigurationError,
        errors.IllegalArgumentError,
    )
    return isinstance(error, errors.KafkaError) and not isinstance(error, lasting)
