"""Spark processes for tests, from the installed pyspark package: a Spark Connect server
(and, later, a standalone cluster), each on free loopback ports.

Each process is started with ``SPARK_HOME`` = the pyspark package folder and
``PYSPARK_PYTHON`` = this interpreter, polled until it answers (never a fixed sleep),
and stopped by its pid. The scripts under ``$SPARK_HOME/bin`` ``exec`` the JVM, so
the pid started is the JVM's.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from broker import free_port

__all__ = ["ConnectServer", "spark_env", "spark_home"]


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
