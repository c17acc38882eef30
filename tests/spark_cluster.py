"""Spark processes for tests, from the installed pyspark package: a Spark Connect server
and a standalone cluster (a Master and Workers), each on free loopback ports.

Each process is started with ``SPARK_HOME`` = the pyspark package folder and
``PYSPARK_PYTHON`` = this interpreter, polled until it answers (never a fixed sleep),
and stopped by its pid. The scripts under ``$SPARK_HOME/bin`` ``exec`` the JVM, so
the pid started is the JVM's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from broker import free_port
from helpers import spark_kafka_conf

__all__ = ["APPLICATION_CONF", "ConnectServer", "StandaloneCluster", "spark_env", "spark_home"]

#: Settings of an application on a :class:`StandaloneCluster`: one core and a small heap
#: an executor, the driver on loopback.
APPLICATION_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.executor.cores": "1",
    "spark.executor.memory": "512m",
}


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_env() -> dict:
    """The environment a Spark process of the tests runs with: loopback, this Python."""
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(spark_home()),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        # the Python workers beside the server import ackstream from this checkout
        PYTHONPATH=os.pathsep.join(
            p for p in (str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH")) if p
        ),
    )
    return env


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class ConnectServer:
    """The Spark Connect server bundled with pyspark, ``local[cores]``, on a free
    loopback port; ``url`` is what ``SparkSession.builder.remote`` takes."""

    def __init__(self, cores: int = 2, heap: str = "768m"):
        self.cores, self.heap = cores, heap
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="ackstream-connect-"))
        self.log = self.dir / "server.log"
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> ConnectServer:
        command = [
            str(spark_home() / "bin" / "spark-submit"),
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--master",
            f"local[{self.cores}]",
            "--driver-memory",
            self.heap,
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            f"spark.connect.grpc.binding.port={self.port}",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.driver.host=127.0.0.1",
            "--conf",
            "spark.driver.bindAddress=127.0.0.1",
            "--conf",
            f"spark.sql.shuffle.partitions={self.cores}",
            "--conf",
            "spark.executorEnv.PYTHONWARNINGS=ignore::FutureWarning",
        ]
        for key, value in spark_kafka_conf().items():  # Spark's Kafka connector, if resolved
            command += ["--conf", f"{key}={value}"]
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=spark_env(), cwd=self.dir
            )
        deadline = time.monotonic() + timeout
        while not _listening(self.port):
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the Spark Connect server exited with {self.process.returncode}: "
                    f"{self.log.read_text(errors='replace')[-3000:]}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the Spark Connect server did not listen in {timeout:g}s")
            time.sleep(0.2)
        return self

    def stop(self, timeout: float = 20.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class StandaloneCluster:
    """A Spark standalone Master and ``workers`` Workers of ``cores`` cores each, on
    127.0.0.1; ``url`` (``spark://...``) is what an application's master takes.

    Each Worker runs in a process group of its own, which its executors and their
    Python workers join: :meth:`kill_worker` SIGKILLs that group, as if its host
    died. Executors run this interpreter (``PYSPARK_PYTHON``), so they import
    ackstream from this environment, as on a cluster where it is installed."""

    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "1g"):
        self.cores, self.memory = cores, memory
        self.port, self.ui_port = free_port(), free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="ackstream-standalone-"))
        self.master: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen | None] = [None] * workers

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _daemon(self, name: str, main: str, *args: str) -> subprocess.Popen:
        env = {**spark_env(), "SPARK_DAEMON_MEMORY": "256m", "SPARK_LOG_DIR": str(self.dir)}
        with open(self.dir / f"{name}.log", "wb") as log:
            return subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), main, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.dir,
                start_new_session=True,  # the group kill_worker ends
            )

    def _start_worker(self, index: int) -> None:
        work = self.dir / f"worker-{index}"
        work.mkdir(exist_ok=True)
        self.workers[index] = self._daemon(
            f"worker-{index}",
            "org.apache.spark.deploy.worker.Worker",
            *("--host", "127.0.0.1", "--webui-port", str(free_port())),
            *("--cores", str(self.cores), "--memory", self.memory),
            *("--work-dir", str(work), self.url),
        )

    def alive_workers(self) -> int:
        """How many Workers the Master counts alive (its JSON status page)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as page:
            return int(json.load(page).get("aliveworkers", 0))

    def start(self, timeout: float = 180.0) -> StandaloneCluster:
        self.master = self._daemon(
            "master",
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(self.port)),
            *("--webui-port", str(self.ui_port)),
        )
        for index in range(len(self.workers)):
            self._start_worker(index)
        deadline = time.monotonic() + timeout
        while True:
            for name, process in [("master", self.master)] + [
                (f"worker-{i}", w) for i, w in enumerate(self.workers)
            ]:
                if process.poll() is not None:
                    self.stop()
                    raise RuntimeError(
                        f"the standalone {name} exited with {process.returncode}: "
                        f"{(self.dir / f'{name}.log').read_text(errors='replace')[-3000:]}"
                    )
            try:
                if self.alive_workers() == len(self.workers):
                    return self
            except OSError:
                pass  # the Master's page is not up yet
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"the standalone cluster did not count {len(self.workers)} workers "
                    f"in {timeout:g}s; logs in {self.dir}"
                )
            time.sleep(0.5)

    def kill_worker(self, index: int) -> None:
        """SIGKILL Worker ``index`` with its executors and their Python workers."""
        process, self.workers[index] = self.workers[index], None
        if process is not None:
            _kill_group(process, signal.SIGKILL)
            process.wait()

    def restart_worker(self, index: int) -> None:
        """Start Worker ``index`` again (after :meth:`kill_worker`), as a host coming
        back; the Master hands it executors of running applications from then on."""
        if self.workers[index] is None:
            self._start_worker(index)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the Workers (with their groups) and the Master, SIGKILL what is left."""
        running = [w for w in self.workers if w is not None] + [self.master]
        running = [p for p in running if p is not None]
        self.workers, self.master = [None] * len(self.workers), None
        for process in running:
            _kill_group(process, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for process in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.0, deadline - time.monotonic()))
            _kill_group(process, signal.SIGKILL)  # executors left behind, if any
            process.wait()


def _kill_group(process: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to the process group ``process`` leads (it was started in a session
    of its own), if it still exists."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
