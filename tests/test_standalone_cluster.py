"""The README topology on a Spark standalone cluster (a Master and two Workers of
one core each, from the pyspark package, on loopback), with the Kafka channel, and one
Worker SIGKILLed mid-run with its executor: every offset ends committed, no output is
lost, and the outputs written more than once are counted.

The driver runs in a process of its own (tests/remote_driver.py); executors run this
interpreter, so they import ackstream from this environment (see the README's "On a
cluster" for what a real cluster needs).
"""

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from helpers import consume, sentences, wait_for
from spark_cluster import StandaloneCluster, spark_env

pytestmark = [pytest.mark.broker, pytest.mark.long]

DRIVER = Path(__file__).resolve().parent / "remote_driver.py"
RECORDS, PER_BATCH = 200, 25


@pytest.fixture
def cluster():
    running = StandaloneCluster(workers=2, cores=1).start()
    yield running
    running.stop()


def test_a_worker_killed_mid_run_loses_nothing_and_every_offset_is_committed(
    cluster, broker, new_topic, tmp_path
):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    inbox, outbox = new_topic(partitions=2), new_topic(partitions=1)
    name = f"cluster-{uuid.uuid4().hex[:8]}"
    lines = sentences(RECORDS)
    poison_at = 7
    lines[poison_at] = "poison pill sentence"
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for i, line in enumerate(lines):
        producer.send(inbox, value=line.encode(), partition=i % 2)
    producer.flush()
    producer.close()

    args = [cluster.url, broker.bootstrap, inbox, outbox, name, str(tmp_path / "ckpt")]
    driver = subprocess.Popen(
        [sys.executable, str(DRIVER), *args, str(PER_BATCH), "400"],
        env=spark_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    group = KafkaConsumer(
        bootstrap_servers=broker.bootstrap, group_id=f"ackstream-{name}", enable_auto_commit=False
    )
    try:
        partitions = [TopicPartition(inbox, p) for p in (0, 1)]

        def committed():
            return sum(group.committed(tp) or 0 for tp in partitions)

        def mid_run():
            """The offsets committed once some are and most are not yet; -1 if the
            driver exited first."""
            if driver.poll() is not None:
                return -1
            done = committed()
            return done if 0 < done < RECORDS // 2 else None

        at_kill = wait_for(mid_run, timeout=300, interval=0.3, what="the run's first commits")
        assert at_kill > 0, driver.communicate()[1][-5000:]
        cluster.kill_worker(0)
        out, err = driver.communicate(timeout=480)
    finally:
        group.close(autocommit=False)
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == 0, err[-5000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["error"] is None, result["error"]
    assert result["committed"] == {"0": RECORDS // 2, "1": RECORDS // 2}, (result, err[-3000:])

    letters = consume(broker.bootstrap, f"{name}.dead")
    assert [m.value for m in letters] == [lines[poison_at].encode()]
    # the sink writes one message per distinct (word, record) of a batch, keyed by the
    # word and valued "partition:offset" of its record (tests/fault_driver.py)
    written = [(m.key.decode(), m.value.decode()) for m in consume(broker.bootstrap, outbox)]
    expected = {
        (word, f"{i % 2}:{i // 2}")
        for i, line in enumerate(lines)
        if i != poison_at
        for word in line.split()
    }
    duplicates = len(written) - len(set(written))
    print(
        f"\nkilled a worker with {at_kill} of {RECORDS} offsets committed; "
        f"{len(expected)} (word, record) outputs, {duplicates} written more than once; "
        f"{result['seconds']} s"
    )
    assert expected - set(written) == set()  # nothing lost
    assert not any(word == "poison" for word, _ in written)
