"""ackstream: Storm's guaranteed message processing for Spark Structured Streaming.

At least once, per record: every record read with tracking on ends acked (its
tuple tree completed, then its offset is committed), replayed from its offset
after a fail or timeout, or dead-lettered with its reason.

The names here are the ones a user types; everything else lives in its module
(the ledger in :mod:`ackstream.acker.ledger`, record kinds and schemas in
:mod:`ackstream.vocabulary.records`, options in :mod:`ackstream.config.source`). They are imported
on first use, so ``import ackstream`` (and ``ackstream --help``) stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports
    from ackstream import testing as testing
    from ackstream.channels.kafka import KafkaChannel as KafkaChannel
    from ackstream.channels.local import LocalChannel as LocalChannel
    from ackstream.errors import (
        AckstreamError as AckstreamError,
    )
    from ackstream.errors import (
        EnvironmentProblem as EnvironmentProblem,
    )
    from ackstream.errors import (
        OptionError as OptionError,
    )
    from ackstream.errors import (
        StageError as StageError,
    )
    from ackstream.sinks.continued import TreeClient as TreeClient
    from ackstream.sinks.dead_letters import read_dead_letters as read_dead_letters
    from ackstream.sinks.kafka import KafkaSink as KafkaSink
    from ackstream.sinks.memory import (
        ConsoleSink as ConsoleSink,
    )
    from ackstream.sinks.memory import (
        MemorySink as MemorySink,
    )
    from ackstream.sinks.memory import (
        ParquetSink as ParquetSink,
    )
    from ackstream.sources.datasource import register as register
    from ackstream.sources.launch import local_session as local_session
    from ackstream.sources.upstream import check_options as check_options
    from ackstream.topology import RunningTopology as RunningTopology
    from ackstream.topology import Topology as Topology

#: public name -> the module that defines it
_EXPORTS = {
    "Topology": "ackstream.topology",
    "RunningTopology": "ackstream.topology",
    "MemorySink": "ackstream.sinks.memory",
    "ConsoleSink": "ackstream.sinks.memory",
    "ParquetSink": "ackstream.sinks.memory",
    "KafkaSink": "ackstream.sinks.kafka",
    "LocalChannel": "ackstream.channels.local",
    "KafkaChannel": "ackstream.channels.kafka",
    "TreeClient": "ackstream.sinks.continued",
    "local_session": "ackstream.sources.launch",
    "check_options": "ackstream.sources.upstream",
    "register": "ackstream.sources.datasource",
    "read_dead_letters": "ackstream.sinks.dead_letters",
    "AckstreamError": "ackstream.errors",
    "OptionError": "ackstream.errors",
    "EnvironmentProblem": "ackstream.errors",
    "StageError": "ackstream.errors",
}

__all__ = ["__version__", "testing", *_EXPORTS]  # noqa: F822 - provided by __getattr__


def __getattr__(name: str) -> Any:
    if name == "testing":
        return importlib.import_module("ackstream.testing")
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ackstream' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
