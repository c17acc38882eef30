"""The acker benchmark runs end to end at tiny sizes with exact counts (no timing checks)."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import acker

pytestmark = pytest.mark.spark


def test_generated_records_xor_to_zero_per_root():
    table = acker.generate(50, fanout=3, block_roots=20).to_pandas()
    assert len(table) == 50 * 5
    per_root = table.groupby("root")["value"].agg(lambda v: np.bitwise_xor.reduce(v.to_numpy()))
    assert (per_root == 0).all() and len(per_root) == 50
    assert (table.groupby("root")["kind"].sum() == 1).all()  # one init per root


def test_storm_dict_acks_every_root():
    table = acker.generate(30, fanout=4)
    assert acker.bench_storm_dict(table, 30)["records_per_s"] > 0


@pytest.mark.bench  # a benchmark run end to end: make test-bench, beside the e2e smoke run
def test_benchmark_run_reports_exact_counts_and_all_keys(spark, broker, tmp_path):
    result = acker.run(
        spark,
        roots=60,
        per_root_roots=12,
        fanout=3,
        files=4,
        max_files_per_trigger=2,
        state_roots=200,
        workdir=str(tmp_path),
        bootstrap=broker.bootstrap,
        running_trigger_ms=500,
        running_rounds=1,
    )
    for key in (
        "ledger_records_per_s",
        "acker_query_records_per_s",
        "acker_query_roots_per_s",
        "spark_per_root_records_per_s",
        "storm_dict_records_per_s",
        "ratios",
        "state_bytes_per_pending_root",
        "acker_query_phase_seconds",
        "machine",
        "tree",
    ):
        assert key in result
    assert set(result["ratios"]) == {
        "acker_query_over_spark_per_root",
        "acker_query_over_storm_dict",
        "ledger_over_storm_dict",
    }
    assert result["records"]["main"] == 60 * 5 and result["records"]["per_root_form"] == 12 * 5
    assert result["acker_query_phase_seconds"]["ledger_step"] > 0
    kafka_runs = result["detail"]["acker_query_kafka"]["runs"]
    assert [set(r["driver_rows_per_batch"]) for r in kafka_runs] == [{2}, {2}]  # summaries
    running = result["detail"]["running_acker"]
    assert [r["batch_input_rows"] for r in running["kafka"]["runs"]] == [2]
    assert all(r["records_per_s"] > 0 for r in running["local"]["runs"])
    assert result["state_bytes_per_pending_root"]["fanout_100_each_more_root"] <= 40
    assert {"nproc", "cpu", "python", "pyspark"} <= set(result["machine"])
    assert not spark.streams.active


@pytest.mark.spark
def test_topology_benchmark_run_accounts_for_every_record(spark):
    import topology as bench_topology

    off = bench_topology.run(spark, False, 200)
    on = bench_topology.run(spark, True, 200)
    assert off["records"] == on["records"] == on["acked"] == 200
    assert on["p99_ms"] >= on["p50_ms"] >= 0
    assert off["batches"] >= 1 and on["batches"] >= 1 and on["batch_ms_median"] > 0


def test_outcomes_benchmark_applies_every_outcome_and_times_out_the_rest():
    """The per-root outcomes benchmark at a tiny size: every completion acks its root
    and the offsets left without one time out (the benchmark itself stops on a
    mismatch; checked here against the sizes asked for)."""
    import outcomes

    out = outcomes.main(
        ["--partitions", "3", "--records", "700", "--every", "7", "--repeats", "2", "--no-save"]
    )
    assert out["outcomes"] == 3 * 600
    assert [(r["acked"], r["timed_out"]) for r in out["runs"]] == [(1800, 300)] * 2
    assert out["outcomes_per_cpu_s"]["min"] <= out["outcomes_per_cpu_s"]["max"]


@pytest.mark.bench  # Spark's state store in a streaming query of its own: make test-bench
def test_held_store_benchmark_runs_every_candidate_on_the_same_changes(spark):
    """Each candidate holds the same rows batch after batch (each checks its count);
    the changelog, alone and in a window, writes less a batch than rewriting every
    held row does."""
    import held_store

    runs = held_store.run(
        spark, held=2_000, changes=100, batches=3, repeats=1, candidates=held_store.CANDIDATES
    )
    assert set(runs) == set(held_store.CANDIDATES)
    for candidate, (run,) in runs.items():
        assert len(run["batches"]) == 3, candidate
        assert all(b["bytes"] > 0 and b["batch_s"] > 0 for b in run["batches"]), candidate
    rewrite, changelog = runs["rewrite"][0]["batches"], runs["changelog"][0]["batches"]
    assert [b["base"] for b in rewrite] == [1, 2, 3] and changelog[0]["base"] == 0
    assert all(c["bytes"] < r["bytes"] / 2 for c, r in zip(changelog, rewrite))
    window = runs["window"][0]["batches"]
    assert all(w["bytes"] < r["bytes"] / 2 for w, r in zip(window, rewrite))
    partials = runs["partials"][0]["batches"]  # 100 rows over 1,000 keys: at most 100 touched
    assert all(p["bytes"] < r["bytes"] for p, r in zip(partials, rewrite))
    assert not spark.streams.active
