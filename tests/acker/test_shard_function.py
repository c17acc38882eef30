"""The acker's per-shard function on its own: a hand-made group state, no query."""

import pandas as pd

from ackstream.acker.query import shard_function
from ackstream.records import ALIVE, INIT, RESET


class FakeState:
    """Spark's GroupState as the shard function uses it, with a clock moved by hand."""

    def __init__(self, now_ms):
        self.now_ms, self.value, self.timed_out = now_ms, None, False

    exists = property(lambda self: self.value is not None)
    get = property(lambda self: self.value)
    hasTimedOut = property(lambda self: self.timed_out)

    def getCurrentProcessingTimeMs(self):
        return self.now_ms

    def update(self, value):
        self.value = value

    def remove(self):
        self.value = None

    def setTimeoutDuration(self, ms):
        pass


def records(*rows):
    """Ack records as the acker's ``checked`` stage hands them to a shard."""
    base = dict(topic="t", partition=0, offset=0, attempt=0, ts=0, reason=None)
    frame = pd.DataFrame([{**base, **row} for row in rows])
    return frame.assign(_invalid=None, _no_root=False)


def run(function, state, frame):
    return pd.concat(list(function(0, iter([frame]), state)) or [pd.DataFrame()])


def test_a_reset_of_a_held_root_is_reported_alive_and_extends_its_deadline():
    function = shard_function(message_timeout_ms=10_000)
    state = FakeState(1_000)
    run(function, state, records({"root": 7, "value": 5, "kind": INIT, "ts": 1_000}))
    state.now_ms = 9_000
    out = run(function, state, records({"root": 7, "value": 0, "kind": RESET, "ts": 9_000}))
    assert out[["root", "status"]].to_dict("records") == [{"root": 7, "status": ALIVE}]
    state.now_ms, state.timed_out = 15_000, True  # past the first deadline, not the reset's
    assert len(run(function, state, records({"root": 7, "value": 0, "kind": 0}).iloc[:0])) == 0
    state.now_ms, state.timed_out = 19_500, False
    done = run(function, state, records({"root": 7, "value": 5, "kind": 0}))
    assert done[["root", "status"]].to_dict("records") == [{"root": 7, "status": "acked"}]


def test_a_reset_that_comes_with_the_last_ack_reports_the_outcome_only():
    function = shard_function(message_timeout_ms=10_000)
    out = run(
        function,
        FakeState(1_000),
        records(
            {"root": 9, "value": 5, "kind": INIT, "ts": 1_000},
            {"root": 9, "value": 5, "kind": RESET, "ts": 1_000},
        ),
    )
    assert out[["root", "status"]].to_dict("records") == [{"root": 9, "status": "acked"}]
