"""Session-wide fixtures: one local SparkSession (and, where tests ask, one broker).

A test that uses either (itself or through another fixture) is marked ``spark`` or
``broker``: a system test. The rest are unit tests, which ``make test-unit`` runs apart
in seconds (``-m "not spark and not broker"``)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        for fixture in ("spark", "broker"):
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(fixture)


@pytest.fixture(scope="session")
def spark():
    from ackstream import local_session

    from helpers import spark_kafka_conf

    # with Spark's Kafka connector, when resolved: the topologies read and write with it;
    # a trigger that runs no batch reports its progress at once, not every 10 s, so a
    # source's settled figures show without delay (ackstream.testing.wait_until_settled)
    conf = {**spark_kafka_conf(), "spark.sql.streaming.noDataProgressEventInterval": "200ms"}
    session = local_session("ackstream-tests", cores=2, conf=conf)
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()


@pytest.fixture(scope="session")
def broker():
    """Apache Kafka for the whole test session (see tests/broker.py), or the external
    cluster at ``ACKSTREAM_TEST_BOOTSTRAP``."""
    import os

    from broker import KafkaBroker

    external = os.environ.get("ACKSTREAM_TEST_BOOTSTRAP")
    if external:
        yield type("External", (), {"bootstrap": external})()
        return
    running = KafkaBroker().start()
    print(
        f"\nApache Kafka at {running.bootstrap} ready in {running.started_s:.1f}s "
        f"(log: {running.log})"
    )
    yield running
    running.stop()


@pytest.fixture
def new_topic(broker):
    """A factory for fresh uuid-named topics: ``new_topic(partitions=1) -> name``."""
    from broker import create_topic

    return lambda partitions=1: create_topic(broker.bootstrap, partitions)
