"""Per-batch state files (``ackstream.storage.files.BatchFiles``), which the acker's pending
table and the window stages' held tuples are kept in."""

import pickle

import pyarrow as pa
import pytest

from ackstream.errors import OptionError
from ackstream.storage.files import BatchFiles


def test_a_batch_starts_from_the_newest_earlier_table_and_two_are_kept(tmp_path):
    files = BatchFiles(str(tmp_path / "state"))
    assert files.newest_before(0) is None
    for batch in (3, 5, 8):
        files.write(batch, pa.table({"batch": [batch]}))
    assert sorted(files.batch_ids()) == [5, 8]
    assert files.newest_before(8) == 5  # batch 8 run again starts from 5's table
    assert files.read(files.newest_before(9)).column("batch").to_pylist() == [8]
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["5", "8"]  # no hidden left


def test_it_travels_pickled_and_reads_from_a_url(tmp_path):
    BatchFiles(str(tmp_path)).write(1, pa.table({"x": [1]}))
    travelled = pickle.loads(pickle.dumps(BatchFiles(tmp_path.as_uri())))
    assert travelled.read(1).column("x").to_pylist() == [1]


def test_a_url_pyarrow_cannot_write_to_names_the_checkpoint():
    with pytest.raises(OptionError, match="checkpoint"):
        BatchFiles("nosuchscheme://bucket/ckpt").batch_ids()
