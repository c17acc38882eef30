"""The failure-path benchmark (benchmarks/failure_path.py) runs in the session's Spark
and broker at 20,000 records a batch, the size the benchmarks use, but for two timed
batches: failures scattered through a batch of that size and a batch failing whole,
on the Kafka channel with Spark's connector. Every case does the same work as its
input (the harness checks the output's word counts, and that the spout acked every
record and failed exactly the chosen ones, once each) and the JSON carries every
figure and ratio. No figure is checked against a bound (the machine is shared); only
that every path works."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import failure_path

BATCH = 20_000
FRACTIONS = (0.0, 0.01, 1.0)


@pytest.mark.bench  # a benchmark run end to end: make test-bench
def test_every_case_settles_every_record_and_the_json_has_every_figure(spark, broker, tmp_path):
    path = tmp_path / "failure-path.json"
    out = failure_path.main(
        [
            "--batch-sizes",
            str(BATCH),
            "--batches",
            "2",
            "--warmup-batches",
            "1",
            "--repeats",
            "1",
            "--fractions",
            ",".join(str(f) for f in FRACTIONS[1:]),
            "--no-warmup-round",
            "--timeout-s",
            "900",  # a loaded machine: only a stuck run should reach it
            "--bootstrap",
            broker.bootstrap,
            "--output",
            str(path),
        ],
        spark=spark,
    )
    assert path.read_text().strip()
    assert {"cores_usable", "loadavg", "pyspark", "spark_kafka_connector"} <= set(out["machine"])
    cases = out["sizes"][BATCH]["cases"]
    assert set(cases) == set(failure_path.VARIANTS)
    for variant, by_fraction in cases.items():
        assert list(by_fraction) == list(FRACTIONS), variant
        for fraction, figures in by_fraction.items():
            assert figures["errors"] == [] and figures["complete"], (variant, fraction)
            (run,) = figures["runs"]
            # at least the timed batches' worth: replays take room, so it may run over
            assert run["new"] >= 2 * BATCH and run["s_per_batch"] > 0, (variant, fraction)
            assert run["counts"]["dead_lettered"] == 0, (variant, fraction)
            # a batch may run shorter than the backoff (500 ms), so a failed record's
            # replay may come after the two-batch window: at 100 % nothing need settle in
            # it; replays are looked for over the whole run
            assert run["settled_per_s"] > 0 or fraction == 1.0, (variant, fraction)
            replays = sum(b["replays"] for b in run["batch_log"])
            assert (replays > 0) == (fraction > 0), (variant, fraction)
            # 4 batches (warm-up, 2 timed, the window's end) over 2 partitions
            failing = failure_path.failing_offsets({0: 2 * BATCH, 1: 2 * BATCH}, fraction)
            assert run["counts"]["failed"] == failing, (variant, fraction)
    targets = {(variant, fraction) for variant, fraction, *_ in failure_path.TARGETS}
    judged = {(r["variant"], r["fraction"]): r for r in out["ratios"]}
    assert set(judged) == {(v, f) for v in failure_path.VARIANTS for f in FRACTIONS[1:]}
    for case, r in judged.items():
        assert r["mean"] > 0 and len(r["pairs"]) == 1
        assert (r["target"] is not None) == (case in targets)


def test_a_run_whose_counts_miss_a_failure_or_an_ack_fails():
    inp = type("Input", (), {"ends": {0: 20_000}, "records": 20_000})()
    failing = failure_path.failing_offsets(inp.ends, 0.01)
    assert failing == 200  # exactly 1 % of each 10,000 offsets
    right = {"acked": 20_000, "failed": failing, "replayed": failing}
    right.update(dead_lettered=0, timed_out=0, rejected=0)
    failure_path.check_counts("t", right, inp, 0.01)
    for wrong in ({"failed": failing + 1}, {"acked": 19_999}, {"timed_out": 3}):
        with pytest.raises(RuntimeError, match="the spout's counts"):
            failure_path.check_counts("t", {**right, **wrong}, inp, 0.01)


def test_the_window_runs_from_the_first_timed_batch_to_the_start_of_the_one_after():
    rows = [(0, 10, 0, 0), (1, 10, 0, 10), (3, 5, 5, 15), (4, 10, 0, 30), (6, 10, 0, 40)]
    batches = [
        {"start_s": t, "new": n, "replays": r, "settled": s, "ms": 1000 * t} for t, n, r, s in rows
    ]
    w = failure_path.window(batches, 10, 1, 2)  # batches 1 to 3: 25 new records in 5 s
    assert (w["new"], w["replays"], w["batches"], w["seconds"]) == (25, 5, 3, 5)
    assert (w["s_per_batch"], w["settled_per_s"], w["longest_batch_s"]) == (2.0, 6.0, 4.0)
    assert failure_path.window(batches, 10, 1, 4) is None  # no batch started after them


def test_a_run_stopped_short_is_figured_up_to_its_cut_and_paired_as_such():
    batches = [
        {"start_s": t, "new": n, "replays": 0, "settled": s, "ms": 2000}
        for t, n, s in [(0, 10, 0), (5, 10, 0), (7, 5, 10), (9, 10, 15)]
    ]
    # from batch 1's start to the cut, 5 s into a batch that never reported: 25 new in 9 s
    cut = failure_path.partial(batches, 10, cut_s=14, settled=18)
    assert (cut["seconds"], cut["new"], cut["s_per_batch"]) == (9, 25, 3.6)
    assert cut["settled_per_s"] == 2.0 and cut["longest_batch_s"] == 2.0
    assert failure_path.partial(batches[:1], 10, cut_s=14, settled=0) is None  # start-up only
    clean = [{"s_per_batch": 1.2, "complete": True}]
    short = [{**cut, "complete": False, "error": "cut at --timeout-s 1"}]
    assert not failure_path.summarize(short)["complete"]
    (ratio,) = failure_path.ratios({"fail_where": {0.0: clean, 1.0: short}}, 10)
    assert ratio["pairs"] == [3.0] and ratio["met"] is False  # fail_where's bound: 2.5
    slower_clean = [{"s_per_batch": 1.5, "complete": True}]
    (ratio,) = failure_path.ratios({"fail_where": {0.0: slower_clean, 1.0: short}}, 10)
    assert ratio["pairs"] == [2.4] and ratio["met"] is True
