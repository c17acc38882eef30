"""A local SparkSession set up the way ackstream's embedded mode and tests need it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from ackstream.errors import EnvironmentProblem

__all__ = ["local_session", "java_major_version"]


def java_major_version() -> int:
    """The major version of the ``java`` that Spark will start, or raise if there is none."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise EnvironmentProblem(
            "Java was not found (Spark runs on the JVM)",
            "Install Java 17 or newer (Debian/Ubuntu: apt-get install openjdk-17-jre-headless) "
            "or set JAVA_HOME.",
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not match:
        raise EnvironmentProblem(f"could not read the Java version from {java}", out.strip())
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 else major


def local_session(app_name: str = "ackstream", cores: int = 2, conf: dict | None = None):
    """A ``local[cores]`` SparkSession: UI off, loopback only, few shuffle partitions,
    this interpreter as the Python worker; ``conf`` adds or overrides settings."""
    major = java_major_version()
    if major < 17:
        raise EnvironmentProblem(f"Java {major} found", "Spark 4 needs Java 17 or newer.")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        # pyspark's own worker code warns on a pandas concat it does; not ours to fix
        .config("spark.executorEnv.PYTHONWARNINGS", "ignore::FutureWarning")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, str(value))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    from ackstream.sources.datasource import register

    register(session)  # spark.readStream.format("ackstream")
    return session
