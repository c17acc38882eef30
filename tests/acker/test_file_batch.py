"""A local channel's micro-batch read from the files Spark's file source logged for it."""

import json

import pyarrow as pa
import pyarrow.parquet as pq

from ackstream.acker.file_batch import batch_records
from ackstream.vocabulary.records import ACK_RECORD_SCHEMA


def write_log(checkpoint, batch_offsets, source_logs):
    """Spark's layout: offsets/<batch> ends with {"logOffset": n}; sources/0/<name> lists
    each logged file after a version line."""
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "sources" / "0").mkdir(parents=True)
    for batch_id, n in batch_offsets.items():
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1}
        text = f"v1\n{json.dumps(meta)}\n{json.dumps({'logOffset': n})}"
        (checkpoint / "offsets" / str(batch_id)).write_text(text)
    for name, entries in source_logs.items():
        lines = ["v1"] + [json.dumps({"path": f"file://{p}", "batchId": b}) for p, b in entries]
        (checkpoint / "sources" / "0" / name).write_text("\n".join(lines))


def ack_file(path, roots):
    pq.write_table(pa.table({"root": roots, "value": [1] * len(roots)}), path)
    return str(path)


def test_a_batch_reads_the_files_logged_since_the_previous_batch(tmp_path):
    files = {n: ack_file(tmp_path / f"{n}.parquet", [n, n + 100]) for n in range(12)}
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    junk = str(tmp_path / "junk.parquet")
    write_log(
        tmp_path / "ckpt",
        {0: 3, 1: 9, 2: 11},
        {  # logs 0..9 compacted into 9.compact (their own files deleted), then 10 and 11
            "9.compact": [(files[n], n) for n in range(10)],
            "10": [(files[10], 10), (junk, 10)],
            "11": [(files[11], 11)],
        },
    )
    roots = [batch_records(str(tmp_path / "ckpt"), b).column("root").to_pylist() for b in (0, 1, 2)]
    assert roots[0] == [0, 100, 1, 101, 2, 102, 3, 103]
    assert roots[1] == [n + k for n in range(4, 10) for k in (0, 100)]
    assert roots[2] == [10, 110, 11, 111]  # the unreadable file is skipped
    table = batch_records(str(tmp_path / "ckpt"), 2)
    assert table.schema == ACK_RECORD_SCHEMA and table.column("kind").null_count == 4


def test_no_answer_when_the_files_cannot_be_told(tmp_path):
    write_log(tmp_path, {0: 0}, {})
    assert batch_records(str(tmp_path), 0) is None  # log 0 is not there
    assert batch_records(str(tmp_path), 1) is None  # nor is the batch
    assert batch_records("hdfs://host/ckpt", 0) is None
