"""Mistakes a topology's declaration holds, found at ``start()`` instead of in its
first batch; and the topologies this process started.

:func:`analyse` asks each stage what it makes of a frame of no rows with the
stream's columns (``Stage.declared_output``: SQL, DataFrame functions, filters, fails
and rejects, explodes, aggregates, pandas bolts' declared columns), and asks
each result for its schema: Spark analyses the plan then, with no row read, so a
misspelled column, an unknown function or a stage that drops the lineage columns
fails in the time that analysis takes (a fraction of a second a stage on a warm
session), naming the stage. A stage that holds rows across batches (a
window, a waiting join) answers None: it is not analysed, nor what reads its output.

:func:`record_start` and :func:`started`: the topologies ``start()`` started in this
process with their checkpoints, which ``ackstream run`` reads its figures from.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ackstream.errors import AckstreamError, StageError
from ackstream.spark.driver import pyspark_error_loggers
from ackstream.topology.batch import DeclaredTopology
from ackstream.topology.graph import SPOUT, join_streams

__all__ = ["analyse", "record_start", "started"]

_started: list[tuple[object, str]] = []


def record_start(topology: object, checkpoint: str) -> None:
    """Note that ``topology`` was started with ``checkpoint`` in this process."""
    _started.append((topology, checkpoint))


def started() -> list[tuple[object, str]]:
    """``(topology, checkpoint)`` of every topology started in this process, oldest first."""
    return list(_started)


def analyse(topology: DeclaredTopology, tuples: DataFrame) -> None:
    """Raise :class:`StageError` naming the first stage of ``topology`` whose code does
    not fit the stream it reads, starting from the schema of ``tuples`` (see the
    module doc)."""
    streams: dict[str, DataFrame | None] = {SPOUT: _empty_like(tuples)}
    for stage in topology.stages:
        known = [streams.get(name) for name in stage.after]
        inputs = [frame for frame in known if frame is not None]
        streams[stage.name] = None  # unless analysed below
        if not inputs or len(inputs) < len(known):
            continue  # it reads a stage that holds rows: not known here
        try:
            with _quiet():
                out = stage.declared_output(join_streams(inputs), topology.mode)
                if out is not None:
                    out.schema  # noqa: B018 - asking for it is what makes Spark analyse the plan
        except AckstreamError:
            raise
        except Exception as error:  # Spark's AnalysisException, or the user's code
            raise StageError(stage.name, f"does not fit its input: {_first_line(error)}") from None
        finally:
            stage.analysed(inputs[0])
        streams[stage.name] = out


def _empty_like(tuples: DataFrame) -> DataFrame:
    """A static frame of no rows with the columns of ``tuples``: what a batch gives the
    stages is static, so code that runs an action on it (``count()``, ``toPandas()``)
    is analysed as it will run; built from expressions, it costs no job."""
    columns = [F.lit(None).cast(f.dataType).alias(f.name) for f in tuples.schema.fields]
    return tuples.sparkSession.range(0).select(*columns)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """pyspark's loggers that print each analysis error with the JVM's stack trace
    (:data:`~ackstream.spark.driver.PYSPARK_ERROR_LOGGERS`) say nothing while a stage is
    analysed: its error is raised as one :class:`StageError` instead."""
    # made as pyspark makes them: a plain logger of the same name, made first, would be
    # the one pyspark is given, and its error(..., errorClass=) raises a TypeError
    loggers = pyspark_error_loggers()
    before = [logger.disabled for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    try:
        yield
    finally:
        for logger, was in zip(loggers, before):
            logger.disabled = was


def _first_line(error: Exception) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:500]
