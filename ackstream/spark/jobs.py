"""Spark jobs named by the part of a batch that starts them.

Spark names a job by its call site, which for every job of a topology's batch is the
same py4j frame; with the part named in the job's description, Spark's UI (and a
benchmark reading it) says which stage, sink or ack collect a job and its time are.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ackstream.spark.session import is_connect

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["described_jobs"]

_DESCRIPTION = "spark.job.description"


@contextlib.contextmanager
def described_jobs(spark: SparkSession, description: str) -> Iterator[None]:
    """Jobs started inside carry ``description`` (after the one set before, such as the
    streaming batch's own, which is put back after). Spark Connect has no such call on
    the client: nothing changes there."""
    if is_connect(spark):
        yield
        return
    context = spark.sparkContext
    before = context.getLocalProperty(_DESCRIPTION)
    context.setLocalProperty(_DESCRIPTION, f"{before}\n{description}" if before else description)
    try:
        yield
    finally:
        context.setLocalProperty(_DESCRIPTION, before)  # type: ignore[arg-type]
