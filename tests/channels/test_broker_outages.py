"""The Kafka channel's long-lived readers (the acks topic's planner, the spout's
completion polls) ride out brokers that do not answer, up to a limit."""

from __future__ import annotations

import socket
import uuid

import pyarrow as pa
import pytest

from ackstream.channels import ack_source
from ackstream.channels.kafka import KafkaChannel
from ackstream.errors import EnvironmentProblem
from ackstream.kafka import outage
from ackstream.kafka.outage import is_outage
from ackstream.vocabulary.records import ACKED, COMPLETION_SCHEMA

FAST_TIMEOUTS = {"kafka.request.timeout.ms": "1000", "kafka.bootstrap.timeout.ms": "500"}


def completions(*roots):
    done = [{"root": r, "status": ACKED, "completed_ms": r} for r in roots]
    return pa.Table.from_pylist(done, schema=COMPLETION_SCHEMA)


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


def test_a_write_to_brokers_that_do_not_answer_is_tried_again_then_names_them(monkeypatch):
    """A batch's completions or acks sent while the brokers are away are sent again,
    not raised as kafka-python's error (which ended the topology's query); only an
    outage past the limit stops, naming the brokers."""
    bootstrap = f"127.0.0.1:{_closed_port()}"
    channel = KafkaChannel(
        bootstrap,
        "outage",
        kafka_options={"kafka.request.timeout.ms": "1000", "kafka.bootstrap.timeout.ms": "500"},
    )
    warned = []
    monkeypatch.setattr(outage.log, "warning", lambda *args: warned.append(args))
    monkeypatch.setattr(outage, "OUTAGE_LIMIT_S", 0.0)  # the second failure is too long
    with pytest.raises(EnvironmentProblem, match=bootstrap):
        channel.write_completions(completions(1), 0)
    assert len(warned) == 1  # tried twice: a warning, then the error


def test_an_outage_is_what_asking_again_can_mend():
    from kafka import errors

    assert is_outage(errors.RequestTimedOutError())
    assert is_outage(errors.KafkaConnectionError())
    assert is_outage(errors.KafkaTimeoutError("no metadata"))
    # kafka-python's idempotent producer, once its producer id request timed out
    assert is_outage(errors.KafkaError("Could not execute transactional request"))
    assert not is_outage(errors.TopicAuthorizationFailedError())
    assert not is_outage(errors.SaslAuthenticationFailedError())
    assert not is_outage(ValueError("not Kafka's"))


def test_a_write_rides_out_a_broker_stalled_while_its_producer_starts(broker, monkeypatch):
    """The broker stalls (SIGSTOP) just as a new producer asks it for its producer id:
    kafka-python's idempotent producer turns that request's timeout into a fatal error,
    which failed the write and ended the topology's query. The write goes on once the
    broker answers again, every completion delivered."""
    import threading

    from kafka.producer import transaction_manager

    channel = KafkaChannel(
        broker.bootstrap,
        f"stall-{uuid.uuid4().hex[:8]}",
        kafka_options={"kafka.request.timeout.ms": "1000"},
    )
    channel.prepare()
    stalled = threading.Event()
    manager = transaction_manager.TransactionManager
    correlation_id = manager.next_in_flight_request_correlation_id

    def stalling_first(self):  # called just before the producer id request is sent
        if not stalled.is_set():
            stalled.set()
            broker.pause()
            threading.Timer(3.0, broker.resume).start()
        return correlation_id(self)

    monkeypatch.setattr(manager, "next_in_flight_request_correlation_id", stalling_first)
    try:
        channel.write_completions(completions(1, 2, 3), 0)
    finally:
        broker.resume()  # whatever happened, the session's broker answers again
    assert stalled.is_set()
    table, _ = channel.completions_since()
    assert set(table.column("root").to_pylist()) == {1, 2, 3}
    channel.close()
