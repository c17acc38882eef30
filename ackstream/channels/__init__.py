"""Channels: ack records in, completions out (see :mod:`ackstream.channels.base`).

Two transports: :class:`LocalChannel` (a folder, one host) and
:class:`KafkaChannel` (two topics on the upstream's brokers).
"""

from __future__ import annotations

from ackstream.channels.base import Channel, Position
from ackstream.channels.kafka import KafkaChannel
from ackstream.channels.local import LocalChannel
from ackstream.config.source import SourceConfig
from ackstream.errors import OptionError
from ackstream.kafka.settings import kafka_options_of
from ackstream.spark.session import is_local_master

__all__ = ["Channel", "KafkaChannel", "LocalChannel", "Position", "check_reach", "open_channel"]


def open_channel(config: SourceConfig) -> Channel:
    """The channel a source's ``SourceConfig`` names: a local folder, or "kafka" for the
    topics ``<topology>.acks``/``.done`` on the upstream's brokers, with the source's
    ``kafka.*`` client settings (security included) and channel topic options."""
    if config.channel == "kafka":
        if not config.kafka.bootstrap_servers:  # parse() requires them with a Kafka upstream
            raise OptionError(
                "kafka.bootstrap.servers",
                config.kafka.bootstrap_servers,
                "host:port[,host:port...] of the brokers the Kafka channel lives on",
            )
        channel = KafkaChannel(
            config.kafka.bootstrap_servers,
            config.topology,
            kafka_options=kafka_options_of(config),
            replication_factor=config.channel_replication,
            retention_ms=config.channel_retention_ms,
        )
        channel.prepare()
        return channel
    return LocalChannel(config.channel, shared=config.channel_shared)


def check_reach(channel: Channel, master: str) -> None:
    """Refuse a local channel on a master whose executors may run on other hosts, unless
    its folder is declared shared: the acker's file stream reads the ack records on the
    executors, and a stage that keeps upstream trees alive writes its timeout resets
    from there, so with a folder only the driver's host sees they would read and write
    another host's folder, and the trees would time out instead of completing. Raises an
    :class:`~ackstream.errors.OptionError` naming ``ackstream.channel``."""
    if not channel.one_host or is_local_master(master):
        return
    raise OptionError(
        "ackstream.channel",
        channel.source_options()["ackstream.channel"],
        f"'kafka' (a KafkaChannel) on master {master}: a local channel folder is one "
        "host's, and the executors, which may run on other hosts, write to it; if every "
        "host mounts that folder at the same path, declare it with "
        "LocalChannel(path, shared=True) (source option ackstream.channelShared=true)",
    )
