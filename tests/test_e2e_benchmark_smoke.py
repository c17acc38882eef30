"""The end-to-end benchmark (benchmarks/e2e.py) runs at tiny sizes over the session's
broker: each system commits every input offset, and the JSON has every key. No figure
is checked (the machine is shared); only that every path works. ``ackstream_local``
is left out (the local channel's topology runs in many other tests; each Spark system
costs the suite a Spark start-up, about 35 s)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import e2e

pytestmark = [pytest.mark.bench, pytest.mark.broker]

RECORDS = 2_000
SYSTEMS = [s for s in e2e.SYSTEMS if s != "ackstream_local"]


def test_every_system_commits_every_offset_and_the_json_has_every_key(broker, tmp_path):
    path = tmp_path / "e2e.json"
    out = e2e.main(
        [
            "--records",
            str(RECORDS),
            "--max-per-batch",
            "1000",  # two batches a system at least
            "--latency-seconds",
            "2",
            "--systems",
            ",".join(SYSTEMS),
            "--bootstrap",
            broker.bootstrap,
            "--output",
            str(path),
        ]
    )
    assert path.read_text().strip()
    assert {"benchmark", "date", "machine", "config", "systems", "latency", "ratios"} <= set(out)
    assert {"nproc", "cpu", "memory_bytes", "python", "pyspark", "kafka_python", "crc32c"} <= set(
        out["machine"]
    )
    ran = set(out["systems"])
    assert ran | set(out["config"]["skipped"]) == set(SYSTEMS)
    assert {"ackstream_kafka", "ackstream_untracked", "kafka_python_loop"} <= ran
    for system, result in out["systems"].items():
        assert result["committed_all"] and result["committed"] == RECORDS, system
        assert result["output_messages"] > 0, system
        assert result["records_per_s"] > 0 and result["cpu_s"] >= 0, system
        assert result["startup_s"] > 0, system
    latency = out["latency"]
    assert latency["acked"] == latency["records"]
    for key in ("complete_p50_ms", "complete_p99_ms", "committed_p50_ms", "committed_p99_ms"):
        assert latency[key] is not None and latency[key] >= 0, key
    ratios = out["ratios"]
    assert set(ratios) == {
        "tracked_kafka_over_quix",
        "tracked_kafka_over_loop",
        "tracked_kafka_over_spark_kafka",
        "tracking_overhead_kafka_channel",
        "tracking_overhead_local_channel",
    }
    for key, value in ratios.items():
        needs = {
            "tracked_kafka_over_quix": "quix",
            "tracked_kafka_over_spark_kafka": "spark_kafka",
            "tracking_overhead_local_channel": "ackstream_local",
        }
        assert value is not None or needs.get(key) not in ran, key
