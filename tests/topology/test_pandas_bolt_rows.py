"""A pandas bolt's chunk with failed rows, in pandas alone (no Spark)."""

import warnings

import numpy as np
import pandas as pd
import pyarrow as pa

# the function an executor runs on each chunk, tested alone: warnings there reach no test
from ackstream.topology.pandas_bolt import BoltOutput, _run_bolt  # noqa: PLC2701


def test_failed_rows_beside_output_rows_raise_no_future_warning_and_keep_the_values():
    """pandas warns (FutureWarning) when a concat's result type comes from leaving out
    all-null columns: the failed rows' payload is null beside a float column here."""
    output = BoltOutput(("word", "score"), (("word", pa.string()), ("score", pa.float64())))
    chunk = pd.DataFrame({"value": ["a", "bad", "c"], "_root": [1, 2, 3], "_edge": [4, 5, 6]})

    def bolt(frame):
        if (frame.value == "bad").any():
            raise ValueError("bad row")
        return pd.DataFrame({"word": frame.value, "score": 1.5}, index=frame.index)

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        out = _run_bolt(bolt, chunk, ["value"], "scored", output)
    kept = out[out["_error"].isna()]
    assert kept["word"].tolist() == ["a", "c"] and kept["score"].tolist() == [1.5, 1.5]
    failed = out[out["_error"].notna()]
    assert failed["_root"].tolist() == [2] and failed["_error"].iloc[0].startswith("scored: ")
    assert pa.Array.from_pandas(out["score"], type=pa.float64()).null_count == 1
    assert np.array_equal(out["_root"].to_numpy(dtype=np.int64), [1, 3, 2])


def test_an_error_every_row_meets_fails_the_chunk_in_a_few_hundred_calls():
    """A bolt whose service is down raises on every chunk: its 10,000 rows all fail with
    the error after three levels of eight parts (585 calls), not one call per row."""
    output = BoltOutput(("word",), (("word", pa.string()),))
    n = 10_000
    chunk = pd.DataFrame({"value": ["w"] * n, "_root": np.arange(n), "_edge": np.arange(n)})
    calls = []

    def bolt(frame):
        calls.append(len(frame))
        raise ConnectionError("service down")

    out = _run_bolt(bolt, chunk, ["value"], "call", output)
    assert out["_error"].notna().all() and len(out) == n
    assert sorted(out["_root"].tolist()) == list(range(n))
    assert set(out["_error"]) == {"call: ConnectionError: service down"}
    assert len(calls) == 1 + 8 + 64 + 512


def test_rows_at_fault_here_and_there_are_still_found_one_by_one():
    """One row in a hundred raises: exactly those rows fail; every other row's output is
    kept (some part stays whole at one of the levels, so isolation goes on)."""
    output = BoltOutput(("word",), (("word", pa.string()),))
    n = 10_000
    values = ["bad" if i % 100 == 37 else f"w{i}" for i in range(n)]
    chunk = pd.DataFrame({"value": values, "_root": np.arange(n), "_edge": np.arange(n)})

    def bolt(frame):
        if (frame.value == "bad").any():
            raise ValueError("bad row")
        return pd.DataFrame({"word": frame.value}, index=frame.index)

    out = _run_bolt(bolt, chunk, ["value"], "scored", output)
    failed = out[out["_error"].notna()]
    assert sorted(failed["_root"].tolist()) == [i for i in range(n) if i % 100 == 37]
    assert sorted(out[out["_error"].isna()]["word"]) == sorted(v for v in values if v != "bad")


def test_children_found_over_many_calls_keep_their_parents_lineage_and_numbering():
    """Rows isolated over many calls of the bolt: each row's children carry its root and
    edge and are numbered from 0 (their edge ids hash the number); the unanchored rows
    of each call are numbered apart."""
    output = BoltOutput(("word",), (("word", pa.string()),))
    n, bad = 64, {5, 40}
    chunk = pd.DataFrame(
        {
            "value": [f"w{i}" for i in range(n)],
            "_root": np.arange(n) + 100,
            "_edge": np.arange(n) + 1000,
        }
    )

    def bolt(frame):
        if frame.value.isin([f"w{i}" for i in bad]).any():
            raise ValueError("bad row")
        index = np.repeat(frame.index.to_numpy(), 2)
        twice = pd.DataFrame({"word": np.repeat(frame.value.to_numpy(), 2)}, index=index)
        return pd.concat([twice, pd.DataFrame({"word": ["x", "y"]}, index=[-1, -1])])

    out = _run_bolt(bolt, chunk, ["value"], "s", output)
    kept = out[out["_error"].isna()]
    anchored = kept[kept["_root"].notna()]
    assert sorted(anchored["_root"].unique()) == [i + 100 for i in range(n) if i not in bad]
    for root, rows in anchored.groupby("_root"):
        assert rows["_ordinal"].tolist() == [0, 1]
        assert rows["word"].tolist() == [f"w{root - 100}"] * 2
        assert rows["_edge"].tolist() == [root + 900] * 2
    loose = kept[kept["_root"].isna()]
    calls = len(loose) // 2
    assert calls > 2 and loose["_ordinal"].tolist() == [0, 1] * calls
    assert sorted(out[out["_error"].notna()]["_root"]) == [105, 140]


def test_beside_failed_rows_each_calls_values_are_kept_as_it_made_them():
    """One call's column of int64 ids and another's of floats (a missing value) are not
    made one float column beside failed rows: an id past 2**53 would lose its last
    digits."""
    output = BoltOutput(("n",), (("n", pa.int64()),))
    big = 2**62 + 1
    chunk = pd.DataFrame({"value": ["big", "bad", "none"], "_root": [1, 2, 3], "_edge": [4, 5, 6]})

    def bolt(frame):
        if (frame.value == "bad").any():
            raise ValueError("bad row")
        if (frame.value == "big").all():
            return pd.DataFrame({"n": np.array([big], np.int64)}, index=frame.index)
        return pd.DataFrame({"n": np.full(len(frame), np.nan)}, index=frame.index)

    out = _run_bolt(bolt, chunk, ["value"], "ids", output)
    assert out.loc[out["_root"] == 1, "n"].tolist() == [big]
    assert out.loc[out["_root"] == 2, "_error"].iloc[0].startswith("ids: ")


def test_rows_the_collector_fails_or_rejects_are_marked_in_one_call_their_outputs_dropped():
    """``collector.fail`` and ``collector.reject`` take a mask or positions: those rows
    come back failed or rejected with the stage and reason, their outputs left out, and
    the bolt is called once (no isolation)."""
    output = BoltOutput(("word",), (("word", pa.string()),))
    n = 1_000
    values = ["bad" if i % 100 == 7 else "gone" if i == 500 else f"w{i}" for i in range(n)]
    chunk = pd.DataFrame({"value": values, "_root": np.arange(n), "_edge": np.arange(n)})
    calls = []

    def bolt(frame, collector):
        calls.append(len(frame))
        collector.fail(frame["value"] == "bad", "bad value")
        collector.reject(frame.index[frame["value"] == "gone"], "never decodes")
        collector.reject(np.array([], np.int64), "nothing")
        return pd.DataFrame({"word": frame.value}, index=frame.index)

    out = _run_bolt(bolt, chunk, ["value"], "check", output, collector=True)
    assert calls == [n]
    failed = out[out["_error"].notna() & ~out["_rejected"].astype(bool)]
    assert sorted(failed["_root"]) == [i for i in range(n) if i % 100 == 7]
    assert set(failed["_error"]) == {"check: bad value"}
    rejected = out[out["_rejected"].astype(bool)]
    assert rejected["_root"].tolist() == [500]
    assert rejected["_error"].tolist() == ["check: never decodes"]
    kept = out[out["_error"].isna()]
    assert sorted(kept["word"]) == sorted(v for v in values if v not in ("bad", "gone"))


def test_collector_rows_that_name_no_row_of_the_chunk_fail_the_call_saying_so():
    """A position past the chunk is the bolt's own error: its rows fail with it."""
    output = BoltOutput(("word",), (("word", pa.string()),))
    chunk = pd.DataFrame({"value": ["a", "b"], "_root": [1, 2], "_edge": [3, 4]})

    def bolt(frame, collector):
        collector.fail([len(frame)], "off the end")
        return frame[["value"]].rename(columns={"value": "word"})

    out = _run_bolt(bolt, chunk, ["value"], "s", output, collector=True)
    assert out["_error"].notna().all()
    assert out["_error"].iloc[0].startswith("s: ValueError: collector rows must be a boolean")
