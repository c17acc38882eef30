"""notebooks/quickstart.ipynb runs top to bottom on small parameters and accounts for every record.

The notebook runs in a Jupyter kernel of this interpreter (a kernelspec written to a
temporary JUPYTER_PATH, so nothing needs installing), which starts its own
SparkSession in its own process.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

pytestmark = pytest.mark.notebook

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "quickstart.ipynb"
KERNEL = "ackstream-test-python"
PLOTS = (
    "accounted.png",
    "lag.png",
    "dead_letters.png",
    "latency.png",
    "pending.png",
    "per_bucket.png",
)


def small_parameters(plot_dir: Path) -> str:
    # 40 records, 20 a partition: offsets 5 and 15 of each are dead-lettered
    return "\n".join(
        [
            "RECORDS = 40",
            "PARTITIONS = 2",
            "MAX_PER_BATCH = None",
            "FAIL_PERCENT = 5",
            "POISON_EVERY = 10",
            "MAX_RETRIES = 1",
            "MESSAGE_TIMEOUT_MS = 5000",
            "TIMEOUT_S = 150",
            f"PLOT_DIR = {str(plot_dir)!r}",
            f"DIRECTORY = {str(plot_dir.parent / 'demo')!r}",
        ]
    )


@pytest.fixture
def kernel_name(tmp_path, monkeypatch):
    """A kernelspec running this interpreter, visible only to this test."""
    spec_dir = tmp_path / "jupyter" / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "ackstream test (this interpreter)",
                "language": "python",
            }
        )
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    return KERNEL


def test_committed_notebook_is_small_and_cleared():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "clear the outputs"
    assert "parameters" in code[0].metadata.get("tags", []), "first code cell: parameters"
    assert os.path.getsize(NOTEBOOK) < 50_000


@pytest.mark.spark
@pytest.mark.e2e
def test_quickstart_notebook_accounts_for_every_record(tmp_path, kernel_name):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1 and nb.cells.index(tagged[0]) == 1, "one parameters cell, first code"
    plot_dir = tmp_path / "plots"
    tagged[0].source = small_parameters(plot_dir)

    client = nbclient.NotebookClient(
        nb,
        kernel_name=kernel_name,
        timeout=240,
        startup_timeout=120,
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )
    client.execute()

    last = nb.cells[-1]
    text = "".join(o.get("text", "") for o in last.outputs if o.get("output_type") == "stream")
    figures = json.loads(text.strip().splitlines()[-1])
    assert figures["accounted_for"], figures
    assert (figures["records"], figures["committed"], figures["lost"], figures["both"]) == (
        40,
        40,
        0,
        0,
    ), figures
    assert figures["dead_lettered"] == 4, figures
    assert figures["replayed"] > 2 * figures["dead_lettered"], figures  # FAIL_PERCENT replays too
    assert figures["cold_batch_ms"] > 0, figures  # the first batch, marked apart
    for name in PLOTS:
        path = plot_dir / name
        assert path.is_file() and path.stat().st_size > 1000, f"{name} was not saved"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
