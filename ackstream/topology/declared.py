"""Mistakes a topology's declaration holds, found at ``start()`` instead of in its
first batch; and the topologies this process started.

:func:`analyse` applies the stateless stages (SQL, DataFrame functions, filters,
fails and rejects, explodes, aggregates, pandas bolts' declared output) to a frame
of no rows with the stream's columns, as a batch applies them to its rows, and asks
each result for its schema: Spark analyses the plan then, with no row read, so a
misspelled column, an unknown function or a stage that drops the lineage columns
fails in the time that analysis takes (a fraction of a second a stage on a warm
session), naming the stage. A stage that holds rows across batches (a
window, a waiting join) is not analysed, nor what reads its output.

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
from ackstream.topology.bolts import (
    AggregateStage,
    BatchContext,
    ExplodeStage,
    FailWhereStage,
    MapStage,
    SqlStage,
    Stage,
    check_lineage,
)
from ackstream.topology.graph import SPOUT, join_streams
from ackstream.topology.modes import UNTRACKED, Mode
from ackstream.topology.pandas_bolt import PandasBoltStage
from ackstream.vocabulary.lineage import LINEAGE_COLUMNS

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
        if len(inputs) < len(known) or not isinstance(stage, _ANALYSED):
            continue  # a stage that holds rows, or what reads it: not known here
        try:
            with _quiet():
                out = _output(stage, join_streams(inputs), topology.mode)
                out.schema  # noqa: B018 - asking for it is what makes Spark analyse the plan
        except AckstreamError:
            raise
        except Exception as error:  # Spark's AnalysisException, or the user's code
            raise StageError(stage.name, f"does not fit its input: {_first_line(error)}") from None
        finally:
            if isinstance(stage, SqlStage):  # the batch registers its own frame there
                tuples.sparkSession.catalog.dropTempView(stage.view)
        streams[stage.name] = out


def _empty_like(tuples: DataFrame) -> DataFrame:
    """A static frame of no rows with the columns of ``tuples``: what a batch gives the
    stages is static, so code that runs an action on it (``count()``, ``toPandas()``)
    is analysed as it will run; built from expressions, it costs no job."""
    columns = [F.lit(None).cast(f.dataType).alias(f.name) for f in tuples.schema.fields]
    return tuples.sparkSession.range(0).select(*columns)


#: The stages :func:`analyse` runs on an empty frame: none holds rows across batches.
_ANALYSED = (MapStage, FailWhereStage, ExplodeStage, AggregateStage, PandasBoltStage)


def _output(stage: Stage, frame: DataFrame, mode: Mode) -> DataFrame:
    """What ``stage`` (one of :data:`_ANALYSED`) makes of ``frame``, without persisting
    or running anything."""
    if isinstance(stage, FailWhereStage):
        frame.select(stage.condition, stage.reason).schema  # noqa: B018 - analyses both
        return frame
    if isinstance(stage, PandasBoltStage):  # its function runs in a batch only
        lineage = [c for c in frame.columns if c in LINEAGE_COLUMNS]
        declared = F.from_json(F.lit(None).cast("string"), stage.schema).alias(_DECLARED)
        return frame.select(*lineage, declared).select(*lineage, f"{_DECLARED}.*")
    if isinstance(stage, MapStage):  # the user's code, and the lineage it must keep
        out = stage.apply(frame)
        if mode.tracks:
            check_lineage(stage, frame, out)
        return out
    # an explode's or aggregate's own expressions, without the lineage ackstream adds
    # to its output (its ids cannot fail on the user's columns)
    return stage.run(frame, BatchContext(UNTRACKED, 0, 0, None, 0, None)).tuples


_DECLARED = "_declared"


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
