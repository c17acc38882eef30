"""Which dead letters were replayed already, kept beside the dead letters.

``ackstream dead-letters replay`` sends a letter's record back to its source topic;
without a mark, a second run would send it again. Each letter sent is marked once
the broker has confirmed its record (a crash in between sends it again on the next
run: at least once, never lost):

- :class:`FileReplayLog`, for a Parquet dead-letter folder: ``_replayed.jsonl`` in
  the folder (Spark and pyarrow skip names starting with ``_``), a line per letter.
- :class:`TopicReplayLog`, for a dead-letter topic: the topic ``<topic>.replayed``,
  a message per letter, made on first use. The dead-letter topic itself is left as
  it is, for other tools (Kafka Connect's) that read it.

A letter is named by its record's coordinates, ``topic:partition:offset``: a
replayed record that fails again is dead-lettered at its new offset, a new name.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Protocol, runtime_checkable

from ackstream.kafka.reading import read_records, topic_ranges
from ackstream.kafka.settings import ClientOptions, client_settings
from ackstream.sinks.dead_letters import DeadLetterRow

__all__ = ["FileReplayLog", "ReplayLog", "TopicReplayLog", "letter_name"]

FILE = "_replayed.jsonl"
SUFFIX = ".replayed"


def letter_name(row: DeadLetterRow) -> str:
    """A dead letter's name: its record's ``topic:partition:offset``."""
    return f"{row['topic']}:{row['partition']}:{row['offset']}"


@runtime_checkable
class ReplayLog(Protocol):
    """Where the replays of a set of dead letters are marked."""

    def replayed(self) -> dict[str, int]:
        """``{letter name: when it was last replayed, epoch ms}``."""
        ...

    def mark(self, names: list[str], at_ms: int) -> None:
        """Mark the letters ``names`` replayed at ``at_ms``; durable when it returns."""
        ...


class FileReplayLog:
    """Marks in ``<folder>/_replayed.jsonl``."""

    def __init__(self, folder: str):
        self.path = os.path.join(folder, FILE)

    def replayed(self) -> dict[str, int]:
        marks: dict[str, int] = {}
        with contextlib.suppress(FileNotFoundError), open(self.path) as f:
            for line in f:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    mark = json.loads(line)
                    marks[mark["letter"]] = int(mark["at_ms"])
        return marks

    def mark(self, names: list[str], at_ms: int) -> None:
        with open(self.path, "a") as f:
            f.writelines(json.dumps({"letter": n, "at_ms": at_ms}) + "\n" for n in names)
            f.flush()
            os.fsync(f.fileno())


class TopicReplayLog:
    """Marks on the topic ``<dead-letter topic>.replayed`` at ``bootstrap``: key the
    letter's name, value ``{"at_ms": ...}``."""

    def __init__(self, bootstrap: str, dead_letter_topic: str, kafka_options: ClientOptions = None):
        self.bootstrap = bootstrap.split(",")
        self.topic = dead_letter_topic + SUFFIX
        self.settings = client_settings(kafka_options or {})

    def replayed(self) -> dict[str, int]:
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(
            **self.settings,
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            client_id="ackstream-dead-letters-replayed",
        )
        marks: dict[str, int] = {}
        try:
            for partition, start, end in topic_ranges(consumer, self.topic, {}):
                for rec in read_records(consumer, (self.topic, partition), [(start, end)]):
                    with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
                        marks[rec.key.decode()] = int(json.loads(rec.value)["at_ms"])
        finally:
            consumer.close(autocommit=False)
        return marks

    def mark(self, names: list[str], at_ms: int) -> None:
        from kafka import KafkaProducer

        self._create()
        producer = KafkaProducer(
            **self.settings,
            bootstrap_servers=self.bootstrap,
            acks="all",
            client_id="ackstream-dead-letters-replayed",
        )
        try:
            value = json.dumps({"at_ms": at_ms}).encode()
            futures = [producer.send(self.topic, key=n.encode(), value=value) for n in names]
            producer.flush()
            for future in futures:
                future.get(timeout=30)
        finally:
            producer.close()

    def _create(self) -> None:
        """Make the topic (one partition, the brokers' replication) if it is missing."""
        from kafka.admin import KafkaAdminClient, NewTopic
        from kafka.errors import TopicAlreadyExistsError

        admin = KafkaAdminClient(
            **self.settings, bootstrap_servers=self.bootstrap, client_id="ackstream"
        )
        try:
            if self.topic not in set(admin.list_topics()):
                with contextlib.suppress(TopicAlreadyExistsError):
                    admin.create_topics([NewTopic(self.topic, 1, -1)])
        finally:
            admin.close()
