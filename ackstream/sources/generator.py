"""The built-in generator upstream: deterministic sentences, at a rate, up to a count.

For the embedded default (no broker) and benchmarks. Record ``o`` of partition
``p`` is always the same sentence, so a replay re-generates the value of its
offset and ``read()`` is deterministic. It goes through the same tracking,
replays and dead letters as Kafka; its "consumer group" commits are a small
JSON file in the channel directory, ``generator-commits.json``.

>>> sentence(0, 7) == sentence(0, 7)
True
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ackstream.config.source import SourceConfig
from ackstream.sources.rows import ReadTask, spout_batch
from ackstream.storage.files import write_atomically
from ackstream.vocabulary import ids
from ackstream.vocabulary.partition import Partition

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["TOPIC", "UNBOUNDED_STEP", "WORDS", "GeneratorUpstream", "committed_count", "sentence"]

TOPIC = "generator"
#: Timestamp of offset 0; offset o is ``EPOCH_MS + o`` so that re-reads agree.
EPOCH_MS = 1_700_000_000_000
COMMITS_FILE = "generator-commits.json"
#: Records a generator with neither ``count`` nor ``rate`` offers per partition beyond
#: the reader's position: it runs as fast as batches go, each of a bounded size (all it
#: could offer, without end, is more than any batch can hold).
UNBOUNDED_STEP = 10_000
WORDS = [
    "storm",
    "spark",
    "tuple",
    "bolt",
    "spout",
    "acker",
    "anchor",
    "root",
    "edge",
    "stream",
    "batch",
    "offset",
    "kafka",
    "replay",
    "commit",
    "ledger",
    "tree",
    "timeout",
    "retry",
    "letter",
    "shard",
    "state",
    "window",
    "watermark",
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "is",
    "it",
    "on",
    "at",
    "by",
    "with",
    "from",
    "fast",
    "slow",
    "every",
    "each",
    "one",
    "two",
    "three",
]


def sentence(partition: int, offset: int) -> str:
    """The value of record ``offset`` of ``partition``: 3 to 8 words."""
    return _sentences(partition, np.array([offset]))[0]


def _sentences(partition: int, offsets: np.ndarray) -> list[str]:
    h = ids.hash_longs(partition, offsets).view(np.uint64)
    lengths = (h % np.uint64(6) + np.uint64(3)).astype(int)
    picks = [
        ids.hash_longs(h.view(np.int64), i).view(np.uint64) % np.uint64(len(WORDS))
        for i in range(8)
    ]
    return [" ".join(WORDS[int(picks[i][k])] for i in range(n)) for k, n in enumerate(lengths)]


def committed_count(channel: str) -> int:
    """Offsets the generator's consumer group has committed in the channel directory
    ``channel``, summed over its partitions: its ``count`` once every record is acked
    or dead-lettered.

    >>> committed_count("/no/such/channel")
    0
    """
    return sum(offset for offset, _ in _saved(channel).values())


def _saved(channel: str) -> dict[str, list[Any]]:
    """The commit file: ``"topic/partition" -> [offset, metadata]``."""
    try:
        with open(os.path.join(channel, COMMITS_FILE)) as f:
            saved: dict[str, list[Any]] = json.load(f)
            return saved
    except FileNotFoundError:
        return {}


def _count(config: SourceConfig, partition: int) -> int | None:
    if config.generator.count is None:
        return None
    per, extra = divmod(config.generator.count, config.generator.partitions)
    return per + (1 if partition < extra else 0)


class GeneratorUpstream:
    """Partitions, how far each may be read now, the commit file, and the records."""

    def __init__(self, config: SourceConfig):
        self.config = config
        self._t0 = time.monotonic()
        self._base: dict[Partition, int] = {}
        self._commits = os.path.join(config.channel, COMMITS_FILE)

    def check(self) -> None:
        """Nothing can be missing: the records are computed."""

    def partitions(self) -> list[tuple[str, int]]:
        return [(TOPIC, p) for p in range(self.config.generator.partitions)]

    def earliest(self, tps: list[Partition]) -> dict[Partition, int]:
        return {tp: 0 for tp in tps}

    def latest(
        self, tps: list[Partition], positions: dict[Partition, int] | None = None
    ) -> dict[Partition, int]:
        """Per partition: ``count`` records, released at ``rate`` per second from the
        position the reader first asked at; with neither, :data:`UNBOUNDED_STEP` beyond
        the reader's position at a time."""
        out = {}
        rate = self.config.generator.rate / self.config.generator.partitions
        for tp in tps:
            count = _count(self.config, tp[1])
            position = (positions or {}).get(tp, 0)
            if rate > 0:
                base = self._base.setdefault(tp, position)
                avail = base + int(rate * (time.monotonic() - self._t0))
            else:
                avail = position + UNBOUNDED_STEP if count is None else count
            out[tp] = avail if count is None else min(count, avail)
        return out

    def committed(self, tps: list[Partition]) -> dict[Partition, tuple[int, str]]:
        saved = _saved(self.config.channel)
        return {tp: tuple(saved[f"{tp[0]}/{tp[1]}"]) for tp in tps if f"{tp[0]}/{tp[1]}" in saved}

    def commit(self, offsets: dict[Partition, tuple[int, str]]) -> None:
        if not offsets:
            return
        saved = self.committed(self.partitions())
        saved.update(offsets)
        os.makedirs(self.config.channel, exist_ok=True)
        text = json.dumps({f"{t}/{p}": list(v) for (t, p), v in saved.items()})
        write_atomically(self._commits, lambda path: _write_text(path, text))

    def fetch(
        self, coords: list[tuple[Partition, int]]
    ) -> dict[tuple[Partition, int], tuple[Any, ...]]:
        out = {}
        for tp, off in coords:
            out[(tp, off)] = (
                _key(tp[1], off),
                sentence(tp[1], off).encode(),
                EPOCH_MS + off,
                None,  # no headers
            )
        return out

    def read(self, task: ReadTask) -> Iterator[pa.RecordBatch]:
        """Arrow batches of one task, generated (no I/O)."""
        pairs = [(o, 0) for o in range(task.start, task.end)] + sorted(task.replays)
        step = 10_000
        for i in range(0, len(pairs), step):
            chunk = pairs[i : i + step]
            offsets = np.array([o for o, _ in chunk], dtype=np.int64)
            yield spout_batch(
                self.config.id_namespace,
                task.topic,
                task.partition,
                offsets,
                [a for _, a in chunk],
                [_key(task.partition, int(o)) for o in offsets],
                [s.encode() for s in _sentences(task.partition, offsets)],
                EPOCH_MS + offsets,
                headers=[None] * len(chunk) if self.config.kafka.include_headers else None,
            )

    def close(self) -> None:
        pass


def _key(partition: int, offset: int) -> bytes:
    return f"{partition}-{offset}".encode()


def _write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
