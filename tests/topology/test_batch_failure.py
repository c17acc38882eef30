"""Which errors of a batch isolate its roots, and the completions they get."""

import pyarrow as pa
import pytest
from pyspark.errors import AnalysisException, PythonException

from ackstream.errors import EnvironmentProblem, OptionError, StageError
from ackstream.topology.batch_failure import (
    BatchDeadline,
    batch_failed_completions,
    failure_reason,
    isolates,
)
from ackstream.vocabulary.records import BATCH_FAILED, COMPLETION_SCHEMA


def deadline(passed: bool) -> BatchDeadline:
    watch = BatchDeadline(spark=None, tag="t", deadline_ms=5_000)
    watch.passed = passed
    return watch


@pytest.mark.parametrize(
    "error",
    [
        PythonException("ValueError: bad record"),
        RuntimeError("Job aborted due to stage failure: task 0 failed 1 times"),
        ZeroDivisionError("division by zero"),
    ],
)
def test_an_error_a_record_may_cause_isolates_the_batch(error):
    assert isolates(error, deadline(False))


@pytest.mark.parametrize(
    "error",
    [
        OptionError("maxOffsetsPerTrigger", "-1", "a whole number >= 1"),
        StageError("parse", "its output lost the lineage column(s) ['_root']"),
        EnvironmentProblem("the brokers did not answer", "start them"),
        AnalysisException("[UNRESOLVED_COLUMN] `nope` cannot be resolved"),
        RuntimeError("An exception was raised by the Python Proxy: StageError: stage 'm'"),
        RuntimeError("PythonException: ackstream.errors.EnvironmentProblem: topic 't' was deleted"),
        RuntimeError("Job 3 cancelled because SparkContext was shut down"),
        KeyboardInterrupt(),
    ],
)
def test_an_error_no_record_causes_stops_the_query(error):
    assert not isolates(error, deadline(False))


def test_a_passed_deadline_isolates_whatever_the_cancelled_jobs_raised():
    assert isolates(RuntimeError("Job 7 cancelled part of cancelled job tag"), deadline(True))
    reason = failure_reason(RuntimeError("cancelled"), deadline(True), ["parse", "sink#1"])
    assert reason.startswith("batch_deadline_ms=5000 passed") and "parse, sink#1" in reason


def test_every_root_of_the_batch_completes_as_batch_failed_with_the_reason():
    inits = pa.table(
        {
            "root": pa.array([11, 12], pa.int64()),
            "topic": ["t", "t"],
            "partition": pa.array([0, 1], pa.int32()),
            "offset": pa.array([5, 9], pa.int64()),
            "attempt": pa.array([0, 2], pa.int32()),
            "ts": pa.array([1_000, 1_500], pa.int64()),
        }
    )
    done = batch_failed_completions(inits, "SparkRuntimeException: poison", now_ms=2_000)
    assert done.schema == COMPLETION_SCHEMA
    assert done.to_pydict() == {
        "root": [11, 12],
        "status": [BATCH_FAILED] * 2,
        "topic": ["t", "t"],
        "partition": [0, 1],
        "offset": [5, 9],
        "attempt": [0, 2],
        "latency_ms": [1_000, 500],
        "completed_ms": [2_000, 2_000],
        "reason": ["SparkRuntimeException: poison"] * 2,
        "end_offset": [None, None],  # one row per root
        "ids": [None, None],
    }
