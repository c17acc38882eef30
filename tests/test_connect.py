"""test_end_to_end's topology from a Spark Connect client, against the Connect
server bundled in pyspark (tests/spark_cluster.py), every input offset committed.

The client runs in a process of its own (tests/remote_driver.py): a Connect session
and the tests' classic local session do not mix in one process. The topology's
foreachBatch function, its acker's, and the source are pickled to the server's Python
processes, so this is the test that they carry no session, lock or JVM call.
"""

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from ackstream.ui.status_sources import stages_in

from helpers import consume, sentences
from spark_cluster import ConnectServer, spark_env

#: a Connect server of its own beside the session's Spark: with the cluster runs
pytestmark = [pytest.mark.broker, pytest.mark.long]

DRIVER = Path(__file__).resolve().parent / "remote_driver.py"


@pytest.fixture(scope="module")
def connect_server():
    server = ConnectServer(cores=2).start()
    yield server
    server.stop()


def test_the_readme_topology_runs_from_a_connect_client_and_commits_every_offset(
    connect_server, broker, new_topic, tmp_path
):
    from kafka import KafkaProducer

    inbox, outbox = new_topic(partitions=2), new_topic(partitions=1)
    name = f"connect-{uuid.uuid4().hex[:8]}"
    lines = sentences(40)
    lines[7] = "poison pill sentence"
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for i, line in enumerate(lines):
        producer.send(inbox, value=line.encode(), partition=i % 2)
    producer.flush()
    producer.close()

    args = [connect_server.url, broker.bootstrap, inbox, outbox, name, str(tmp_path / "ckpt")]
    done = subprocess.run(
        [sys.executable, str(DRIVER), *args],
        env=spark_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["error"] is None, result["error"]
    assert result["committed"] == {"0": 20, "1": 20}, (result, done.stderr[-3000:])

    written = {m.key.decode() for m in consume(broker.bootstrap, outbox)}
    assert {w for line in lines for w in line.split()} - {"poison"} <= written
    assert "poison" not in written
    letters = consume(broker.bootstrap, f"{name}.dead")
    assert [m.value for m in letters] == [lines[7].encode()]
    # the batch function counted each stage's tuples on the server (Connect Observations):
    # every line at least once (replays of the poison's batch count again)
    stages = stages_in(str(tmp_path / "ckpt"))
    assert stages["map#1"]["in"] >= 40 and stages["sink#1"]["in"] > 0, stages


def test_a_connect_client_keeps_the_acker_shard_count_at_a_url(connect_server, spark, tmp_path):
    """The count is written through a Spark job from the client; a restart with another
    count is refused there and by a classic session alike."""
    from ackstream.acker.query import check_shard_count
    from ackstream.errors import OptionError

    checkpoint = (tmp_path / "acker").as_uri()
    done = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve().parent / "remote_shard_count.py"),
            connect_server.url,
            checkpoint,
        ],
        env=spark_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    refused = json.loads(done.stdout.strip().splitlines()[-1])["refused"]
    assert refused is not None and "expected 2, the count" in refused, done.stderr[-3000:]
    with pytest.raises(OptionError, match="expected 2, the count"):
        check_shard_count(spark, checkpoint, 3)
