"""A driver SIGKILLed in the middle of a tracked time window, between a sink write and
that batch's completions, loses nothing: the restarted driver finds the window's
partial aggregates and its hold tokens beside the checkpoint, every input offset ends
acked or dead-lettered (the poison alone), none is committed before its window was
written, and every word is written in some window's count."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid

import pytest
from fault_checks import DRIVER, CommitRecorder, all_committed, check_end_state, produce

from helpers import wait_for
from spark_cluster import spark_env

pytestmark = [pytest.mark.e2e, pytest.mark.broker, pytest.mark.timeout(1500)]
#: what Spark says when it cannot start a Python worker in time on a loaded machine:
#: a driver death the guarantee must survive anyway, so the driver is started again
SPARK_START_UP = "Python worker failed to connect back"


def spawn(bootstrap, inbox, outbox, name, checkpoint, log, **settings):
    settings = {"window": "2s", "per_batch": 20, **settings}
    return subprocess.Popen(
        [sys.executable, str(DRIVER), bootstrap, inbox, outbox, name, checkpoint],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**spark_env(), "ACKSTREAM_FAULT_SETTINGS": json.dumps(settings)},
    )


def test_a_driver_killed_mid_window_loses_nothing(broker, new_topic, tmp_path):
    from fault_checks import kill_group

    bootstrap = broker.bootstrap
    inbox, outbox = new_topic(partitions=2), new_topic(partitions=1)
    name = f"window-kill-{uuid.uuid4().hex[:8]}"
    lines = produce(bootstrap, inbox)
    recorder = CommitRecorder(bootstrap, f"ackstream-{name}", inbox)
    recorder.start()
    checkpoint = str(tmp_path / "checkpoint")
    driver = None
    with open(tmp_path / "driver.log", "ab") as log:
        try:
            driver = spawn(bootstrap, inbox, outbox, name, checkpoint, log, kill_after_sink=3)
            driver.wait(600)
            assert driver.returncode == -signal.SIGKILL, f"see {tmp_path / 'driver.log'}"
            assert not all_committed(recorder), "the kill came after the last window"
            driver = spawn(bootstrap, inbox, outbox, name, checkpoint, log)
            starts = 1

            def alive() -> bool:  # restarted when Spark could not start a Python worker
                nonlocal driver, starts
                if driver.poll() is None:
                    return True
                said = (tmp_path / "driver.log").read_text(errors="replace")
                if SPARK_START_UP not in said.split("killing itself")[-1] or starts >= 3:
                    pytest.fail(f"the restarted driver died: see {tmp_path / 'driver.log'}")
                driver, starts = spawn(bootstrap, inbox, outbox, name, checkpoint, log), starts + 1
                return True

            wait_for(
                lambda: alive() and all_committed(recorder),
                timeout=900,
                interval=0.5,
                what=f"every offset committed after the restart (log {tmp_path / 'driver.log'})",
            )
        finally:
            if driver is not None and driver.poll() is None:
                kill_group(driver)
            recorder.stop()
    figures = check_end_state(bootstrap, name, outbox, lines, recorder)
    held = tmp_path / "checkpoint" / "topology" / "ackstream-held" / "_tokens"
    assert held.is_dir(), "the window held no token: it did not hold by token"
    print(f"\nwindow driver kill: {figures}")
