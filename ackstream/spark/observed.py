"""Counts that Spark computes while a job reads a DataFrame anyway, read back without
waiting for a job that may never come.

A Spark ``Observation`` adds aggregate metrics to a plan; the first job that runs
the plan fills them in. The batch's own jobs (the sink's write, the ack records'
collect) then count for free: no cache, no job of ackstream's own. What a reader
must keep in mind: the metrics are those of the *first finished* job over the
frame, so a first job that reads part of it (``isEmpty()``, ``limit``) counts part,
and a frame no job reads never gets metrics (:meth:`Observed.metrics` is then None).
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ackstream.spark.session import is_connect

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.observation import Observation

__all__ = ["Observed"]

log = logging.getLogger(__name__)


class Observed:
    """``frame`` is ``df`` with named aggregate ``metrics`` (SQL text, e.g. ``"count(1)"``),
    filled in by the first job that reads ``frame`` (not ``df``).

    SQL text rather than Columns: each Column a metric is built from is a call into the
    JVM, and a batch observes on every run."""

    def __init__(self, df: DataFrame, what: str, **metrics: str):
        self._observation = _observation(df, f"ackstream-{what}-{uuid.uuid4().hex}")
        self._spark = df.sparkSession
        self.frame = df.observe(
            self._observation, *(F.expr(f"{sql} AS `{name}`") for name, sql in metrics.items())
        )

    def metrics(self) -> dict[str, Any] | None:
        """The metrics if a job over ``frame`` has finished, else None; never waits for
        a job (classic PySpark's ``get`` would wait for one that may never come).

        A finished job's metrics reach the Observation through Spark's listener bus,
        a few milliseconds after the job returned: when they are not there yet, this
        waits (boundedly) for the bus to deliver the events already posted, so that a
        job that did run is not taken for one that did not."""
        observation = self._observation
        job = getattr(observation, "_jo", None)  # classic: the JVM Observation
        try:
            if job is not None and not job.future().isCompleted():
                _deliver_posted_events(self._spark)
                if not job.future().isCompleted():
                    return None
            return observation.get or None  # Connect: {} until the job reported
        except Exception:  # the job failed, or an API this code does not know
            log.debug("no metrics from %r", observation, exc_info=True)
            return None


#: The longest :meth:`Observed.metrics` waits for Spark's listener bus.
DELIVERY_WAIT_MS = 2_000


def _deliver_posted_events(spark: SparkSession) -> None:
    """Wait until Spark's listener bus has delivered every event posted so far (the end
    of a finished job among them), at most :data:`DELIVERY_WAIT_MS`."""
    try:
        bus = spark.sparkContext._jsc.sc().listenerBus()  # noqa: SLF001 - no Python API
        bus.waitUntilEmpty(DELIVERY_WAIT_MS)
    except Exception:  # a bus that stays busy, or a Spark without this method
        log.debug("Spark's listener bus did not empty", exc_info=True)


def _observation(df: DataFrame, name: str) -> Observation:
    """An Observation of the frame's kind: a batch function under Connect runs in a
    process where pyspark may not know it is a Connect client."""
    if is_connect(df.sparkSession):
        from pyspark.sql.connect.observation import Observation as ConnectObservation

        # Connect's own class, not a subclass of classic's: Connect's observe takes it
        return ConnectObservation(name)  # type: ignore[return-value]
    from pyspark.sql.observation import Observation

    return Observation(name)
