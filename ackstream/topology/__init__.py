"""The topology: what users declare (``dsl``), one micro-batch (``batch``), the started
queries (``running``), the bolts (``bolts``) and Spark's offset log (``offset_log``)."""

from __future__ import annotations

from ackstream.topology.dsl import Topology
from ackstream.topology.running import RunningTopology

__all__ = ["RunningTopology", "Topology"]
