"""A batch's wait for a sink that does not answer, without Spark: the write tried
again once the probe answers, the lines said, the pause file read into the run state
and exposed as a metric."""

from __future__ import annotations

import json

import pytest

from ackstream.errors import Unreachable
from ackstream.topology import outage
from ackstream.topology.described import PAUSED_FILE, RUN_FILE, read_run
from ackstream.ui.metrics import exposition
from ackstream.ui.status import Status


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(outage, "FIRST_WAIT_S", 0.01)
    monkeypatch.setattr(outage, "MAX_WAIT_S", 0.04)


def test_a_write_that_found_its_sink_unreachable_is_tried_again_once_it_answers(quick, capsys):
    probes = iter([False, False, False, True, True])
    answers = []

    def probe():
        answers.append(next(probes))
        return answers[-1]

    attempts = []

    def write():
        attempts.append(len(answers))
        if len(attempts) < 3:  # the first write, and the one after the first answer
            raise Unreachable("S", "TimeoutException: no answer", probe)
        return "written"

    assert outage.written_through(write, "t", 7) == "written"
    assert attempts == [0, 4, 5]  # written again only after a probe answered
    said = [line for line in capsys.readouterr().err.splitlines() if "sink S" in line]
    assert len(said) == 2, said
    assert "sink S unreachable since " in said[0]
    assert ": TimeoutException: no answer; batch 7 waits (no record is charged)" in said[0]
    assert said[1].startswith("ackstream: topology t: sink S reachable again after ")


def test_an_error_that_is_not_an_outage_is_raised_as_it_is(quick):
    def write():
        raise ValueError("a row's fault")

    with pytest.raises(ValueError, match="a row's fault"):
        outage.written_through(write, "t", 1)


def run_state(folder, started_ms: int, state: str = "running") -> None:
    run = {"state": state, "started_ms": started_ms, "heard_ms": started_ms, "last_batch": None}
    (folder / RUN_FILE).write_text(json.dumps(run))


def test_the_run_state_says_paused_while_the_pause_file_is_this_run_s(tmp_path):
    run_state(tmp_path, started_ms=1_000)
    assert read_run(str(tmp_path))["paused"] is None
    said = {"sink": "KafkaSink to out", "since_ms": 5_000, "error": "timeout", "retry_s": 4.0}
    (tmp_path / PAUSED_FILE).write_text(json.dumps(said))
    assert read_run(str(tmp_path))["paused"] == said
    run_state(tmp_path, started_ms=9_000)  # restarted since: a killed process's file
    assert read_run(str(tmp_path))["paused"] is None
    run_state(tmp_path, started_ms=1_000, state="stopped")
    assert read_run(str(tmp_path))["paused"] is None


def test_the_paused_gauge_counts_the_seconds_paused(monkeypatch):
    monkeypatch.setattr("ackstream.ui.metrics.time.time", lambda: 100.0)

    def status(run):
        return Status("words", "", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, None, run=run)

    paused = {"state": "running", "paused": {"since_ms": 40_000}}
    lines = exposition([status(paused)]).splitlines()
    assert 'ackstream_paused_seconds{topology="words"} 60.0' in lines
    lines = exposition([status({"state": "running", "paused": None})]).splitlines()
    assert 'ackstream_paused_seconds{topology="words"} 0.0' in lines
    assert "ackstream_paused_seconds" not in exposition([status(None)])
