"""stop_queries against stand-in queries: when each is stopped, in which order, and when
its batch's jobs are cancelled first."""

from ackstream.topology import running
from ackstream.topology.running import stop_queries

PROCESSING = {"message": "Processing new data", "isDataAvailable": True, "isTriggerActive": True}
GETTING_OFFSETS = {
    "message": "Getting offsets from PythonMicroBatchStream",
    "isDataAvailable": False,
    "isTriggerActive": True,
}
WAITING = {
    "message": "Waiting for next trigger",
    "isDataAvailable": False,
    "isTriggerActive": False,
}


class Query:
    """A streaming query whose status goes through ``statuses`` a read at a time (the last
    one stays); it notes in ``events`` what it was doing when stopped."""

    def __init__(self, name: str, statuses: list[dict], events: list):
        self.name, self.statuses, self.events = name, list(statuses), events
        self.isActive = True
        self.now = self.statuses[0]

    @property
    def status(self) -> dict:
        self.now = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return self.now

    def stop(self) -> None:
        self.events.append(("stop", self.name, self.now["message"]))
        self.isActive = False


def test_a_query_is_stopped_once_its_batch_is_committed_and_before_its_acker():
    """Back-to-back batches never leave the trigger: the stop comes as the next batch
    gets its offsets, not at a gap between triggers, and cancels nothing (least of all
    the next batch, processing by the time its status is read again)."""
    events: list = []
    acker = Query("words.acker", [WAITING], events)
    topology = Query("words", [PROCESSING] * 5 + [GETTING_OFFSETS, PROCESSING], events)
    stop_queries([acker, topology], batch_wait_s=600, cancel=lambda: events.append(("cancel",)))
    assert events == [
        ("stop", "words", GETTING_OFFSETS["message"]),
        ("stop", "words.acker", WAITING["message"]),
    ]


def test_a_batch_that_ends_once_cancelled_is_cancelled_once_then_stopped():
    events: list = []
    stuck = Query("stuck", [PROCESSING], events)

    def cancel() -> None:
        events.append(("cancel",))
        stuck.statuses = [WAITING]  # the batch's jobs end: the batch fails and ends

    stop_queries([stuck], batch_wait_s=0.1, cancel=cancel)
    assert events == [("cancel",), ("stop", "stuck", WAITING["message"])]


def test_a_batch_that_goes_on_is_cancelled_again_before_the_stop(monkeypatch):
    """A batch may start another job after its first is cancelled (to report its
    failure, or a stage's next action): it is cancelled again while it runs, for a
    bounded time, and the query is stopped all the same."""
    monkeypatch.setattr(running, "CANCEL_S", 0.6)
    events: list = []
    stuck = Query("stuck", [PROCESSING], events)
    stop_queries([stuck], batch_wait_s=0.1, cancel=lambda: events.append(("cancel",)))
    assert events[-1] == ("stop", "stuck", PROCESSING["message"])
    assert len(events) >= 3 and set(events[:-1]) == {("cancel",)}, events


class Unstoppable(Query):
    def stop(self) -> None:
        raise RuntimeError("the query's JVM is gone")


def test_a_query_that_cannot_be_stopped_does_not_keep_the_others_running():
    events: list = []
    stop_queries([Unstoppable("gone", [WAITING], events), Query("gone.acker", [WAITING], events)])
    assert events == [("stop", "gone.acker", WAITING["message"])]
