"""The end-to-end benchmark (benchmarks/e2e.py) runs at tiny sizes over the session's
broker: every system does the same work (its output's counts per word are the input's,
which the harness itself checks after each run) and the JSON carries every figure the
targets name. No figure is checked against a bound (the machine is shared); only that
every path works. One repeat, no warm-up round, one cold system: the warm Spark
systems share one worker, and the cold one starts a Spark of its own. (The cold
kafka-python loop would be cheaper, but its fresh consumer twice spun in kafka-python's
coordinator lookup for the whole run, committing nothing: a client bug the loop peer
cannot work around, and not what this test checks.)"""

import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import e2e

pytestmark = [pytest.mark.bench, pytest.mark.broker]

BATCH = 1_000
#: Quix commits a checkpoint per BATCH records, not per partition, and may read one
#: partition whole before the other: with few batches its first commit past the warm-up
#: may be its last, which leaves nothing to time (4 batches did so once in a while)
BATCHES = 8
COLD = "ackstream_untracked"


@pytest.mark.timeout(1200)
def test_every_system_does_the_same_work_and_the_json_has_every_figure(broker, tmp_path):
    path = tmp_path / "e2e.json"
    out = e2e.main(
        [
            "--batch-sizes",
            str(BATCH),
            "--batches",
            str(BATCHES),
            "--warmup-batches",
            "1",
            "--repeats",
            "1",
            "--no-warmup-round",
            "--cold-systems",
            COLD,
            "--latency-seconds",
            "2",
            "--latency-lead-s",
            "1",
            "--bootstrap",
            broker.bootstrap,
            "--output",
            str(path),
        ]
    )
    assert path.read_text().strip()
    assert {"cores_usable", "loadavg", "pyspark", "kafka_python", "quixstreams"} <= set(
        out["machine"]
    )
    ran = set(out["config"]["systems"])
    assert ran | set(out["config"]["skipped"]) == set(e2e.SYSTEMS)
    assert {"ackstream_kafka", "ackstream_untracked", "kafka_python_loop"} <= ran
    size = out["sizes"][BATCH]
    assert size["timed_records"] == BATCHES * BATCH and size["warmup_records"] == BATCH
    assert set(size["inputs"]) == {"plain", "event", "pairs"} <= set(size["input_of"].values())
    assert set(size["systems"]) == ran
    for system, figures in size["systems"].items():
        (run,) = figures["runs"]
        assert run["words_counted"] == size["inputs"][size["input_of"][system]]["words"], system
        assert 0 < run["output_messages"] < size["words"], system
        assert run["records_per_s"] > 0 and len(run["loadavg_before"]) == 3, system
        # CPU of processes that ended during the run is kept (a sum went negative once)
        assert run["cpu_us_per_record"] > 0 and 0 <= run["jit_cpu_share"] <= 1, system
        assert figures["records_per_s"]["min"] <= figures["records_per_s"]["max"], system
        if system in e2e.SPARK_SYSTEMS:  # counted from Spark's JVM
            assert run["compilations_per_batch"] >= 0 and run["batches"] > 0, system
    cold = out["cold"][COLD]
    assert 0 < cold["to_first_output_s"] <= cold["to_all_committed_s"]
    latency = out["latency"]
    assert latency["acked"] == latency["records"] and latency["lead_in_records"] > 0
    assert latency["progress"] and "addBatch" in latency["phase_ms_median"]
    assert latency["complete_p99_ms"] >= 0 and latency["committed_p99_ms"] >= 0
    named = {(t["name"], t["batch_size"]) for t in out["targets"]}
    for name, system, other, *_ in e2e.TARGETS:
        assert (name, BATCH) in named or not {system, other} <= ran, name
    assert any(t["name"].startswith("latency complete_p99_ms") for t in out["targets"])


def test_a_system_that_counted_fewer_words_fails_the_run():
    expected = Counter({b"ba": 3, b"ce": 2})
    e2e.check_same_work("quix", expected, {b"ba": 3, b"ce": 2})
    with pytest.raises(RuntimeError, match="quix did not do the same work.*4 words against 5"):
        e2e.check_same_work("quix", expected, {b"ba": 3, b"ce": 1})
    with pytest.raises(RuntimeError, match="1 words differ"):
        e2e.check_same_work("quix", expected, {b"ba": 3, b"ce": 2, b"di": 1})
