"""The contract of a replay log (``ackstream.sinks.replay_log``): every implementation
keeps each letter's latest replay time, and starts empty."""

import pytest

from ackstream.sinks.replay_log import FileReplayLog, ReplayLog, TopicReplayLog, letter_name


@pytest.fixture(params=["file", pytest.param("topic", marks=pytest.mark.broker)])
def log(request, tmp_path):
    if request.param == "file":
        return FileReplayLog(str(tmp_path))
    broker, new_topic = request.getfixturevalue("broker"), request.getfixturevalue("new_topic")
    return TopicReplayLog(broker.bootstrap, new_topic())  # its .replayed topic is made on use


def test_a_log_starts_empty_and_keeps_each_letters_latest_replay(log):
    assert isinstance(log, ReplayLog)
    assert log.replayed() == {}
    log.mark(["orders:0:3", "orders:1:8"], 1_000)
    assert log.replayed() == {"orders:0:3": 1_000, "orders:1:8": 1_000}
    log.mark(["orders:0:3"], 2_000)
    assert log.replayed() == {"orders:0:3": 2_000, "orders:1:8": 1_000}


def test_a_torn_line_in_the_file_is_skipped_not_fatal(tmp_path):
    log = FileReplayLog(str(tmp_path))
    log.mark(["a:0:1"], 5)
    with open(log.path, "a") as f:
        f.write('{"letter": "b:0:2", "at')  # a crash in the middle of a write
    assert log.replayed() == {"a:0:1": 5}


def test_a_letter_is_named_by_its_records_coordinates():
    assert letter_name({"topic": "orders", "partition": 2, "offset": 41, "attempts": 3}) == (
        "orders:2:41"
    )
