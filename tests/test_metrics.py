"""The source's metrics reach Spark users in ``StreamingQueryProgress`` on a real query."""

import pytest
from pyspark.sql import functions as F

from ackstream import LocalChannel, MemorySink, Topology
from ackstream.testing import wait_until_settled

from helpers import commits, generator_stream

# about 5 min on a machine loaded 12 times over its cores (make test-long)
pytestmark = [pytest.mark.spark, pytest.mark.long]


def test_last_progress_shows_outcomes_pending_and_lag_per_partition(spark, tmp_path):
    """40 records on 2 partitions: offset 3 fails on its first attempt (replayed, then
    acked), offset 5 fails on both attempts allowed (replayed, then dead-lettered)."""
    channel_dir = str(tmp_path / "channel")
    stream = generator_stream(
        spark,
        channel_dir,
        topology="metered",
        messageTimeout="5 min",
        retryInitialDelay="50ms",
        maxRetries=1,
        **{"generator.count": 40},
    )
    topology = (
        Topology("metered", spark, LocalChannel(channel_dir), message_timeout_ms=300_000)
        .fail_where((F.col("offset") == 3) & (F.col("_attempt") == 0), name="flaky")
        .fail_where(F.col("offset") == 5, name="poison")
        .sink(MemorySink())
    )
    running = topology.start(stream, str(tmp_path / "ckpt"), trigger_ms=200)
    try:
        metrics = wait_until_settled(running, records=40, timeout_s=180)
    finally:
        running.stop()
    assert commits(channel_dir) == {"generator/0": 20, "generator/1": 20}
    assert done(metrics), metrics
    counts = {k: metrics[k] for k in ("acked", "failed", "replayed", "dead_lettered", "pending")}
    assert counts == {"acked": 38, "failed": 6, "replayed": 4, "dead_lettered": 2, "pending": 0}


def done(metrics: dict) -> bool:
    """Every offset of both partitions committed, as the progress reports it."""
    return metrics["partitions"] == {
        "generator": {str(p): {"end": 20, "committed": 20, "lag": 0} for p in (0, 1)}
    }
