"""Whether a batch has rows the source held back, learned from a Spark job that reads
the batch anyway.

Held-back rows (``ackstream.sources.rows``: an offset with no record, a value over
``ackstream.maxValueBytes``) are rare, but a batch must settle every one. Looking
for them with a job of their own costs a cache of the whole batch and a Spark job,
160-300 ms of a 1.3 s batch of the README's pipeline (benchmarks/e2e.py). Instead a Spark
``Observation`` counts them, and the rows seen, in the first job that reads the
batch (the sink's). The count is trusted only when that job saw every row the
offset planned: a first job that read part of the batch (``isEmpty()``, ``limit``)
or none leaves it unknown, and the caller then reads the held-back rows itself.
"""

from __future__ import annotations

import logging
import uuid

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ackstream.lineage import REASON
from ackstream.session import is_connect

__all__ = ["HeldWatch"]

log = logging.getLogger(__name__)


class HeldWatch:
    """The held-back rows of a batch of ``planned`` rows, counted as it is read."""

    def __init__(self, batch: DataFrame, planned: int):
        self.planned = planned
        self._observation = _observation(batch, f"ackstream-held-{uuid.uuid4().hex}")
        #: the batch to read instead of ``batch``: reading it counts
        self.frame = batch.observe(
            self._observation, F.count(F.lit(1)).alias("rows"), F.count(REASON).alias("held")
        )

    def held(self) -> int | None:
        """How many rows were held back; None when no finished job saw every row."""
        if not self.planned:  # an empty batch: no job need read it
            return 0
        seen = _metrics(self._observation)
        if seen is None or seen.get("rows") != self.planned:
            return None
        return seen["held"]


def _observation(batch: DataFrame, name: str):
    """An Observation of the batch's kind: a batch function under Connect runs in a
    process where pyspark may not know it is a Connect client."""
    if is_connect(batch.sparkSession):
        from pyspark.sql.connect.observation import Observation
    else:
        from pyspark.sql.observation import Observation
    return Observation(name)


def _metrics(observation) -> dict | None:
    """The observation's metrics if its first job has finished, else None; never waits
    (classic PySpark's ``get`` would wait for a job that may never come)."""
    job = getattr(observation, "_jo", None)  # classic: the JVM Observation
    try:
        if job is not None and not job.future().isCompleted():
            return None
        return observation.get or None  # Connect: {} until the job reported
    except Exception:  # the job failed, or an API this code does not know
        log.debug("no held-back row count from %r", observation, exc_info=True)
        return None
