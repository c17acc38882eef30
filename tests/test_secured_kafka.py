"""The security settings end to end, on a broker with TLS and SASL/PLAIN listeners.

test_end_to_end's topology (tests/fault_driver.py) runs with the listener's ``kafka.*``
options given once to the source, the Kafka channel and the ``KafkaSink``; the source's
dead-letter producer and the acker's reader of the acks topic take them from there.
Every client is given only the secured listener's address, so one that missed the
settings would speak plaintext to a TLS port and the run would never finish: every
offset committed, the poison dead-lettered and every word written mean every client
went through the secured listener.
"""

import json
import os
import uuid

import pytest

from ackstream.cli import main
from ackstream.testing import wait_until_settled

from helpers import consume, group_commits, sentences

pytestmark = [pytest.mark.spark, pytest.mark.broker, pytest.mark.long]


@pytest.fixture(scope="module")
def secured_broker():
    """One broker for the module, with PLAINTEXT (the tests' own clients), SSL and
    SASL_SSL listeners."""
    from broker import KafkaBroker

    if os.environ.get("ACKSTREAM_TEST_BOOTSTRAP"):
        pytest.skip("starts its own secured broker; ACKSTREAM_TEST_BOOTSTRAP names another")
    running = KafkaBroker(secured=True).start()
    yield running
    running.stop()


@pytest.mark.parametrize(
    ("protocol", "ack_mode"),
    [("SSL", "telescoped"), ("SASL_SSL", "per_stage")],  # per_stage: ack records on the channel
)
def test_source_channel_dead_letters_and_sink_all_work_through_a_secured_listener(
    spark, secured_broker, tmp_path, protocol, ack_mode, capsys
):
    from kafka import KafkaProducer

    from broker import create_topic
    from fault_driver import build

    plain = secured_broker.bootstrap  # the test's own reads and writes
    inbox, outbox = create_topic(plain, partitions=2), create_topic(plain)
    name = f"secured-{protocol.lower()}-{uuid.uuid4().hex[:8]}"
    lines = sentences(30)
    lines[11] = "poison pill sentence"
    producer = KafkaProducer(bootstrap_servers=plain)
    for i, line in enumerate(lines):
        producer.send(inbox, value=line.encode(), partition=i % 2)
    producer.flush()
    producer.close()

    options = secured_broker.client_options(protocol)
    stream, topology = build(
        spark,
        options["kafka.bootstrap.servers"],
        inbox,
        outbox,
        name,
        per_batch=30,
        ack_mode=ack_mode,
        kafka_options=options,
    )
    running = topology.start(stream, str(tmp_path / "checkpoint"), trigger_ms=300)
    try:
        wait_until_settled(running, records=len(lines), timeout_s=300)  # 30 s when idle
    finally:
        running.stop()
    assert group_commits(plain, name, inbox) == {0: 15, 1: 15}

    letters = consume(plain, f"{name}.dead")
    assert [m.value for m in letters] == [lines[11].encode()]
    # the CLI reads the same channel through the secured listener, settings from a file
    config = tmp_path / "client.properties"
    config.write_text(
        "".join(
            f"{key.removeprefix('kafka.')}={value}\n"
            for key, value in options.items()
            if key != "kafka.bootstrap.servers"
        )
    )
    secured = options["kafka.bootstrap.servers"]
    argv = ["status", "--topology", name, "--bootstrap", secured, "--json"]
    assert main([*argv, "--command-config", str(config)]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["dead_lettered"] == 1 and status["acked"] >= 29, status
    written = {m.key.decode() for m in consume(plain, outbox)}
    assert {w for line in lines for w in line.split()} - {"poison"} <= written
    assert "poison" not in written
