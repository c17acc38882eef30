"""ackstream: Storm's guaranteed message processing for Spark Structured Streaming.

Every record read with tracking on ends acked (its tuple tree completed, then its
offset is committed), replayed from its offset after a fail or timeout, or
dead-lettered with its reason.
"""

from ackstream.acker.ledger import Pending, step
from ackstream.acker.query import completions
from ackstream.config import SourceConfig
from ackstream.errors import AckstreamError, EnvironmentProblem, OptionError, StageError
from ackstream.records import (
    ACK,
    ACK_RECORD_SCHEMA,
    ACKED,
    COMPLETION_SCHEMA,
    FAIL,
    FAILED,
    INIT,
    INVALID,
    REJECT,
    REJECTED,
    RESET,
    TIMED_OUT,
    UNKNOWN,
)
from ackstream.session import local_session
from ackstream.sinks.dead_letters import read_dead_letters
from ackstream.sinks.kafka import KafkaSink
from ackstream.sinks.memory import ConsoleSink, MemorySink
from ackstream.sources.datasource import register
from ackstream.topology import RunningTopology, Topology

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "AckstreamError",
    "OptionError",
    "EnvironmentProblem",
    "StageError",
    "Topology",
    "RunningTopology",
    "MemorySink",
    "ConsoleSink",
    "KafkaSink",
    "Pending",
    "step",
    "completions",
    "local_session",
    "register",
    "SourceConfig",
    "read_dead_letters",
    "ACK",
    "INIT",
    "FAIL",
    "RESET",
    "REJECT",
    "ACKED",
    "FAILED",
    "TIMED_OUT",
    "REJECTED",
    "UNKNOWN",
    "INVALID",
    "ACK_RECORD_SCHEMA",
    "COMPLETION_SCHEMA",
]
