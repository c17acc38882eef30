"""The Kafka channel's long-lived readers (the acks topic's planner, the spout's
completion polls) ride out brokers that do not answer, up to a limit."""

from __future__ import annotations

import socket

import pytest

from ackstream.channels import ack_source
from ackstream.channels.kafka import KafkaChannel
from ackstream.errors import EnvironmentProblem
from ackstream.kafka import outage


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_silent_brokers_give_no_new_acks_then_an_error_naming_them(monkeypatch):
    bootstrap = f"127.0.0.1:{_closed_port()}"
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "topic": "t.acks",
        "kafka.request.timeout.ms": "1000",
        "kafka.bootstrap.timeout.ms": "500",
    }
    reader = ack_source.ChannelSource(options).streamReader(None)
    start = {"0": 7}
    assert reader.latestOffset(start, None) == start  # an outage: nothing new, no error
    assert reader.latestOffset(start, None) == start
    monkeypatch.setattr(outage, "OUTAGE_LIMIT_S", 0.0)  # the outage has lasted too long
    with pytest.raises(EnvironmentProblem, match=bootstrap):
        reader.latestOffset(start, None)


def test_silent_brokers_give_no_new_completions_then_an_error_naming_them(monkeypatch):
    bootstrap = f"127.0.0.1:{_closed_port()}"
    channel = KafkaChannel(
        bootstrap,
        "outage",
        kafka_options={"kafka.request.timeout.ms": "1000", "kafka.bootstrap.timeout.ms": "500"},
    )
    position = {"0": 3}
    table, after = channel.completions_since(position)  # an outage: nothing new, no error
    assert (table.num_rows, after) == (0, position)
    monkeypatch.setattr(outage, "OUTAGE_LIMIT_S", 0.0)  # the outage has lasted too long
    with pytest.raises(EnvironmentProblem, match=bootstrap):
        channel.completions_since(position)


def test_a_channel_says_whether_its_last_read_was_answered():
    bootstrap = f"127.0.0.1:{_closed_port()}"
    channel = KafkaChannel(
        bootstrap,
        "outage",
        kafka_options={"kafka.request.timeout.ms": "1000", "kafka.bootstrap.timeout.ms": "500"},
    )
    assert channel.answering()  # nothing read yet, nothing failed
    channel.completions_since({"0": 3})
    assert not channel.answering()
