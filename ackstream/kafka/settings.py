"""``kafka.*`` options of the source as kafka-python client settings."""

from __future__ import annotations

from ackstream.config import SourceConfig
from ackstream.errors import OptionError

__all__ = ["consumer_settings"]


def consumer_settings(config: SourceConfig) -> dict:
    """kafka-python settings from the ``kafka.*`` options (``kafka.security.protocol`` ->
    ``security_protocol``); an unknown one is an :class:`OptionError`."""
    from kafka import KafkaConsumer

    settings = {
        "bootstrap_servers": config.bootstrap_servers.split(","),
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "client_id": f"ackstream-{config.topology}",
    }
    for key, value in config.kafka_options:
        name = key.replace(".", "_")
        if name not in KafkaConsumer.DEFAULT_CONFIG or name in ("group_id", "enable_auto_commit"):
            raise OptionError(
                "kafka." + key,
                value,
                "a kafka-python consumer setting "
                "(kafka.<setting with dots>, e.g. kafka.security.protocol)",
            )
        settings[name] = _typed(
            option="kafka." + key, value=value, default=KafkaConsumer.DEFAULT_CONFIG[name]
        )
    return settings


def _typed(option: str, value: str, default):
    if isinstance(default, bool):
        if value.lower() not in ("true", "false"):
            raise OptionError(option, value, '"true" or "false"')
        return value.lower() == "true"
    if isinstance(default, int):
        try:
            return int(value)
        except ValueError:
            raise OptionError(option, value, "a whole number") from None
    return value
