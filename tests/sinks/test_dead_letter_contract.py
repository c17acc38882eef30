"""The DeadLetterWriter contract: one suite that every dead-letter writer passes."""

import os

import pyarrow.parquet as pq
import pytest

from ackstream.sinks.dead_letters import (
    DEAD_LETTER_SCHEMA,
    DeadLetterWriter,
    KafkaDeadLetters,
    ParquetDeadLetters,
    read_dead_letters,
)
from ackstream.vocabulary.clock import now_ms
from ackstream.vocabulary.dead_letter import DeadLetter


@pytest.fixture(params=["parquet", pytest.param("kafka", marks=pytest.mark.broker)])
def writer_and_reader(request, tmp_path):
    """``(writer, read)``: ``read()`` gives every letter the writer made durable."""
    if request.param == "parquet":
        folder = str(tmp_path / "dead")
        writer: DeadLetterWriter = ParquetDeadLetters(folder, "topo")
        yield writer, lambda: read_dead_letters(folder)
    else:
        broker = request.getfixturevalue("broker")
        topic = request.getfixturevalue("new_topic")()
        writer = KafkaDeadLetters(broker.bootstrap, topic, "topo")
        yield writer, lambda: read_dead_letters(bootstrap=broker.bootstrap, topic=topic)
    writer.close()


def by_offset(table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda row: row["offset"])


def test_every_letter_reads_back_with_its_record_and_why(writer_and_reader):
    writer, read = writer_and_reader
    before = now_ms()
    records = {
        (("in", 0), 3): (b"k3", b"v3", 1_700_000_000_003),
        (("in", 1), 4): (b"k4", b"v4", 1_700_000_000_004, [("trace", b"t4")]),
    }
    writer.write(
        [
            DeadLetter("in", 0, 3, 3, "failed: parse#1: ValueError: x"),
            DeadLetter("in", 1, 4, 1, "rejected: not a number"),
        ],
        records,
    )
    after = now_ms()
    got = read()
    assert got.schema == DEAD_LETTER_SCHEMA
    rows = by_offset(got)
    # the letter's own time, when it was written: the record's time of death
    assert all(before <= row.pop("written_ms") <= after for row in rows)
    assert rows == [
        {
            "topology": "topo",
            "topic": "in",
            "partition": 0,
            "offset": 3,
            "attempts": 3,
            "reason": "failed: parse#1: ValueError: x",
            "key": b"k3",
            "value": b"v3",
            "timestamp_ms": 1_700_000_000_003,
            "headers": None,
        },
        {
            "topology": "topo",
            "topic": "in",
            "partition": 1,
            "offset": 4,
            "attempts": 1,
            "reason": "rejected: not a number",
            "key": b"k4",
            "value": b"v4",
            "timestamp_ms": 1_700_000_000_004,
            "headers": [{"key": "trace", "value": b"t4"}],
        },
    ]


def test_a_letter_whose_record_was_not_fetched_is_written_without_it(writer_and_reader):
    writer, read = writer_and_reader
    writer.write([DeadLetter("in", 2, 9, 6, "timed_out")], {})
    (row,) = read().to_pylist()
    assert (row["topic"], row["partition"], row["offset"], row["attempts"]) == ("in", 2, 9, 6)
    assert row["reason"] == "timed_out" and row["key"] is None and row["timestamp_ms"] is None
    assert not row["value"]  # Kafka takes no message without key and value: b"" there


def test_no_letters_writes_nothing(writer_and_reader):
    writer, read = writer_and_reader
    writer.write([], {})
    assert read().num_rows == 0
    writer.write([DeadLetter("in", 0, 1, 1, "failed")], {})
    assert read().num_rows == 1


def test_letters_written_before_they_kept_their_time_still_read(tmp_path):
    folder = tmp_path / "dead"
    ParquetDeadLetters(str(folder), "topo").write([DeadLetter("in", 0, 1, 2, "failed")], {})
    (name,) = os.listdir(folder)
    old = pq.read_table(folder / name).drop_columns(["written_ms"])  # as an older writer had it
    pq.write_table(old, folder / name)
    (row,) = read_dead_letters(str(folder)).to_pylist()
    assert (row["offset"], row["attempts"], row["written_ms"]) == (1, 2, None)
