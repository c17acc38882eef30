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

from pyspark.sql import DataFrame

from ackstream.spark.observed import Observed
from ackstream.vocabulary.lineage import REASON

__all__ = ["HeldWatch"]


class HeldWatch:
    """The held-back rows of a batch of ``planned`` rows, counted as it is read."""

    def __init__(self, batch: DataFrame, planned: int):
        self.planned = planned
        self._observed = Observed(batch, "held", rows="count(1)", held=f"count({REASON})")
        #: the batch to read instead of ``batch``: reading it counts
        self.frame = self._observed.frame

    def held(self) -> int | None:
        """How many rows were held back; None when no finished job saw every row."""
        if not self.planned:  # an empty batch: no job need read it
            return 0
        seen = self._observed.metrics()
        if seen is None or seen.get("rows") != self.planned:
            return None
        return int(seen["held"])
