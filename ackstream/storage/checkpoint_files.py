"""Small text files in a query's checkpoint, at a plain path or a file system URL.

A plain path is read and written directly. A URL (``file:``, ``hdfs:``, ``s3a:``...)
goes through Spark's Hadoop file system, as Spark's own checkpoint files do: the
session's Hadoop configuration holds the credentials and the file system classes.
Under Spark Connect this process has no JVM: a URL is read and written with a Spark
job (``spark.read.text``, ``DataFrame.write.text``), which makes the file a folder
holding one part file; every reader here reads either form.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from ackstream.spark.session import is_connect
from ackstream.storage.files import hidden_path, write_atomically

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["is_url", "list_names", "read_text", "remove", "write_text"]


def is_url(path: str) -> bool:
    return bool(urlparse(path).scheme)


def read_text(spark: SparkSession, path: str) -> str | None:
    """The text of the file at ``path``; None if there is none."""
    if not is_url(path):
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except FileNotFoundError:
            return None
    if is_connect(spark):
        return _read_with_spark(spark, path)
    fs, hadoop_path = _hadoop(spark, path)
    if not fs.exists(hadoop_path):
        return None
    if fs.getFileStatus(hadoop_path).isDirectory():  # written from a Connect client
        return _read_with_spark(spark, path)
    stream = fs.open(hadoop_path)
    try:
        text: str = _jvm(spark).org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        return text
    finally:
        stream.close()


def write_text(spark: SparkSession, path: str, text: str) -> None:
    """Write ``text`` to ``path`` whole (under a hidden name first, then renamed into
    place), making its folder. Under Spark Connect a URL is written by a Spark job, as
    a folder of that name holding the text (a reader sees it once the job is done)."""
    if not is_url(path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        write_atomically(path, lambda hidden: _write_local(hidden, text))
        return
    if is_connect(spark):
        one = spark.createDataFrame([(text,)], "value string").coalesce(1)
        one.write.mode("overwrite").text(path)
        return
    fs, hadoop_path = _hadoop(spark, path)
    hidden = _jvm(spark).org.apache.hadoop.fs.Path(hidden_path(path))
    fs.mkdirs(hadoop_path.getParent())
    stream = fs.create(hidden, True)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()
    fs.delete(hadoop_path, False)
    if not fs.rename(hidden, hadoop_path):
        raise OSError(f"could not rename {hidden_path(path)} to {path}")


def list_names(spark: SparkSession, folder: str) -> list[str] | None:
    """The names of the files in ``folder`` ([] if it does not exist); None under Spark
    Connect for a URL (no JVM here to list it with)."""
    if not is_url(folder):
        return os.listdir(folder) if os.path.isdir(folder) else []
    if is_connect(spark):
        return None
    fs, hadoop_path = _hadoop(spark, folder)
    if not fs.exists(hadoop_path):
        return []
    return [status.getPath().getName() for status in fs.listStatus(hadoop_path)]


def remove(spark: SparkSession, path: str) -> None:
    """Delete the file at ``path`` if it is there (not under Spark Connect for a URL:
    :func:`list_names` gave no name to remove)."""
    if not is_url(path):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        return
    fs, hadoop_path = _hadoop(spark, path)
    fs.delete(hadoop_path, False)


def _write_local(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _jvm(spark: SparkSession) -> Any:
    """The JVM of a classic session (py4j's gateway: no types), through which Hadoop's
    file systems are reached."""
    return spark.sparkContext._jvm  # noqa: SLF001 - Spark has no Python API for Hadoop file systems


def _hadoop(spark: SparkSession, path: str) -> tuple[Any, Any]:
    """The session's Hadoop file system of ``path``, and ``path`` as a Hadoop Path (py4j
    objects of the JVM)."""
    hadoop_path = _jvm(spark).org.apache.hadoop.fs.Path(path)
    conf = spark.sparkContext._jsc.hadoopConfiguration()  # noqa: SLF001 - as above
    return hadoop_path.getFileSystem(conf), hadoop_path


def _read_with_spark(spark: SparkSession, path: str) -> str | None:
    """Through a Spark job: works from any session, Spark Connect's included."""
    from pyspark.errors import AnalysisException

    try:
        rows = spark.read.text(path, wholetext=True).collect()
    except AnalysisException as problem:
        if "PATH_NOT_FOUND" in str(problem):
            return None
        raise
    return rows[0][0] if rows else None  # a folder with no text: a write that never ended
