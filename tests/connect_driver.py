"""test_end_to_end's topology from a Spark Connect client, in a process of its own.

    python tests/connect_driver.py SC_URL BOOTSTRAP INPUT_TOPIC OUTPUT_TOPIC TOPOLOGY CHECKPOINT

A Connect client session and the tests' classic local session do not mix in one
process, so the Connect test runs its client here. The topology and source are
:func:`fault_driver.build`'s; this process starts them through Spark Connect, waits
until the consumer group has committed every input offset (or a query stopped), stops
them and prints one JSON line: ``{"committed": {...}, "error": ..., "seconds": ...}``.
"""

from __future__ import annotations

import json
import sys
import time

from kafka import KafkaConsumer, TopicPartition

import ackstream
from ackstream.session import is_connect

from fault_driver import build

#: How long the client waits for every offset to be committed.
TIMEOUT_S = 150


def main(url: str, bootstrap: str, inbox: str, outbox: str, name: str, checkpoint: str) -> None:
    started = time.monotonic()
    spark = ackstream.local_session(f"connect-{name}", remote=url)
    assert is_connect(spark), type(spark)
    stream, topology = build(spark, bootstrap, inbox, outbox, name, per_batch=40)
    running = topology.start(stream, checkpoint, trigger_ms=300)
    group = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=f"ackstream-{name}", enable_auto_commit=False
    )
    parts = [TopicPartition(inbox, p) for p in sorted(group.partitions_for_topic(inbox))]
    ends = group.end_offsets(parts)
    committed, error = {}, None
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            committed = {str(tp.partition): group.committed(tp) for tp in parts}
            if all(committed[str(tp.partition)] == ends[tp] for tp in parts):
                break
            if not running.is_active():
                error = str(running.exception())
                break
            time.sleep(0.5)
    finally:
        running.stop()
        group.close(autocommit=False)
        spark.stop()
    result = {
        "committed": committed,
        "ends": {str(tp.partition): end for tp, end in ends.items()},
        "error": error,
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 7:
        sys.exit(__doc__)
    main(*sys.argv[1:])
