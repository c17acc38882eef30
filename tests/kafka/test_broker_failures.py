"""A broker of a three-node cluster fails under a running topology, and
every input offset still ends acked or dead-lettered, none committed early.

The cluster (tests/broker.py, replication factor 3, ``min.insync.replicas=2``) carries
everything: the input topic, the Kafka channel's topics, the sink's topic, the dead
letters and the consumer group. The topology is the fault suite's (tests/fault_driver.py:
sentences -> words -> a bolt that always fails the poison record -> counts ->
``KafkaSink``), run in this process; the end state is checked by the fault suite's
``check_end_state`` against a poller of the group's committed offsets. Each test hurts
the leader of input partition 0 once the first output is written:

- SIGKILL, held down until another broker leads, then restarted from its log;
- a leader change both ways: a controlled shutdown (SIGTERM) hands leadership away,
  the node comes back, and a preferred leader election hands it back;
- SIGSTOP for three request timeouts (the clients' ``request.timeout.ms`` set to 5 s):
  connections stay open and requests to it hang until they time out.

Crashes may cost replays and duplicate output, never records: duplicates are counted
and printed. Each test takes a minute or more (the cluster starts once, in ~20 s), so
all are marked ``long``.
"""

from __future__ import annotations

import collections
import signal
import time
import uuid

import pytest
from fault_checks import CommitRecorder, N, all_committed, check_end_state, output_count, produce

from ackstream.channels.kafka import KafkaChannel
from ackstream.vocabulary.records import NOTICES

from fault_driver import build
from helpers import consume, wait_for

pytestmark = [pytest.mark.long, pytest.mark.fault]

REQUEST_TIMEOUT_MS = 5_000


@pytest.fixture(scope="module")
def cluster():
    import os

    from broker import KafkaCluster

    if os.environ.get("ACKSTREAM_TEST_BOOTSTRAP"):
        pytest.skip("kills brokers: needs the three-node cluster of tests/broker.py")
    running = KafkaCluster().start()
    print(f"\nthree Kafka nodes at {running.bootstrap} ready in {running.started_s:.1f}s")
    yield running
    running.stop()


@pytest.fixture
def healthy(cluster):
    """The cluster, given back with every node running and registered."""
    yield cluster
    for node in cluster.nodes:
        node.resume() if node.alive() else node.launch()
    cluster.wait_ready(time.monotonic() + 120)


def partition_state(bootstrap: str, topic: str, partition: int) -> dict:
    """``leader_id``, ``replica_nodes`` and ``isr_nodes`` of one partition, as the
    cluster's metadata has them now."""
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    try:
        parts = admin.describe_topics([topic])[0]["partitions"]
    finally:
        admin.close()
    return next(p for p in parts if p["partition_index"] == partition)


def leader_is(bootstrap: str, topic: str, wanted) -> int | None:
    """The leader of ``topic``'s partition 0 if ``wanted(leader)`` holds, else None
    (also while the metadata cannot be read: a broker is down)."""
    from kafka.errors import KafkaError

    try:
        leader = partition_state(bootstrap, topic, 0)["leader_id"]
    except (KafkaError, OSError):
        return None
    return leader if leader >= 0 and wanted(leader) else None


def duplicates(bootstrap: str, name: str, outbox: str, lines: list[str]) -> dict:
    """What the failures cost beyond the guarantee: offsets read more than once, offsets
    acked more than once, and output messages written more than once."""
    rows = KafkaChannel(bootstrap, name).completions_since(None)[0].to_pylist()
    rows = [r for r in rows if r["status"] not in NOTICES]
    outcomes = collections.Counter((r["partition"], r["offset"]) for r in rows)
    acks = collections.Counter(
        (r["partition"], r["offset"]) for r in rows if r["status"] == "acked"
    )
    # one output message per distinct (word, record) of a batch: a second one is a duplicate
    written = [(m.key, m.value) for m in consume(bootstrap, outbox)]
    return {
        "offsets_read_again": sum(1 for n in outcomes.values() if n > 1),
        "offsets_acked_twice": sum(1 for n in acks.values() if n > 1),
        "outputs_written_twice": len(written) - len(set(written)),
    }


def run_through_failure(spark, cluster, tmp_path, what: str, hurt, kafka_options=None):
    """Run the topology over N records; once its first output is written, call
    ``hurt(inbox, committed)`` (``committed()`` is the group's latest commit); then wait
    for every offset to be committed and check the end state."""
    from broker import create_topic

    bootstrap = cluster.bootstrap
    inbox = create_topic(bootstrap, partitions=2, replication=3)
    outbox = create_topic(bootstrap, partitions=1, replication=3)
    name = f"{what}-{uuid.uuid4().hex[:8]}"
    lines = produce(bootstrap, inbox)
    recorder = CommitRecorder(bootstrap, f"ackstream-{name}", inbox)
    recorder.start()

    def start():  # 10 records a batch: about 20 batches, so that the failure lands mid-run
        stream, topology = build(
            spark, bootstrap, inbox, outbox, name, per_batch=10, kafka_options=kafka_options
        )
        return topology.start(stream, str(tmp_path / "checkpoint"), trigger_ms=300)

    topology = Restarting(start)
    began = time.monotonic()
    try:
        wait_for(
            lambda: topology.check() and output_count(bootstrap, outbox) > 0,
            timeout=180,
            interval=0.3,
            what="the first output",
        )
        hurt(inbox, recorder.latest)
        print(f"\n{what}: done hurting after {time.monotonic() - began:.1f}s of the run")
        wait_for(
            lambda: topology.check() and all_committed(recorder),
            timeout=480,
            interval=0.5,
            what=f"every input offset committed after the {what}",
        )
    finally:
        topology.stop()
        recorder.stop()
    figures = check_end_state(bootstrap, name, outbox, lines, recorder)
    figures.update(duplicates(bootstrap, name, outbox, lines))
    figures["spark_restarts"] = topology.restarts
    print(f"{what} figures ({time.monotonic() - began:.0f}s run): {figures}")
    return figures


class Restarting:
    """The running topology, started again from its checkpoint when Spark itself could
    not start a Python worker in time (its 10 s limit, hard-coded, is passed on a
    loaded machine): a driver restart the guarantee must survive anyway. Any other
    death of a query fails the test."""

    SPARK_START_UP = "Python worker failed to connect back"

    def __init__(self, start, most: int = 3):
        self.start, self.most, self.restarts = start, most, 0
        self.running = start()

    def check(self) -> bool:
        error = self.running.exception()
        if error is None:
            return True
        if self.SPARK_START_UP not in str(error) or self.restarts >= self.most:
            pytest.fail(f"a query died: {error}")
        self.restarts += 1
        print(f"\nrestart {self.restarts} from the checkpoint: {self.SPARK_START_UP}")
        self.running.stop()
        self.running = self.start()
        return True

    def stop(self) -> None:
        self.running.stop()


def not_all_committed(committed) -> None:
    """The failure must land while offsets are still to be committed."""
    assert sum(committed().values()) < N, "the run had committed everything already"


def test_a_killed_partition_leader_restarted_from_its_log_loses_nothing(spark, healthy, tmp_path):
    cluster = healthy

    def hurt(inbox, committed):
        leader = partition_state(cluster.bootstrap, inbox, 0)["leader_id"]
        node = next(n for n in cluster.nodes if n.node_id == leader)
        not_all_committed(committed)
        node.kill()
        survivors = ",".join(n.bootstrap for n in cluster.nodes if n is not node)
        moved = wait_for(
            lambda: leader_is(survivors, inbox, lambda now: now != leader),
            timeout=60,
            interval=0.3,
            what=f"a new leader after node {leader} was killed",
        )
        print(f"\nSIGKILL of node {leader}; node {moved} leads; committed {committed()}")
        cluster.restart(node)  # from its log on disk
        print(f"node {leader} restarted; committed {committed()}")

    run_through_failure(spark, cluster, tmp_path, "leader-kill", hurt)


def test_a_leader_change_and_back_loses_nothing(spark, healthy, tmp_path):
    from kafka.admin import KafkaAdminClient

    cluster = healthy

    def hurt(inbox, committed):
        state = partition_state(cluster.bootstrap, inbox, 0)
        leader, preferred = state["leader_id"], state["replica_nodes"][0]
        node = next(n for n in cluster.nodes if n.node_id == leader)
        not_all_committed(committed)
        node.stop()  # SIGTERM: a controlled shutdown hands its partitions over first
        assert node.process.returncode != -signal.SIGKILL, f"node {leader} did not shut down"
        moved = wait_for(
            lambda: leader_is(cluster.bootstrap, inbox, lambda now: now != leader),
            timeout=60,
            interval=0.3,
            what=f"a new leader after node {leader}'s controlled shutdown",
        )
        print(f"\ncontrolled shutdown of node {leader}: node {moved} leads; {committed()}")
        node.launch()
        cluster.wait_ready(time.monotonic() + 120, nodes=[node])
        wait_for(
            lambda: preferred in partition_state(cluster.bootstrap, inbox, 0)["isr_nodes"],
            timeout=60,
            interval=0.3,
            what=f"node {preferred} back in sync",
        )
        not_all_committed(committed)
        admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
        try:
            admin.elect_leaders(0, {inbox: [0, 1]}, timeout_ms=30_000, raise_errors=False)
        finally:
            admin.close()
        wait_for(
            lambda: leader_is(cluster.bootstrap, inbox, lambda now: now == preferred),
            timeout=60,
            interval=0.3,
            what=f"the preferred leader {preferred} elected",
        )
        print(f"preferred leader election: node {preferred} leads again; {committed()}")

    run_through_failure(spark, cluster, tmp_path, "leader-change", hurt)


def test_a_broker_stalled_past_the_request_timeout_loses_nothing(spark, healthy, tmp_path):
    cluster = healthy
    stall_s = 3 * REQUEST_TIMEOUT_MS / 1000

    def hurt(inbox, committed):
        leader = partition_state(cluster.bootstrap, inbox, 0)["leader_id"]
        node = next(n for n in cluster.nodes if n.node_id == leader)
        not_all_committed(committed)
        node.pause()
        try:
            time.sleep(stall_s)  # the outage itself, not a wait for a condition
        finally:
            node.resume()
        print(f"\nnode {leader} stalled for {stall_s:.0f}s; committed {committed()}")

    run_through_failure(
        spark,
        cluster,
        tmp_path,
        "broker-stall",
        hurt,
        kafka_options={"kafka.request.timeout.ms": str(REQUEST_TIMEOUT_MS)},
    )
