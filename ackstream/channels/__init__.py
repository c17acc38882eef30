"""Channels: ack records in, completions out (see :mod:`ackstream.channels.base`).

Two transports: :class:`LocalChannel` (a folder, one host) and
:class:`KafkaChannel` (two topics on the upstream's brokers).
"""

from __future__ import annotations

from ackstream.channels.base import Channel, Position
from ackstream.channels.kafka import KafkaChannel
from ackstream.channels.local import LocalChannel

__all__ = ["Channel", "KafkaChannel", "LocalChannel", "Position", "open_channel"]


def open_channel(config) -> Channel:
    """The channel a source's ``SourceConfig`` names: a local folder, or "kafka" for the
    topics ``<topology>.acks``/``.done`` on the upstream's brokers."""
    if config.channel == "kafka":
        channel = KafkaChannel(config.bootstrap_servers, config.topology)
        channel.prepare()
        return channel
    return LocalChannel(config.channel)
