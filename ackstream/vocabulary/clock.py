"""Wall-clock time in milliseconds, the one clock ackstream reads.

Ack records, completions, deadlines and backoffs are all epoch milliseconds, so
that processes on one host (and hosts with synchronised clocks) agree. Code that
decides by time takes a clock, a callable returning ms; tests pass
:class:`ackstream.testing.FakeClock` instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Clock", "now_ms"]

Clock = Callable[[], int]


def now_ms() -> int:
    """Milliseconds since the epoch."""
    return time.time_ns() // 1_000_000
