"""The partitions a source tracks, numbered: the index its in-flight table's ``part``
column holds, and the root ids of the records at those coordinates."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ackstream.vocabulary import ids
from ackstream.vocabulary.partition import Partition

__all__ = ["Numbering"]


class Numbering:
    """Partitions numbered in the order they were first seen (a number is never reused)."""

    def __init__(self, source: str) -> None:
        self.source = source
        #: the partition of each number
        self.tps: list[Partition] = []
        #: the number of each partition
        self.index: dict[Partition, int] = {}
        #: ``xxhash64(source, topic, partition)`` of each of ``tps``: what its ids go on from
        self._seeds = np.empty(0, np.int64)

    def number(self, tp: Partition) -> int:
        """The number of ``tp``, given now if it has none."""
        if tp not in self.index:
            self.index[tp] = len(self.tps)
            self.tps.append(tp)
        return self.index[tp]

    def mint(self, part: np.ndarray, offset: np.ndarray, attempt: np.ndarray) -> np.ndarray:
        """The root ids of records (``part`` holds partition numbers)."""
        if not len(offset):
            return np.empty(0, np.int64)
        if len(self._seeds) < len(self.tps):  # partitions added since: hashed once each
            topics, partitions = zip(*self.tps)
            self._seeds = ids.partition_seeds(self.source, topics, np.array(partitions))
        return ids.hash_longs(offset, attempt, seed=self._seeds[part])

    def parts_of(self, topic: pa.ChunkedArray, partition: pa.ChunkedArray) -> np.ndarray:
        """The number of each ``(topic, partition)``, -1 where not tracked (or null):
        looked up in a table by topic and partition number, a gather per row and no
        sort or hash."""
        tracked = {t for t, _ in self.index}
        if len(tracked) == 1:  # the usual source: a string compare per row, no hash
            (name,) = tracked
            column = {name: 0}
            same = pc.fill_null(pc.equal(topic, name), False)
            codes = same.to_numpy(zero_copy_only=False).astype(np.int64) - 1
        else:
            names = pc.dictionary_encode(topic.combine_chunks())
            codes = pc.fill_null(names.indices, -1).to_numpy(zero_copy_only=False)
            codes = codes.astype(np.int64)
            column = {name: i for i, name in enumerate(names.dictionary.to_pylist())}
        number = pc.fill_null(partition, -1).to_numpy().astype(np.int64)
        known = [(column[t], p, i) for (t, p), i in self.index.items() if t in column and p >= 0]
        width = 2 + max((p for _, p, _ in known), default=-1)
        # row 0 (no topic) and column 0 (no tracked partition number) hold -1
        table = np.full((len(column) + 1, width), -1, np.int64)
        for code, p, i in known:
            table[code + 1, p + 1] = i
        at = np.where((number >= 0) & (number < width - 1), number + 1, 0)
        numbers: np.ndarray = np.take(table.ravel(), (codes + 1) * width + at)
        return numbers
