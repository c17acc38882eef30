"""Apache Kafka for tests: KRaft nodes (broker + controller in one JVM) on loopback ports.

The jars come from Maven Central through ``tests/kafka/pom.xml``: ``make kafka``
copies them into ``.cache/kafka-<version>/libs`` (or ``$ACKSTREAM_KAFKA_LIBS``).
Each node keeps its log on disk in a temporary folder, so a node killed with
SIGKILL comes back from it (:meth:`KafkaNode.restart`).

- :class:`KafkaBroker`: one node, replication factor 1 (the session's broker).
- :class:`KafkaCluster`: three nodes, replication factor 3, ``min.insync.replicas=2``.

Either takes ``secured=True``: each node then also listens with TLS (``SSL``) and with
SASL/PLAIN over TLS (``SASL_SSL``), its certificate signed by a throwaway CA made
with openssl at start; :meth:`_Nodes.client_options` gives a client's ``kafka.*``
options for a listener.

Set ``ACKSTREAM_TEST_BOOTSTRAP=host:port`` to run the tests against an external
Kafka cluster instead (see conftest.py); then nothing is started or stopped here.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POM = ROOT / "tests" / "kafka" / "pom.xml"
#: Written by ``make kafka`` once every jar is in place.
RESOLVED_MARK = ".resolved"

LOG4J = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.state.name = state.change.logger
logger.state.level = warn
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kafka_version() -> str:
    """The Kafka version ``tests/kafka/pom.xml`` resolves."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    return ET.parse(POM).getroot().find("m:properties/m:kafka.version", ns).text.strip()


def kafka_libs() -> Path:
    """The folder of Kafka's jars; fails with the command that fills it."""
    given = os.environ.get("ACKSTREAM_KAFKA_LIBS")
    if given:
        if not any(Path(given).glob("kafka_2.13-*.jar")):
            raise RuntimeError(f"ACKSTREAM_KAFKA_LIBS={given} holds no kafka_2.13-*.jar")
        return Path(given)
    libs = ROOT / ".cache" / f"kafka-{kafka_version()}" / "libs"
    if not (libs / RESOLVED_MARK).exists():
        raise RuntimeError(
            f"Apache Kafka's jars are not in {libs}: run `make kafka` first "
            "(it resolves them from Maven Central with tests/kafka/pom.xml)"
        )
    return libs


#: The SASL/PLAIN user a secured broker accepts, and its password.
SASL_USER, SASL_PASSWORD = "ackstream", "ackstream-secret"
#: The listeners a secured node adds to PLAINTEXT (listener name = security protocol).
SECURED_LISTENERS = ("SSL", "SASL_SSL")


def make_tls(folder: Path) -> tuple[Path, Path]:
    """A throwaway CA and a certificate for 127.0.0.1 that it signs (openssl, EC keys):
    returns (the CA's certificate, which clients trust; the broker's PEM keystore, its
    unencrypted PKCS#8 key and its certificate)."""
    if shutil.which("openssl") is None:
        raise RuntimeError(
            "a secured test broker needs the openssl command to make its certificate"
        )
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key, key, csr, cert, ext = (
        folder / name
        for name in ("ca.pem", "ca.key", "broker.key", "broker.csr", "broker.pem", "san.cnf")
    )
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for command in (
        ["req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-subj", "/CN=ackstream test CA"],
        ["req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-out", cert, "-extfile", ext],
    ):
        done = subprocess.run(["openssl", *map(str, command)], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"openssl {command[0]} failed: {done.stderr}")
    keystore = folder / "broker-keystore.pem"
    keystore.write_text(key.read_text() + cert.read_text())
    return ca, keystore


def cluster_id() -> str:
    """A random KRaft cluster id: 16 bytes, URL-safe base64 without padding."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):  # Kafka's own ids never start with one
            return text


class KafkaNode:
    """One KRaft node, broker and controller in one JVM, listening on 127.0.0.1 only."""

    def __init__(self, node_id: int, root: Path, heap: str = "512m", secured: bool = False):
        self.node_id, self.heap = node_id, heap
        self.port, self.controller_port = free_port(), free_port()
        #: listener name (= its security protocol) -> port, beside PLAINTEXT
        self.secured_ports = {name: free_port() for name in SECURED_LISTENERS if secured}
        self.dir = root / f"node-{node_id}"
        self.log_dir = self.dir / "data"
        self.config = self.dir / "server.properties"
        self.log_path = self.dir / "kafka.log"
        self.process: subprocess.Popen | None = None
        self.dir.mkdir(parents=True)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def configure(self, voters: str, settings: dict) -> None:
        ports = {"PLAINTEXT": self.port, **self.secured_ports}
        served = ",".join(f"{name}://127.0.0.1:{port}" for name, port in ports.items())
        props = {
            "process.roles": "broker,controller",
            "node.id": self.node_id,
            "controller.quorum.voters": voters,
            "listeners": f"{served},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": served,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": ",".join(
                ["CONTROLLER:PLAINTEXT", *(f"{name}:{name}" for name in ports)]
            ),
            "log.dirs": self.log_dir,
            **settings,
        }
        self.config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.dir / "log4j2.properties").write_text(LOG4J)

    def _java(self, main: str, *args: str, heap: str) -> list[str]:
        return [
            "java",
            f"-Xmx{heap}",
            "-Xms64m",
            "-XX:+UseSerialGC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}",
            "-cp",
            str(kafka_libs() / "*"),
            main,
            *args,
        ]

    def format(self, cluster: str) -> subprocess.Popen:
        """Start writing the KRaft storage metadata (Kafka's kafka-storage.sh format)."""
        return subprocess.Popen(
            self._java(
                "kafka.tools.StorageTool",
                "format",
                "-t",
                cluster,
                "-c",
                str(self.config),
                "--ignore-formatted",
                heap="256m",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def formatted(self, running: subprocess.Popen) -> None:
        out, _ = running.communicate(timeout=120)
        if running.returncode:
            raise RuntimeError(
                f"formatting the storage of Kafka node {self.node_id} failed "
                f"({running.returncode}): {out}"
            )

    def launch(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self._java("kafka.Kafka", str(self.config), heap=self.heap),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.dir,
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            code = self.process.returncode if self.process else None
            raise RuntimeError(
                f"Kafka node {self.node_id} exited with {code}; log: {self.log_path}"
            )

    def wait_listening(self, deadline: float) -> None:
        while True:
            self.check_alive()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"Kafka node {self.node_id} does not listen on "
                        f"{self.bootstrap}; log: {self.log_path}"
                    ) from None
                time.sleep(0.05)

    def pause(self) -> None:
        """SIGSTOP: the node keeps its sockets but answers nothing (a stalled broker)."""
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: a crash; the log on disk stays for :meth:`restart`."""
        if self.alive():
            os.kill(self.process.pid, signal.SIGKILL)
        if self.process:
            self.process.wait()

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (a clean shutdown), then SIGKILL after ``timeout`` seconds."""
        if not self.alive():
            return
        self.resume()
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()


class _Nodes:
    """Start, wait for, and stop a set of KRaft nodes that form one cluster."""

    size = 1
    heap = "512m"

    def __init__(self, secured: bool = False, **settings):
        self.root = Path(tempfile.mkdtemp(prefix="ackstream-kafka-"))
        self.nodes = [KafkaNode(i + 1, self.root, self.heap, secured) for i in range(self.size)]
        self.ca_file: Path | None = None
        if secured:
            self.ca_file, keystore = make_tls(self.root / "tls")
            settings = {**self._security(keystore), **settings}
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        rf = self.size
        defaults = {
            "num.partitions": 1,
            "default.replication.factor": rf,
            "min.insync.replicas": min(2, rf),
            "auto.create.topics.enable": "true",  # dead-letter and output topics
            "offsets.topic.replication.factor": rf,
            "offsets.topic.num.partitions": 4,
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": min(2, rf),
            "transaction.state.log.num.partitions": 4,
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": min(2, rf),
            "group.initial.rebalance.delay.ms": 0,
        }
        for node in self.nodes:
            node.configure(voters, {**defaults, **settings})
        self.bootstrap = ",".join(n.bootstrap for n in self.nodes)
        self.started_s: float | None = None

    @staticmethod
    def _security(keystore: Path) -> dict:
        """Broker settings of the secured listeners: a PEM keystore, SASL/PLAIN users."""
        users = (
            f'username="{SASL_USER}" password="{SASL_PASSWORD}" user_{SASL_USER}="{SASL_PASSWORD}"'
        )
        return {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": keystore,
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};"
            ),
        }

    def client_options(self, protocol: str) -> dict[str, str]:
        """The ``kafka.*`` options (the source's form) of a client of the ``protocol``
        listener (``SSL`` or ``SASL_SSL``, of a broker started with ``secured=True``);
        SASL's login is given as Spark's Kafka source takes it, a JAAS config."""
        if protocol not in self.nodes[0].secured_ports:
            raise ValueError(f"no {protocol} listener: start the broker with secured=True")
        options = {
            "kafka.bootstrap.servers": ",".join(
                f"127.0.0.1:{n.secured_ports[protocol]}" for n in self.nodes
            ),
            "kafka.security.protocol": protocol,
            "kafka.ssl.cafile": str(self.ca_file),
        }
        if protocol.startswith("SASL"):
            options["kafka.sasl.mechanism"] = "PLAIN"
            options["kafka.sasl.jaas.config"] = (
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'username="{SASL_USER}" password="{SASL_PASSWORD}";'
            )
        return options

    @property
    def logs(self) -> str:
        return ", ".join(str(n.log_path) for n in self.nodes)

    def start(self, timeout: float = 90.0):
        begin = time.monotonic()
        cluster = cluster_id()
        try:
            formats = [node.format(cluster) for node in self.nodes]  # JVMs of their own
            for node, running in zip(self.nodes, formats):
                node.formatted(running)
            for node in self.nodes:
                node.launch()
            self.wait_ready(time.monotonic() + timeout)
        except BaseException:
            self._stop_nodes()  # the logs stay: the error names them
            raise
        self.started_s = time.monotonic() - begin
        return self

    def wait_ready(self, deadline: float, nodes=None) -> None:
        """Until every node listens and the cluster's metadata lists all its brokers."""
        from kafka import KafkaAdminClient
        from kafka.errors import KafkaError

        for node in nodes or self.nodes:
            node.wait_listening(deadline)
        problem = None
        while time.monotonic() < deadline:
            for node in self.nodes:
                node.check_alive()
            try:
                admin = KafkaAdminClient(
                    bootstrap_servers=self.bootstrap,
                    client_id="ackstream-tests",
                    request_timeout_ms=5000,
                )
                try:
                    brokers = admin.describe_cluster()["brokers"]
                finally:
                    admin.close()
                if len(brokers) == self.size:
                    return
                problem = f"{len(brokers)} of {self.size} brokers registered"
            except KafkaError as error:
                problem = repr(error)
            time.sleep(0.2)
        raise RuntimeError(f"Kafka at {self.bootstrap} not ready ({problem}); logs: {self.logs}")

    def stop(self) -> None:
        """Stop every node by its process id, then remove the logs on disk."""
        self._stop_nodes()
        shutil.rmtree(self.root, ignore_errors=True)

    def _stop_nodes(self, timeout: float = 10.0) -> None:
        """SIGTERM to all nodes at once (one at a time, the last ones would wait for a
        controller quorum that is gone), then SIGKILL what is left after ``timeout``."""
        running = [node for node in self.nodes if node.alive()]
        for node in running:
            node.resume()
            node.process.terminate()
        deadline = time.monotonic() + timeout
        for node in running:
            try:
                node.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.kill()


class KafkaBroker(_Nodes):
    """One Apache Kafka node for the test session (replication factor 1)."""

    size = 1

    @property
    def node(self) -> KafkaNode:
        return self.nodes[0]

    @property
    def log(self) -> Path:
        return self.node.log_path

    def pause(self) -> None:
        """SIGSTOP: the broker keeps its sockets but answers nothing (a stalled broker)."""
        self.node.pause()

    def resume(self) -> None:
        self.node.resume()

    def restart(self, timeout: float = 60.0) -> None:
        """SIGKILL the broker, then start it again from its log on disk."""
        self.node.kill()
        self.node.launch()
        self.wait_ready(time.monotonic() + timeout)


class KafkaCluster(_Nodes):
    """Three Apache Kafka nodes, each broker and controller: replication factor 3,
    ``min.insync.replicas=2``, for tests of a broker lost under load."""

    size = 3
    heap = "384m"

    def __init__(self, **settings):
        # a node killed and restarted registers again only once its old session ended
        super().__init__(
            **{"broker.session.timeout.ms": 3000, "broker.heartbeat.interval.ms": 500, **settings}
        )

    def restart(self, node: KafkaNode, timeout: float = 60.0) -> None:
        """SIGKILL one node, then start it again from its log on disk."""
        node.kill()
        node.launch()
        self.wait_ready(time.monotonic() + timeout, nodes=[node])


def create_topic(
    bootstrap: str, partitions: int = 1, name: str | None = None, replication: int = 1
) -> str:
    """Create a fresh uuid-named topic and wait until its metadata is visible."""
    from kafka import KafkaConsumer
    from kafka.admin import KafkaAdminClient, NewTopic

    name = name or f"t-{uuid.uuid4().hex[:12]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="ackstream-tests")
    try:
        admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=replication)]
        )
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
