"""Dead letters: records that failed on their last allowed attempt, with why and how often.

Two writers of one protocol, :class:`DeadLetterWriter` (``write(letters, records)``,
returning only once the letters are durable: the source then counts those records as
done, and ``close()``):

- :class:`KafkaDeadLetters`: one message per record on the dead-letter topic, the
  original key, value and headers, then headers ``ackstream.reason``,
  ``ackstream.attempts``, ``ackstream.topic``, ``ackstream.partition``,
  ``ackstream.offset``, ``ackstream.topology`` (and ``ackstream.timestamp``, the
  record's own, when it was read), and the same facts under Kafka
  Connect's dead-letter names (``__connect.errors.topic``, ``.partition``,
  ``.offset``, ``.connector.name`` = the topology, ``.exception.class.name`` =
  ``ackstream.Failed``, ``ackstream.TimedOut`` or ``ackstream.Rejected``,
  ``.exception.message`` = the reason), so tools made for Connect's dead letters
  read them. The key stays the record's own; (topic, partition, offset) in the
  headers is the dedupe key. The message's own timestamp is the time the letter was
  written (``written_ms``).
- :class:`ParquetDeadLetters`: a Parquet file per write in a folder (the generator
  and embedded mode), same fields as columns.

:func:`read_dead_letters` reads either back as one table.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

import pyarrow as pa
import pyarrow.parquet as pq
from kafka.errors import KafkaError, KafkaTimeoutError, MessageSizeTooLargeError

from ackstream.errors import EnvironmentProblem
from ackstream.kafka.reading import read_records, topic_ranges
from ackstream.kafka.settings import ClientOptions, client_settings
from ackstream.kafka.topics import CHECK_EVERY_S, deleted_topics
from ackstream.storage.files import write_atomically
from ackstream.vocabulary.clock import now_ms
from ackstream.vocabulary.dead_letter import DeadLetter
from ackstream.vocabulary.ids import content_id, hash_text

if TYPE_CHECKING:
    from kafka.consumer.fetcher import ConsumerRecord

__all__ = [
    "CONNECT_ERRORS",
    "DEAD_LETTER_SCHEMA",
    "DeadLetterRow",
    "DeadLetterWriter",
    "LetterRecords",
    "KafkaDeadLetters",
    "ParquetDeadLetters",
    "read_dead_letters",
]

#: The prefix of Kafka Connect's dead-letter context headers.
CONNECT_ERRORS = "__connect.errors."
#: The status a reason starts with -> the class name Connect's header carries.
_CLASSES = {"failed": "Failed", "timed_out": "TimedOut", "rejected": "Rejected"}
#: The headers written beside the record's own, ackstream's and Connect's.
_OURS = ("ackstream.", CONNECT_ERRORS)
_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

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
        pa.field("headers", _HEADERS),  # the record's own, null when it had none
        # when the letter was written (ms since the epoch): the record's time of death;
        # null in letters written before it was kept
        pa.field("written_ms", pa.int64()),
    ]
)


class Header(TypedDict):
    """One of a record's own Kafka headers, as a dead letter keeps it."""

    key: str
    value: bytes


class DeadLetterRow(TypedDict):
    """One dead letter as a row of :data:`DEAD_LETTER_SCHEMA`: where its record was, why
    and after how many attempts it was given up, and the record itself (key, value,
    time and headers; None where the record was not kept)."""

    topology: str | None
    topic: str
    partition: int
    offset: int
    attempts: int
    reason: str | None
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None
    headers: list[Header] | None
    written_ms: int | None


#: The records of the letters, as the source fetched them again: ``((topic, partition),
#: offset) -> (key, value, timestamp ms[, headers])``; a letter whose record is missing
#: is written without its key and value.
LetterRecords = Mapping[tuple[tuple[str, int], int], tuple[Any, ...]]


class DeadLetterWriter(Protocol):
    """Where a source's dead letters go (``tests/sinks/test_dead_letter_contract.py``
    holds every writer to this): ``write`` returns only once every letter is durable,
    and they read back with :func:`read_dead_letters` with every field of
    :data:`DEAD_LETTER_SCHEMA`; no letters, nothing written; ``close`` releases what
    the writer holds."""

    def write(self, letters: Sequence[DeadLetter], records: LetterRecords) -> None: ...

    def close(self) -> None: ...


def _rows(
    topology: str, letters: Sequence[DeadLetter], records: LetterRecords
) -> Iterator[DeadLetterRow]:
    written = now_ms()
    for letter in letters:
        key, value, ts, *rest = records.get(
            ((letter.topic, letter.partition), letter.offset), (None, None, None)
        )
        headers = rest[0] if rest else None
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
            "headers": [{"key": k, "value": v} for k, v in headers] if headers else None,
            "written_ms": written,
        }


def letter_headers(row: DeadLetterRow) -> list[tuple[str, bytes]]:
    """A dead letter's Kafka headers: the record's own, ackstream's, Connect's."""
    own = [(h["key"], h["value"]) for h in row["headers"] or ()]
    ours = [
        (f"ackstream.{k}", str(v).encode())
        for k, v in (
            ("reason", row["reason"]),
            ("attempts", row["attempts"]),
            ("topic", row["topic"]),
            ("partition", row["partition"]),
            ("offset", row["offset"]),
            ("topology", row["topology"]),
        )
    ]
    if row["timestamp_ms"] is not None:  # the record's own time, not the letter's
        ours.append(("ackstream.timestamp", str(row["timestamp_ms"]).encode()))
    status = str(row["reason"]).split(":", 1)[0]
    connect = {
        "topic": row["topic"],
        "partition": row["partition"],
        "offset": row["offset"],
        "connector.name": row["topology"],
        "exception.class.name": f"ackstream.{_CLASSES.get(status, 'Failed')}",
        "exception.message": row["reason"],
    }
    return own + ours + [(CONNECT_ERRORS + k, str(v).encode()) for k, v in connect.items()]


class ParquetDeadLetters:
    """Dead letters as Parquet files in ``directory`` (hidden while written, then renamed)."""

    def __init__(self, directory: str, topology: str):
        self.directory, self.topology = directory, topology

    def write(self, letters: Sequence[DeadLetter], records: LetterRecords) -> None:
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
    the connection and security ones (see ``kafka.settings.client_settings``).

    The first letter creates the topic if the brokers create topics on demand. Once
    written to, the topic deleted is an error naming it at the next write (see
    :mod:`ackstream.kafka.topics`), not kafka-python's timeout after 120 s."""

    def __init__(
        self, bootstrap: str, topic: str, topology: str, *, kafka_options: ClientOptions = None
    ):
        from kafka import KafkaProducer

        self.topic, self.topology, self.bootstrap = topic, topology, bootstrap
        self._settings = client_settings(kafka_options or {})
        self._producer = KafkaProducer(
            **self._settings,
            bootstrap_servers=bootstrap.split(","),
            acks="all",
            client_id=f"ackstream-{topology}-dead-letters",
        )
        self._lister: Any = None  # a consumer that lists the topics, made at the first write
        self._written = False  # the topic exists: a letter was written to it

    def write(self, letters: Sequence[DeadLetter], records: LetterRecords) -> None:
        if not letters:
            return
        self._check_not_deleted()
        rows = list(_rows(self.topology, letters, records))
        try:
            futures = [self._send(row) for row in rows]
            while True:
                try:
                    self._producer.flush(timeout=CHECK_EVERY_S)
                    break
                except KafkaTimeoutError:  # still waiting: is the topic there?
                    self._check_not_deleted()
            for row, future in zip(rows, futures):
                try:
                    future.get(timeout=30)
                except MessageSizeTooLargeError:  # the broker's limit, below the producer's
                    self._send(row, drop_value=True).get(timeout=30)
        except KafkaError:
            self._check_not_deleted()
            raise
        self._written = True

    def _check_not_deleted(self) -> None:
        if not self._written:
            return
        if self._lister is None:
            from kafka import KafkaConsumer

            self._lister = KafkaConsumer(
                **self._settings,
                bootstrap_servers=self.bootstrap.split(","),
                client_id=f"ackstream-{self.topology}-dead-letters",
            )
        if deleted_topics([self.topic], self._lister.topics):
            raise EnvironmentProblem(
                f"the dead-letter topic {self.topic!r} (option ackstream.deadLetterTopic) "
                f"was deleted from {self.bootstrap} while the query ran: the letters it "
                "held are lost",
                "Re-create it (or let the brokers create it at the next letter) and start "
                "the query again",
            )

    def _send(self, row: DeadLetterRow, drop_value: bool = False) -> Any:
        """Produce one letter (kafka-python's future of the send); a value too large for
        the topic is dropped (the record stays upstream) and the header
        ``ackstream.dropped`` says so."""
        headers = letter_headers(row)
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
            return self._producer.send(
                self.topic,
                key=row["key"],
                value=value,
                headers=headers,
                timestamp_ms=row["written_ms"],
            )
        except MessageSizeTooLargeError:  # over the producer's max_request_size
            if drop_value:
                raise
            return self._send(row, drop_value=True)

    def close(self) -> None:
        self._producer.close()
        if self._lister is not None:
            self._lister.close()


def read_dead_letters(
    directory: str | None = None,
    *,
    bootstrap: str | None = None,
    topic: str | None = None,
    kafka_options: ClientOptions = None,
) -> pa.Table:
    """Every dead letter written by :class:`ParquetDeadLetters` to ``directory``, or by
    :class:`KafkaDeadLetters` to ``topic`` on the brokers at ``bootstrap`` (a message
    without ackstream's headers is left out), as one table of ``DEAD_LETTER_SCHEMA``."""
    if topic is not None:
        return _read_topic(bootstrap, topic, kafka_options)
    if directory is None or not os.path.isdir(directory):
        return DEAD_LETTER_SCHEMA.empty_table()
    files = sorted(
        f for f in os.listdir(directory) if f.endswith(".parquet") and not f.startswith(".")
    )
    tables = [_with_every_column(pq.read_table(os.path.join(directory, f))) for f in files]
    return pa.concat_tables(tables) if tables else DEAD_LETTER_SCHEMA.empty_table()


def _with_every_column(table: pa.Table) -> pa.Table:
    """A file written before a column existed (``headers``, ``written_ms``) gets it,
    all null."""
    columns = [
        table.column(f.name).cast(f.type)
        if f.name in table.column_names
        else pa.nulls(len(table), f.type)
        for f in DEAD_LETTER_SCHEMA
    ]
    return pa.Table.from_arrays(columns, schema=DEAD_LETTER_SCHEMA)


def _read_topic(bootstrap: str | None, topic: str, kafka_options: ClientOptions) -> pa.Table:
    from kafka import KafkaConsumer

    if not bootstrap:
        raise ValueError(f"reading the dead-letter topic {topic!r} needs the brokers' bootstrap")
    consumer = KafkaConsumer(
        **client_settings(kafka_options or {}),
        bootstrap_servers=bootstrap.split(","),
        enable_auto_commit=False,
        client_id="ackstream-dead-letters-reader",
    )
    rows = []
    try:
        for partition, start, end in topic_ranges(consumer, topic, {}):
            for rec in read_records(consumer, (topic, partition), [(start, end)]):
                row = _row_of(rec)
                if row is not None:
                    rows.append(row)
    finally:
        consumer.close(autocommit=False)
    return pa.Table.from_pylist(rows, schema=DEAD_LETTER_SCHEMA)


def _row_of(rec: ConsumerRecord) -> DeadLetterRow | None:
    """A dead-letter message back as a row; None if it has no ackstream headers."""
    headers = rec.headers or []
    ours = {k[len("ackstream.") :]: v.decode() for k, v in headers if k.startswith("ackstream.")}
    if not {"topic", "partition", "offset"} <= set(ours):
        return None
    own = [Header(key=k, value=v) for k, v in headers if not k.startswith(_OURS)]
    return {
        "topology": ours.get("topology"),
        "topic": ours["topic"],
        "partition": int(ours["partition"]),
        "offset": int(ours["offset"]),
        "attempts": int(ours.get("attempts", 0)),
        "reason": ours.get("reason"),
        "key": rec.key,
        "value": rec.value,
        "timestamp_ms": int(ours["timestamp"]) if "timestamp" in ours else None,
        "headers": own or None,
        # the message's timestamp: the producer's (the letter's writer) or the broker's
        # append time, a topic's message.timestamp.type says which; both when it died
        "written_ms": rec.timestamp if rec.timestamp is not None and rec.timestamp >= 0 else None,
    }


def select_dead_letters(
    letters: pa.Table,
    *,
    reason: str | None = None,
    records: Iterable[tuple[str, int, int]] = (),
    limit: int | None = None,
) -> list[DeadLetterRow]:
    """The dead letters whose reason contains ``reason`` (case-insensitive) and whose
    ``(topic, partition, offset)`` is one of ``records`` (when given), at most ``limit``,
    in (topic, partition, offset) order."""
    wanted = {(t, int(p), int(o)) for t, p, o in records}
    every: list[DeadLetterRow] = letters.to_pylist()
    rows = sorted(every, key=lambda r: (r["topic"], r["partition"], r["offset"]))
    out = [
        r
        for r in rows
        if (reason is None or reason.lower() in (r["reason"] or "").lower())
        and (not wanted or (r["topic"], r["partition"], r["offset"]) in wanted)
    ]
    return out if limit is None else out[:limit]


#: The header a replayed record carries: where its dead letter came from.
REPLAY_HEADER = "ackstream.replay_of"


def replay_dead_letters(
    rows: list[DeadLetterRow], bootstrap: str, *, kafka_options: ClientOptions = None
) -> int:
    """Send each dead letter's record back to its source topic and partition: key,
    value and the record's own headers as they were, plus :data:`REPLAY_HEADER`
    (``topic:partition:offset`` of the original). Waits for every broker ack; returns
    how many were sent. A letter whose value was not kept (rejected for its size) is
    refused: its record would come back empty."""
    from kafka import KafkaProducer

    dropped = [r for r in rows if r["value"] is None or _rejected_for_size(r)]
    if dropped:
        first = dropped[0]
        raise ValueError(
            f"dead letter {first['topic']}[{first['partition']}]@{first['offset']} has no "
            "value (it was rejected for its size and only its coordinates were kept): "
            "leave it out (--reason, --record), read the original from the source topic"
        )
    producer = KafkaProducer(
        **client_settings(kafka_options or {}),
        bootstrap_servers=bootstrap.split(","),
        acks="all",
        client_id="ackstream-dead-letters-replay",
    )
    try:
        futures = []
        for r in rows:
            own = [(h["key"], h["value"]) for h in r["headers"] or ()]
            origin = f"{r['topic']}:{r['partition']}:{r['offset']}".encode()
            futures.append(
                producer.send(
                    r["topic"],
                    key=r["key"],
                    value=r["value"],
                    partition=r["partition"],
                    headers=own + [(REPLAY_HEADER, origin)],
                )
            )
        producer.flush()
        for future in futures:
            future.get(timeout=30)
    finally:
        producer.close()
    return len(rows)


def _rejected_for_size(row: DeadLetterRow) -> bool:
    return (row["reason"] or "").startswith("rejected: value of")
