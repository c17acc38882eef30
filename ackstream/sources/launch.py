"""A SparkSession set up the way ackstream needs it, with ``spark.readStream.format(
"ackstream")`` registered: local (embedded mode and tests), on a cluster master, or a
Spark Connect client.

On a cluster master the executors must import ackstream: install it on every host, or
ship it with ``spark.submit.pyFiles`` (a zip of the ``ackstream`` folder) or
``spark.archives`` (a packed virtual environment), given in ``conf``. Under Spark
Connect the server's Python workers run the sources and the topology's
``foreachBatch``: ackstream must be importable there, and paths (checkpoints, a local
channel) are the server's.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from ackstream.errors import EnvironmentProblem, OptionError
from ackstream.sources.datasource import register
from ackstream.spark.session import is_local_master, java_major_version

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["local_session"]


def local_session(
    app_name: str = "ackstream",
    cores: int = 2,
    conf: dict[str, Any] | None = None,
    *,
    master: str | None = None,
    remote: str | None = None,
) -> SparkSession:
    """A SparkSession with ackstream's data sources registered.

    By default ``local[cores]``: UI off, loopback only, ``cores`` shuffle partitions,
    this interpreter as the Python worker, jobs scheduled fairly between pools. ``master`` (``spark://host:7077``,
    ``yarn``...) runs it on a cluster instead (the driver's address is then Spark's
    default, which the executors can reach); ``remote`` (``sc://host:15002``) makes a
    Spark Connect client instead, with no JVM here. ``conf`` adds or overrides
    settings (under Connect, runtime settings only)."""
    if master and remote:
        raise OptionError(
            "remote", remote, "no value together with master (Connect's server has its own master)"
        )
    from pyspark.sql import SparkSession

    if remote:
        return _connect_session(remote, app_name, conf or {})
    major = java_major_version()
    if major < 17:
        raise EnvironmentProblem(f"Java {major} found", "Spark 4 needs Java 17 or newer.")
    master = master or f"local[{cores}]"
    local = is_local_master(master)
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        # the acker's jobs run in a pool of their own (ackstream.acker.query): scheduled
        # fairly, they take the next free core, not the end of a topology's long job
        .config("spark.scheduler.mode", "FAIR")
        # pyspark's own worker code warns on a pandas concat it does; not ours to fix
        .config("spark.executorEnv.PYTHONWARNINGS", "ignore::FutureWarning")
    )
    if local:
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
            "spark.driver.host", "127.0.0.1"
        )
    for key, value in (conf or {}).items():
        builder = builder.config(key, str(value))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session


def _connect_session(remote: str, app_name: str, conf: dict[str, Any]) -> SparkSession:
    """A Spark Connect client of ``remote`` with ackstream's data sources registered."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.remote(remote).appName(app_name)
    for key, value in {"spark.sql.execution.arrow.pyspark.enabled": "true", **conf}.items():
        builder = builder.config(key, str(value))
    session = builder.getOrCreate()
    register(session)
    return session
