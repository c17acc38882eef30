"""Kafka output sink: produce each output row, ack only what the broker confirmed.

Runs in the topology's ``foreachBatch`` on the driver: the batch's outputs are
collected as Arrow, produced with one kafka-python producer (kept across
batches), flushed, and every row whose send future failed is handed back, so
ackstream fails its roots (they are replayed) and acks the rest. A row is never
acked before the broker confirmed it.
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa

from ackstream.lineage import LINEAGE_COLUMNS

__all__ = ["KafkaSink"]

log = logging.getLogger(__name__)


class KafkaSink:
    """Writes the ``key`` (optional) and ``value`` columns of each output row to
    ``topic``, as Spark's Kafka sink does; strings are UTF-8 encoded, binary kept.

    ``producer_config`` goes to ``kafka.KafkaProducer`` (e.g. ``acks``,
    ``max_request_size``); ``flush_timeout_s`` bounds the wait for confirmations.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        key: str | None = "key",
        value: str = "value",
        producer_config: dict | None = None,
        flush_timeout_s: float = 30.0,
    ):
        self.bootstrap, self.topic = bootstrap, topic
        self.key, self.value = key, value
        self.producer_config = dict(producer_config or {})
        self.flush_timeout_s = flush_timeout_s
        self._producer = None

    def _client(self):
        if self._producer is None:
            from kafka import KafkaProducer

            config = {"acks": "all", "client_id": "ackstream-sink", **self.producer_config}
            self._producer = KafkaProducer(bootstrap_servers=self.bootstrap, **config)
        return self._producer

    def write(self, outputs, batch_id: int):
        lineage = [c for c in LINEAGE_COLUMNS if c in outputs.columns]
        key = self.key if self.key and self.key in outputs.columns else None
        table = outputs.select(*([key] if key else []), self.value, *lineage).toArrow()
        if not table.num_rows:
            return None
        keys = table.column(key).to_pylist() if key else [None] * table.num_rows
        values = table.column(self.value).to_pylist()
        producer = self._client()
        futures = [self._send(producer, k, v) for k, v in zip(keys, values)]
        try:
            producer.flush(timeout=self.flush_timeout_s)
        except Exception as error:  # unconfirmed rows are failed below
            log.warning("flush to %s did not finish: %s", self.topic, error)
        ok = np.fromiter(
            (f is not None and f.is_done and f.succeeded() for f in futures), bool, len(futures)
        )
        if ok.all():
            return None
        log.warning("%d of %d rows were not confirmed by %s", (~ok).sum(), len(ok), self.topic)
        return table.select(lineage).filter(pa.array(~ok))

    def _send(self, producer, key, value):
        """The send future, or None when the producer refused the row outright
        (kafka-python raises e.g. ``MessageSizeTooLargeError`` before queueing)."""
        try:
            return producer.send(self.topic, key=_bytes(key), value=_bytes(value))
        except Exception as error:  # the row is failed, the others go on
            log.warning("row refused by the producer for %s: %s", self.topic, error)
            return None

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None


def _bytes(x):
    if x is None or isinstance(x, bytes):
        return x
    if isinstance(x, str):
        return x.encode("utf-8")
    return str(x).encode("utf-8")
