"""User outputs behind the :class:`~ackstream.sinks.base.Sink` protocol, and dead letters."""

from __future__ import annotations

from ackstream.sinks.base import Sink
from ackstream.sinks.kafka import KafkaSink
from ackstream.sinks.memory import ConsoleSink, MemorySink, ParquetSink

__all__ = ["ConsoleSink", "KafkaSink", "MemorySink", "ParquetSink", "Sink"]
