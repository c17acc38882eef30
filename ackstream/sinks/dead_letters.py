"""Dead letters: records that failed on their last allowed attempt, with why and how often.

Two writers with one ``write(letters, records)`` call, both returning only once the
letters are durable (the source then counts those records as done):

- :class:`KafkaDeadLetters`: one message per record on the dead-letter topic, the
  original key and value, and headers ``ackstream.reason``, ``ackstream.attempts``,
  ``ackstream.topic``, ``ackstream.partition``, ``ackstream.offset``,
  ``ackstream.topology``. The key stays the record's own; (topic, partition,
  offset) in the headers is the dedupe key.
- :class:`ParquetDeadLetters`: a Parquet file per write in a folder (the generator
  and embedded mode), same fields as columns.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
from kafka.errors import MessageSizeTooLargeError

from ackstream.files import write_atomically
from ackstream.ids import content_id, hash_text
from ackstream.kafka.settings import client_settings

__all__ = ["DEAD_LETTER_SCHEMA", "KafkaDeadLetters", "ParquetDeadLetters", "read_dead_letters"]

DEAD_LETTER_SCHEMA = pa.schema(
    [
        pa.field("topology", pa.string()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("attempts", pa.int32()),
        pa.field("reason", pa.string()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("timestamp_ms", pa.int64()),
    ]
)


def _rows(topology, letters, records):
    for letter in letters:
        key, value, ts = records.get(
            ((letter.topic, letter.partition), letter.offset), (None, None, None)
        )
        yield {
            "topology": topology,
            "topic": letter.topic,
            "partition": letter.partition,
            "offset": letter.offset,
            "attempts": letter.attempts,
            "reason": letter.reason,
            "key": key,
            "value": value,
            "timestamp_ms": ts,
        }


class ParquetDeadLetters:
    """Dead letters as Parquet files in ``directory`` (hidden while written, then renamed)."""

    def __init__(self, directory: str, topology: str):
        self.directory, self.topology = directory, topology

    def write(self, letters, records) -> None:
        if not letters:
            return
        os.makedirs(self.directory, exist_ok=True)
        table = pa.Table.from_pylist(
            list(_rows(self.topology, letters, records)), schema=DEAD_LETTER_SCHEMA
        )
        # named by the records it holds: writing the same letters again after a
        # restart replaces the file, so each record is dead-lettered once here
        name = (
            content_id(
                table.column("partition").to_numpy(zero_copy_only=False),
                table.column("offset").to_numpy(zero_copy_only=False),
                [hash_text(t) for t in table.column("topic").to_pylist()],
            )
            + ".parquet"
        )
        write_atomically(
            os.path.join(self.directory, name), lambda path: pq.write_table(table, path)
        )

    def close(self) -> None:
        pass


class KafkaDeadLetters:
    """Dead letters produced to ``topic``; ``write`` waits for every broker ack.
    ``kafka_options``: the source's ``kafka.*`` settings, of which the producer takes
    the connection and security ones (see ``kafka.settings.client_settings``)."""

    def __init__(self, bootstrap: str, topic: str, topology: str, *, kafka_options=None):
        from kafka import KafkaProducer

        self.topic, self.topology = topic, topology
        self._producer = KafkaProducer(
            **client_settings(kafka_options or {}),
            bootstrap_servers=bootstrap.split(","),
            acks="all",
            client_id=f"ackstream-{topology}-dead-letters",
        )

    def write(self, letters, records) -> None:
        rows = list(_rows(self.topology, letters, records))
        futures = [self._send(row) for row in rows]
        self._producer.flush()
        for row, future in zip(rows, futures):
            try:
                future.get(timeout=30)
            except MessageSizeTooLargeError:  # the broker's limit, below the producer's
                self._send(row, drop_value=True).get(timeout=30)

    def _send(self, row: dict, drop_value: bool = False):
        """Produce one letter; a value too large for the topic is dropped (the record
        stays upstream) and the header ``ackstream.dropped`` says so."""
        headers = [
            (f"ackstream.{k}", str(row[k]).encode())
            for k in ("reason", "attempts", "topic", "partition", "offset", "topology")
        ]
        value = row["value"]
        if drop_value:
            note = f"value of {len(value or b'')} bytes: too large for {self.topic}; the record "
            headers.append(("ackstream.dropped", f"{note}stays in {row['topic']}".encode()))
            value = None
        # Kafka takes no message with neither key nor value (a null record whose
        # value was dropped for its size): an empty value, the headers say the rest
        if row["key"] is None and value is None:
            value = b""
        try:
            return self._producer.send(self.topic, key=row["key"], value=value, headers=headers)
        except MessageSizeTooLargeError:  # over the producer's max_request_size
            if drop_value:
                raise
            return self._send(row, drop_value=True)

    def close(self) -> None:
        self._producer.close()


def read_dead_letters(directory: str) -> pa.Table:
    """Every dead letter written by :class:`ParquetDeadLetters` to ``directory``."""
    if not os.path.isdir(directory):
        return DEAD_LETTER_SCHEMA.empty_table()
    files = sorted(
        f for f in os.listdir(directory) if f.endswith(".parquet") and not f.startswith(".")
    )
    tables = [pq.read_table(os.path.join(directory, f), schema=DEAD_LETTER_SCHEMA) for f in files]
    return pa.concat_tables(tables) if tables else DEAD_LETTER_SCHEMA.empty_table()
