"""Kafka output sink: produce from the executors, ack only what the broker confirmed.

``write`` runs the produce inside Spark's tasks (``mapInArrow``): each task builds
its own kafka-python producer from the sink's plain settings, sends its rows,
flushes, and yields only the rows the broker did not confirm, with their lineage
columns and a ``_reason``. The driver collects just those, so a clean batch moves
no rows to the driver (issues 15 and 17), and ackstream fails their roots (they are
replayed) and acks the rest. A row is never acked before the broker confirmed it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ackstream.kafka.settings import client_settings
from ackstream.lineage import LINEAGE_COLUMNS, REASON

__all__ = ["KafkaSink", "ProduceTask", "carried_columns"]

log = logging.getLogger(__name__)

#: Characters of a ``_reason`` kept, as ``topology.bolts.REASON_LIMIT`` (not imported:
#: executors unpickling the task would import the whole topology package).
REASON_CHARS = 500


class KafkaSink:
    """Writes the ``key`` (optional) and ``value`` columns of each output row to
    ``topic``, as Spark's Kafka sink does; strings are UTF-8 encoded, binary kept.

    ``kafka_options``: the client settings in the source's ``kafka.*`` form (the source's
    options may be given as they are), of which the producers take the connection and
    security ones, so the sink reaches a secured cluster as the source does.
    ``producer_config`` goes to ``kafka.KafkaProducer`` as it is (e.g. ``acks``,
    ``max_request_size``) and wins; ``flush_timeout_s`` bounds each task's wait for
    confirmations. The sink holds only these settings, so it pickles (Spark Connect
    pickles the ``foreachBatch`` function with it).
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        key: str | None = "key",
        value: str = "value",
        kafka_options: dict | None = None,
        producer_config: dict | None = None,
        flush_timeout_s: float = 30.0,
    ):
        self.bootstrap, self.topic = bootstrap, topic
        self.key, self.value = key, value
        kafka_options = {
            k: v for k, v in (kafka_options or {}).items() if str(k).startswith("kafka.")
        }
        # a bad setting fails here, on the driver, not in every task
        self.producer_config = {**client_settings(kafka_options), **(producer_config or {})}
        self.flush_timeout_s = flush_timeout_s

    def write(self, outputs, batch_id: int):
        from pyspark.sql.types import StringType

        key = self.key if self.key and self.key in outputs.columns else None
        payload = [*([key] if key else []), self.value]
        carried = carried_columns(outputs.columns, payload)
        schema = outputs.select(*carried).schema.add(REASON, StringType())
        produce = ProduceTask(
            self.bootstrap,
            self.topic,
            key,
            self.value,
            tuple(carried),
            self.producer_config,
            self.flush_timeout_s,
        )
        unwritten = outputs.select(*payload, *carried).mapInArrow(produce, schema).toArrow()
        if not unwritten.num_rows:
            return None
        log.warning(
            "batch %d: %d rows were not written to %s, first: %s",
            batch_id,
            unwritten.num_rows,
            self.topic,
            unwritten.column(REASON)[0],
        )
        return unwritten

    def close(self) -> None:
        """Nothing to release: every producer lives and dies inside one task."""


def carried_columns(columns, payload) -> list[str]:
    """The columns an unwritten row is handed back with: the lineage columns the frame
    has, then any other ``_``-prefixed column the topology passed through (e.g.
    ``_attempt``), but not ``_reason`` (the sink says why) nor a payload column."""
    taken = set(payload) | {REASON}
    lineage = [c for c in LINEAGE_COLUMNS if c in columns and c not in taken]
    return lineage + [
        c for c in columns if c.startswith("_") and c not in taken and c not in lineage
    ]


@dataclass(frozen=True)
class ProduceTask:
    """The ``mapInArrow`` function of one write: plain settings only, so it pickles to
    the executors, where each task makes, flushes and closes its own producer."""

    bootstrap: str
    topic: str
    key: str | None
    value: str
    carried: tuple[str, ...]
    producer_config: dict
    flush_timeout_s: float

    def __call__(self, batches):
        try:
            producer = self._producer()
        except Exception as error:  # every row of the task is unwritten, and says why
            refused = _reason("no producer", error)
            for batch in batches:
                if batch.num_rows:
                    yield self._unwritten(batch, [refused] * batch.num_rows)
            return
        try:
            for batch in batches:
                reasons = self._send(producer, batch)
                if any(r is not None for r in reasons):
                    yield self._unwritten(batch, reasons)
        finally:
            producer.close(timeout=self.flush_timeout_s)

    def _producer(self):
        from kafka import KafkaProducer

        config = {"acks": "all", "client_id": "ackstream-sink", **self.producer_config}
        return KafkaProducer(bootstrap_servers=self.bootstrap, **config)

    def _send(self, producer, batch: pa.RecordBatch) -> list[str | None]:
        """Send every row of ``batch`` and flush: per row, None once the broker
        confirmed it, else why not."""
        n = batch.num_rows
        keys = batch.column(self.key).to_pylist() if self.key else [None] * n
        values = batch.column(self.value).to_pylist()
        futures, reasons = [], [None] * n
        for i, (key, value) in enumerate(zip(keys, values)):
            try:
                futures.append(producer.send(self.topic, key=_bytes(key), value=_bytes(value)))
            except Exception as error:  # e.g. MessageSizeTooLargeError: this row only
                futures.append(None)
                reasons[i] = _reason("refused by the producer", error)
        try:
            producer.flush(timeout=self.flush_timeout_s)
        except Exception as error:  # the rows left unconfirmed are failed below
            log.warning("flush to %s did not finish: %s", self.topic, error)
        for i, future in enumerate(futures):
            if future is None or (future.is_done and future.succeeded()):
                continue
            reasons[i] = (
                _reason("refused by the broker", future.exception)
                if future.is_done
                else f"not confirmed by the broker within {self.flush_timeout_s:g}s"
            )
        return reasons

    def _unwritten(self, batch: pa.RecordBatch, reasons: list) -> pa.RecordBatch:
        failed = np.array([r is not None for r in reasons], dtype=bool)
        rows = batch.select(list(self.carried)).filter(pa.array(failed))
        why = [f"KafkaSink to {self.topic}: {r}"[:REASON_CHARS] for r in reasons if r is not None]
        return pa.RecordBatch.from_arrays(
            [*rows.columns, pa.array(why, pa.string())], names=[*self.carried, REASON]
        )


def _reason(what: str, error) -> str:
    return f"{what}: {type(error).__name__}: {error}"


def _bytes(x):
    if x is None or isinstance(x, bytes):
        return x
    if isinstance(x, str):
        return x.encode("utf-8")
    return str(x).encode("utf-8")
