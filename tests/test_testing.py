"""ackstream.testing's wait for a settled topology, on a started topology's stand-in: the
figures come from the progress Spark reports, as the source writes them there."""

import json

import pytest

from ackstream.testing import wait_until_settled


class Query:
    def __init__(self, progress):
        self.progress = list(progress)

    @property
    def lastProgress(self):  # noqa: N802 - Spark's name
        return self.progress.pop(0) if len(self.progress) > 1 else self.progress[0]

    def awaitTermination(self, timeout):  # noqa: N802 - Spark's name
        return False


class Running:
    def __init__(self, progress, error=None):
        self.query, self.error = Query(progress), error

    def exception(self):
        return self.error


def progress(pending=0, waiting=0, acked=0, dead=0, **lags):
    figures = {
        "acked": acked,
        "dead_lettered": dead,
        "pending": pending,
        "waiting": waiting,
        "partitions": {
            "t": {p[1:]: {"end": 10, "committed": 10 - n, "lag": n} for p, n in lags.items()}
        },
    }
    return {"sources": [{"latestOffset": json.dumps(figures)}]}


def test_it_waits_for_no_pending_root_no_waiting_replay_and_no_lag():
    running = Running(
        [
            None,  # no batch yet
            progress(pending=3, acked=7, p0=3),
            progress(waiting=1, acked=9, p0=1),
            progress(acked=9, dead=1, p0=0),
        ]
    )
    figures = wait_until_settled(running, records=10, timeout_s=5)
    assert (figures["acked"], figures["dead_lettered"]) == (9, 1)


def test_a_count_of_records_not_reached_yet_is_not_settled():
    running = Running([progress(acked=4, p0=0)])
    with pytest.raises(TimeoutError, match="not settled within 0.3 s"):
        wait_until_settled(running, records=10, timeout_s=0.3)


def test_a_stopped_query_raises_its_error():
    running = Running([progress(pending=1, p0=1)], error=RuntimeError("stage 'm' failed"))
    with pytest.raises(RuntimeError, match="stage 'm' failed"):
        wait_until_settled(running, timeout_s=5)
