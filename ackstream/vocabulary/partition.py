"""An upstream partition, as every part of ackstream names it: ``(topic, partition)``."""

from __future__ import annotations

__all__ = ["Partition"]

#: an upstream partition: ``(topic, partition number)``
Partition = tuple[str, int]
