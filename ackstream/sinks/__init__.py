"""User outputs behind the :class:`~ackstream.sinks.base.Sink` protocol, dead letters, and
tuple trees a sink's messages continue in another process (:mod:`ackstream.sinks.continued`)."""

from __future__ import annotations

from ackstream.sinks.base import Sink
from ackstream.sinks.kafka import KafkaSink
from ackstream.sinks.memory import ConsoleSink, MemorySink, ParquetSink

__all__ = ["ConsoleSink", "KafkaSink", "MemorySink", "ParquetSink", "Sink"]
