"""A pandas bolt's chunk with failed rows, in pandas alone (no Spark)."""

import warnings

import numpy as np
import pandas as pd
import pyarrow as pa

# the function an executor runs on each chunk, tested alone: warnings there reach no test
from ackstream.topology.bolts import BoltOutput, _run_bolt  # noqa: PLC2701


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
