"""test_end_to_end's topology driven from a process of its own, through Spark Connect or on
a standalone cluster.

    python tests/remote_driver.py URL BOOTSTRAP INPUT_TOPIC OUTPUT_TOPIC TOPOLOGY CHECKPOINT
        [PER_BATCH [TIMEOUT_S]]

``URL`` is a Connect server's (``sc://...``) or a standalone Master's (``spark://...``).
A Connect client session, or a second SparkContext, and the tests' classic local
session do not mix in one process, so these tests run their driver here. The
topology and source are :func:`fault_driver.build`'s (``PER_BATCH`` records a batch,
40 by default); this process starts them, waits until the consumer group has
committed every input offset (or a query stopped, or ``TIMEOUT_S``, 150 by default,
passed), stops them and prints one JSON line:
``{"committed": {...}, "ends": {...}, "error": ..., "seconds": ...}``.
"""

from __future__ import annotations

import json
import sys
import time

from kafka import KafkaConsumer, TopicPartition

import ackstream
from ackstream.spark.session import is_connect

from fault_driver import build
from helpers import spark_kafka_conf
from spark_cluster import APPLICATION_CONF


def session(url: str, name: str):
    if url.startswith("sc://"):
        spark = ackstream.local_session(f"remote-{name}", remote=url)
        assert is_connect(spark), type(spark)
        return spark
    conf = {**APPLICATION_CONF, **spark_kafka_conf()}  # Spark's reader, when resolved
    return ackstream.local_session(f"remote-{name}", master=url, conf=conf)


def main(
    url: str,
    bootstrap: str,
    inbox: str,
    outbox: str,
    name: str,
    checkpoint: str,
    per_batch: str = "40",
    timeout_s: str = "150",
) -> None:
    started = time.monotonic()
    spark = session(url, name)
    stream, topology = build(
        spark, bootstrap, inbox, outbox, name, per_batch=int(per_batch), stage_counts=True
    )
    running = topology.start(stream, checkpoint, trigger_ms=300)
    group = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=f"ackstream-{name}", enable_auto_commit=False
    )
    parts = [TopicPartition(inbox, p) for p in sorted(group.partitions_for_topic(inbox))]
    ends = group.end_offsets(parts)
    committed, error = {}, None
    try:
        deadline = time.monotonic() + float(timeout_s)
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
    if not 7 <= len(sys.argv) <= 9:
        sys.exit(__doc__)
    main(*sys.argv[1:])
