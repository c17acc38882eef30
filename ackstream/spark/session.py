"""What ackstream asks of a Spark session: Spark Connect or classic, its master, the
Java it runs on, whether a function can travel to a Connect server, whether it has
Spark's Kafka connector. Making a session
is :mod:`ackstream.sources.launch`'s (it registers the data sources, which sit above this)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ackstream.errors import AckstreamError, EnvironmentProblem

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "check_picklable",
    "has_kafka_connector",
    "is_connect",
    "is_local_master",
    "java_major_version",
    "kafka_through_v2",
    "master_of",
]


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


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect client session (no JVM in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def check_picklable(function: object, what: str) -> None:
    """Under Spark Connect ``foreachBatch`` pickles its function to the server: say which
    part of ``what`` cannot travel, before Spark fails with a bare pickling error."""
    from pyspark import cloudpickle

    try:
        cloudpickle.dumps(function)  # type: ignore[no-untyped-call]  # pyspark's copy: no types
    except Exception as error:
        raise AckstreamError(
            f"{what} cannot run under Spark Connect: its foreachBatch function must be "
            f"pickled to the server, and {type(error).__name__}: {error}"
        ) from error


def master_of(spark: SparkSession) -> str:
    """The master URL of ``spark``'s application (``local[2]``, ``spark://...``)."""
    return spark.conf.get("spark.master", "local[*]") or "local[*]"


def is_local_master(master: str) -> bool:
    """Whether ``master`` runs every executor in the driver's process (``local``,
    ``local[N]``, ``local[N,F]``); ``local-cluster[...]`` starts separate ones."""
    return master == "local" or master.startswith("local[")


#: Spark's setting naming the sources it reads and writes through its version 1 paths.
V1_SOURCES = "spark.sql.sources.useV1SourceList"


@contextlib.contextmanager
def kafka_through_v2(spark: SparkSession) -> Iterator[None]:
    """Inside, ``spark.read`` / ``write`` ``.format("kafka")`` take Spark's version 2 path.

    Spark's default list sends Kafka batch reads and writes through version 1, where a
    read plans a nested SQL execution of its own (an execution id, its events and the
    plan's explain string) each time, a large share of what planning the read costs.
    Version 2 also makes a write a job of its own whose plan holds the batch's, so an
    Observation on the batch is filled by it. The choice is made when ``load()`` or
    ``save()`` is called, so only those calls need be inside."""
    conf = spark.conf
    v1_sources = conf.get(V1_SOURCES) or ""  # with a default given, get() returns it
    v2_only = ",".join(s for s in v1_sources.split(",") if s.strip().lower() != "kafka")
    if v2_only == v1_sources:
        yield
        return
    conf.set(V1_SOURCES, v2_only)
    try:
        yield
    finally:
        conf.set(V1_SOURCES, v1_sources)


def has_kafka_connector(spark: SparkSession) -> bool:
    """Whether ``spark`` can load Spark's Kafka source (``spark-sql-kafka-0-10`` on its
    class path, e.g. by ``spark.jars.packages``). Asked by resolving a batch read's
    schema, which touches no broker, so it works under Spark Connect too."""
    try:
        reader = spark.read.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:9")
        reader.option("subscribe", "ackstream-probe").load().schema  # noqa: B018
    except Exception:  # not found (or refused): the Python reader reads
        return False
    return True
