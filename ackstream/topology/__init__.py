"""The topology: declared bolt stages (:mod:`~ackstream.topology.dsl`), one micro-batch
(:mod:`~ackstream.topology.batch`), the started queries (:mod:`~ackstream.topology.running`),
the bolts (:mod:`~ackstream.topology.bolts`) and the offset log (:mod:`~ackstream.topology.offset_log`)."""

from __future__ import annotations

from ackstream.topology.dsl import Topology
from ackstream.topology.running import RunningTopology

__all__ = ["RunningTopology", "Topology"]
