"""``spark.readStream.format("ackstream")``: upstream records as tracked spout tuples.

Three processes are involved (DESIGN.md): options are parsed where the DataFrame
is created, so a bad one fails at ``load()``; :class:`AckstreamStreamReader`'s
planning methods run in one long-lived driver-side Python process, which owns a
:class:`_Driver` (tracker, upstream client, completion channel, dead letters);
``read()`` runs in executor workers on a fresh, pickled reader and gets
everything it needs from its :class:`~ackstream.sources.rows.ReadTask`.

An offset (see :mod:`ackstream.sources.offsets`) carries the whole tracking
state and names every record of its batch, new offsets and replays, so a
restart re-reads the same batch and resumes the same in-flight table, and a
topology knows a batch's roots from the offset Spark logged for it.

Guarantees: a group commit never covers an offset that is not acked or
dead-lettered. A dead letter is written once, then its record is done; writing
it makes the next offset differ (an empty batch if nothing else is new), so the
fact is in Spark's offset log a few milliseconds later, and in the group commit
when it is contiguous (or in the commit metadata, on brokers that keep it). Only
a driver crash inside that window writes the dead letter again on restart: the
headers' (topic, partition, offset) then identify the duplicate.
"""

from __future__ import annotations

import json
import time

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from ackstream.acker.query import default_tick_ms
from ackstream.config import SourceConfig, parse
from ackstream.errors import AckstreamError
from ackstream.records import tick
from ackstream.sources.offsets import read_tasks
from ackstream.sources.rows import SOURCE_DDL, ReadTask
from ackstream.sources.tracking import RetryPolicy, Tracker

__all__ = ["AckstreamDataSource", "AckstreamStreamReader", "register"]


def register(spark) -> None:
    """Make ``spark.readStream.format("ackstream")`` available in this session."""
    spark.dataSource.register(AckstreamDataSource)


class AckstreamDataSource(DataSource):
    """The ``ackstream`` source; options are parsed (and checked) on construction."""

    def __init__(self, options):
        super().__init__(options)
        self.config = parse(options)
        if self.config.upstream == "kafka":
            from ackstream.sources.kafka import check_upstream

            check_upstream(self.config)  # brokers up, topics there: say so before the start

    @classmethod
    def name(cls) -> str:
        return "ackstream"

    def schema(self) -> str:
        return SOURCE_DDL

    def streamReader(self, schema) -> AckstreamStreamReader:
        return AckstreamStreamReader(self.config)


class _Part(InputPartition):
    def __init__(self, task: ReadTask):
        super().__init__(task)
        self.task = task


def _now_ms() -> int:
    return int(time.time() * 1000)


class AckstreamStreamReader(DataSourceStreamReader):
    """Plans micro-batches on the driver, reads them on executors (nothing opened eagerly:
    the executors' copy is constructed too)."""

    def __init__(self, config: SourceConfig):
        self.config = config
        self._driver: _Driver | None = None

    # --- driver side ----------------------------------------------------------------

    def _driver_for(self, offset: dict) -> _Driver:
        """The driver state; on the first call, rebuilt from ``offset`` (a restart)."""
        if self._driver is None:
            self._driver = _Driver(self.config, offset)
        return self._driver

    def initialOffset(self) -> dict:
        upstream = _upstream(self.config)
        try:
            tps = upstream.partitions()
            starts = _starting_positions(self.config, upstream, tps)
        finally:
            upstream.close()
        tracker = _new_tracker(self.config)
        for tp in tps:
            tracker.add_partition(tp, starts[tp])
        from ackstream.sinks.channel import open_channel

        done = open_channel(self.config).end_position()
        return {"v": 1, "parts": tracker.snapshot(), "replays": [], "done": done}

    def getDefaultReadLimit(self):
        if self.config.max_offsets_per_trigger:
            return ReadMaxRows(self.config.max_offsets_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit) -> dict:
        driver = self._driver_for(start)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return driver.next_offset(_now_ms(), max_rows) or start

    def partitions(self, start: dict, end: dict):
        if self.config.tracking:
            self._driver_for(end)  # a restart re-running its last batch starts here
        tasks = read_tasks(start, end)
        return [_Part(t) for t in tasks]

    def commit(self, end: dict) -> None:
        if self._driver is not None:
            self._driver.on_spark_commit(end, _now_ms())

    def stop(self) -> None:
        if self._driver is not None:
            self._driver.close()
            self._driver = None

    # --- executor side --------------------------------------------------------------

    def read(self, partition):
        task = partition.task
        if self.config.upstream == "generator":
            from ackstream.sources.generator import read_task
        else:
            from ackstream.sources.kafka import read_task
        yield from read_task(self.config, task)


def _upstream(config: SourceConfig):
    if config.upstream == "generator":
        from ackstream.sources.generator import GeneratorUpstream

        return GeneratorUpstream(config)
    from ackstream.sources.kafka import KafkaUpstream

    return KafkaUpstream(config)


def _new_tracker(config: SourceConfig) -> Tracker:
    policy = RetryPolicy(config.retry_initial_delay_ms, config.retry_max_delay_ms,
                         config.max_retries)
    return Tracker(config.topology, policy, config.source_timeout_ms, config.max_pending)


def _starting_positions(config: SourceConfig, upstream, tps) -> dict:
    earliest, latest = upstream.earliest(tps), upstream.latest(tps)
    explicit = config.starting_map()
    if explicit is not None:
        out = {}
        for tp in tps:
            off = explicit.get(tp[0], {}).get(tp[1], -1)
            out[tp] = earliest[tp] if off == -2 else latest[tp] if off == -1 else off
        return out
    if config.starting_offsets == "earliest":
        return earliest
    if config.starting_offsets == "latest":
        return latest
    committed = upstream.committed(tps)  # "committed": the group's offset, else earliest
    return {tp: committed[tp][0] if tp in committed else earliest[tp] for tp in tps}


def _share(budget: int | None, lags: dict) -> dict:
    """Split ``budget`` offsets over partitions in proportion to their lag (as Spark's
    Kafka source does for maxOffsetsPerTrigger)."""
    total = sum(lags.values())
    if budget is None or total <= budget:
        return dict(lags)
    out = {tp: budget * lag // total for tp, lag in lags.items()}
    left = budget - sum(out.values())
    for tp in sorted(lags, key=lambda t: -lags[t]):
        if left <= 0:
            break
        if out[tp] < lags[tp]:
            out[tp] += 1
            left -= 1
    return out


class _Driver:
    """Driver-side state of one running query: tracking, upstream, channel, dead letters."""

    def __init__(self, config: SourceConfig, offset: dict):
        from ackstream.sinks.channel import open_channel

        self.config = config
        self.upstream = _upstream(config)
        self.tracker = _new_tracker(config)
        self.tracker.restore(offset["parts"], _now_ms())
        self.tracker.clock_on_commit = True
        self.channel = open_channel(config)
        self.position = offset.get("done", -1)
        self.letters = None
        self._dead_since_snapshot = False
        self._ticked_ms = 0
        self.committed: dict = {}
        if config.tracking:
            self._merge_group_commits()

    def _merge_group_commits(self) -> None:
        """Offsets the group's commit says are done (it may be newer than the offset log:
        acks and dead letters after the last batch was planned) are done here too."""
        tps = list(self.tracker.parts)
        for tp, (off, meta) in self.upstream.committed(tps).items():
            part = self.tracker.parts[tp]
            done = list(range(part.watermark, min(off, part.end)))
            try:
                spans = json.loads(meta).get("done", []) if meta else []
            except (ValueError, AttributeError):
                spans = []
            for a, b in spans:
                done += range(a, b)
            self.tracker.mark_done(tp, done)
            self.committed[tp] = (off, meta)

    def next_offset(self, now_ms: int, max_rows: int | None) -> dict | None:
        """Apply completions, then plan the next batch; None when there is nothing to read."""
        tracker = self.tracker
        # Spark plans a batch only after the previous one ran (and it calls commit() for
        # that one only when the next batch starts): everything planned so far has run.
        if self.config.tracking:
            tracker.started(now_ms)
            self.poll(now_ms)
        else:
            self._commit_positions()
        budget = tracker.budget(max_rows) if self.config.tracking else max_rows
        replays = tracker.due(now_ms, budget) if self.config.tracking else []
        if budget is not None:
            budget -= len(replays)
        tps = list(tracker.parts)
        positions = {tp: tracker.parts[tp].end for tp in tps}
        if self.config.upstream == "kafka":
            self._check_retention(tps)
            positions = {tp: tracker.parts[tp].end for tp in tps}
        latest = self.upstream.latest(tps, positions) if self.config.upstream == "generator" \
            else self.upstream.latest(tps)
        lags = {tp: max(0, latest[tp] - positions[tp]) for tp in tps}
        shares = _share(budget, lags)
        read: dict = {}
        for tp, n in shares.items():
            if n:
                if self.config.tracking:
                    tracker.emit_range(tp, positions[tp], positions[tp] + n, now_ms)
                else:
                    part = tracker.parts[tp]
                    part.end = part.watermark = positions[tp] + n
                read.setdefault(tp[0], {})[str(tp[1])] = [positions[tp], positions[tp] + n]
        if not replays and not read and not self._dead_since_snapshot:
            return None
        # a new offset persists the snapshot, dead letters written included: a restart
        # then does not write them again (see the report in the module doc)
        self._dead_since_snapshot = False
        offset = {"v": 1, "parts": tracker.snapshot(), "read": read,
                  "replays": [list(r) for r in replays], "done": self.position}
        if self.config.tracking:
            offset["source"] = self.config.topology  # the batch's roots are waited for
        return offset

    def _check_retention(self, tps) -> None:
        earliest = self.upstream.earliest(tps)
        for tp in tps:
            part = self.tracker.parts[tp]
            if earliest[tp] > part.end:
                if self.config.fail_on_data_loss:
                    raise AckstreamError(
                        f"{tp[0]}[{tp[1]}] offsets {part.end}..{earliest[tp] - 1} were deleted "
                        "by retention before they were read (data loss); set "
                        "failOnDataLoss=false to skip them")
                self.tracker.skip_to(tp, earliest[tp])

    def poll(self, now_ms: int) -> None:
        """Completions in, replays scheduled, dead letters out, acked offsets committed."""
        table, self.position = self.channel.completions_since(self.position)
        if table.num_rows:
            self.tracker.complete(table, now_ms)
        self.tracker.expire(now_ms)
        self._tick(now_ms)
        if self.tracker.dead:
            self._write_dead_letters()
        self._commit()

    def _tick(self, now_ms: int) -> None:
        """Wake the acker, at most once per its tick, while a root is past the message
        timeout: the acker runs only when records arrive, and such a root must time out
        there (see ``ackstream.acker.query``)."""
        timeout = self.config.message_timeout_ms
        if now_ms - self._ticked_ms >= default_tick_ms(timeout) and \
                self.tracker.overdue(now_ms - timeout):
            self.channel.write_acks(tick(now_ms))
            self._ticked_ms = now_ms

    def _write_dead_letters(self) -> None:
        letters = list(self.tracker.dead.values())
        if self.letters is None:
            from ackstream.sinks.dead_letters import KafkaDeadLetters, ParquetDeadLetters

            if self.config.dead_letter_topic:
                self.letters = KafkaDeadLetters(self.config.bootstrap_servers,
                                                self.config.dead_letter_topic,
                                                self.config.topology)
            else:
                self.letters = ParquetDeadLetters(self.config.dead_letter_dir,
                                                  self.config.topology)
        records = self.upstream.fetch([((lt.topic, lt.partition), lt.offset) for lt in letters])
        limit = self.config.max_value_bytes  # a rejected huge value stays upstream only
        records = {k: (key, None if value is not None and len(value) > limit else value, ts)
                   for k, (key, value, ts) in records.items()}
        self.letters.write(letters, records)
        self.tracker.dead_lettered(letters)
        self._dead_since_snapshot = True

    def _commit(self) -> None:
        """Commit each partition's watermark (and done offsets above it) if it moved."""
        changed = {}
        for tp, wm in self.tracker.watermarks().items():
            entry = (wm, self.tracker.commit_metadata(tp))
            if self.committed.get(tp) != entry:
                changed[tp] = entry
        if changed:
            self.upstream.commit(changed)
            self.committed.update(changed)

    def on_spark_commit(self, end: dict, now_ms: int) -> None:
        """Spark finished a batch. Tracking off: commit its end (Spark's at-least-once);
        tracking on: commits follow acks, so only take the chance to apply completions."""
        if self.config.tracking:
            self.tracker.started(now_ms)
            self.poll(now_ms)
        else:
            self._commit_positions({(t, int(p)): e["end"] for t, parts in end["parts"].items()
                                    for p, e in parts.items()})

    def _commit_positions(self, positions: dict | None = None) -> None:
        """Tracking off: commit the read positions of batches Spark has run. Called from
        latestOffset (before the next batch is planned, so the driver's positions are
        those of the batch that just ran) or with the end Spark committed."""
        if positions is None:
            positions = {tp: part.end for tp, part in self.tracker.parts.items()}
        changed = {}
        for tp, end in positions.items():
            if end > self.committed.get(tp, (-1, ""))[0]:  # never move backwards
                changed[tp] = (end, "")
        if changed:
            self.upstream.commit(changed)
            self.committed.update(changed)

    def close(self) -> None:
        self.upstream.close()
        if self.letters is not None:
            self.letters.close()
