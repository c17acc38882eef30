"""When a window closes: by a count of tuples per key, or by time.

A :class:`~ackstream.topology.window.WindowStage` holds tuples across micro-batches;
its :class:`Closing` says, each batch, which windows close and which tuples stay held:

- :class:`CountClosing` is Storm's tumbling count window (``Count.of(k)``): every k
  tuples of a key, in arrival order, make one window (within a batch, the order of
  the tuples' coordinates, then of their ids: a batch run again fills the same
  windows).
- :class:`SlidingCountClosing` is Storm's sliding count window (``Count.of(k)``
  sliding by ``Count.of(m)``): every m tuples of a key, a window of its last k (the
  first windows of a key hold fewer, as Storm's do). Each held tuple keeps its place
  among its key's tuples, so that a later batch knows which windows have emitted.
- :class:`TimeClosing` is Storm's ``withWindow(Duration, Duration)`` and Spark's
  ``window(time, duration, slide)``: a tuple is in every window ``[start, start +
  duration)`` that holds its time, with ``start`` a multiple of ``slide`` (a
  tumbling window when ``slide == duration``). The time is the batch's (processing
  time) or a column's (event time). A window closes when the stage's clock passes
  its end: the batch's time, or for event time the watermark, the largest time seen
  minus ``delay``. A tuple is held until the last window that holds it closes.
  An event-time tuple whose windows have all closed already is late: it is rejected
  (dead-lettered with a reason naming the stage and the watermark), not dropped.

A batch runs only when the source has something to plan; a topology with a
processing-time window asks its source for a batch every ``slide`` while roots are
in flight (``ackstream.idleBatchInterval``), so a window closes on time even when no
new record arrives. The clock a closing reached is saved with the held tuples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import NumericType

from ackstream.config.source import parse_duration_ms
from ackstream.errors import OptionError, StageError
from ackstream.topology.held_store import HOLD
from ackstream.topology.modes import Mode
from ackstream.vocabulary.lineage import REASON

__all__ = [
    "Assigned",
    "Closed",
    "Closing",
    "CountClosing",
    "SlidingCountClosing",
    "TimeClosing",
    "WINDOW",
    "positive_ms",
    "window_closing",
]

#: The column a time window's output rows carry: ``struct<start, end>`` timestamps,
#: as Spark's ``window()`` gives.
WINDOW = "window"
# a held tuple's time (ms) in a time window; the batch it came in (a count window)
TIME, SINCE = "_time", "_since"
#: a batch's tuples arrive in the order of their coordinates when they have them
#: (a re-run puts them in the same windows), then of their ids
_ARRIVAL = ("topic", "partition", "offset")
_COUNT, _RANK, _ORDINAL = "_count", "_rank", "_window"
#: a held tuple's place among its key's tuples, from 1 (a sliding count window); the
#: key's last place held before the batch, and its last place after it
_SEQ, _BEFORE, _LAST = "_seq", "_before", "_last"
_NO_CLOCK = -(2**63)
#: a batch's rows spread over more slides than this: their windows are read, not listed
_SPREAD = 1000


@dataclass(frozen=True)
class Closed:
    """What closes in one batch. ``windows``: a row per (tuple, window that closed),
    carrying ``group_columns`` beside the tuple's columns, ``window_id`` telling the
    windows of a key apart; ``released``: the tuples no window holds any more;
    ``kept``: the tuples still held; ``late``: tuples refused, with ``_reason``;
    ``clock``: what the closing saves for the next batch; ``hidden``: group columns
    the output rows do not show; ``cached``: frames persisted for the batch."""

    windows: DataFrame
    group_columns: list[str]
    window_id: Column
    released: DataFrame
    kept: DataFrame
    late: DataFrame | None = None
    clock: int | None = None
    hidden: list[str] = field(default_factory=list)
    cached: tuple[DataFrame, ...] = ()


@dataclass(frozen=True)
class Assigned:
    """A batch's rows in their windows: ``rows`` has a row per (row, open window that
    holds it) with ``window``; ``late`` the rows refused (with ``_reason``; None: none);
    ``clock`` the clock after the batch (None: none yet); ``closes`` true on a
    ``window`` that has closed by ``clock``; ``ends`` the ends (ms) of the open windows
    the batch's rows may have gone into (a few more when their times spread: a hold
    token waits for each, see :mod:`ackstream.topology.hold_tokens`)."""

    rows: DataFrame
    late: DataFrame | None
    clock: int | None
    closes: Column
    ends: list[int] = field(default_factory=list)


class Closing(Protocol):
    """A window's closing rule (see the module doc)."""

    #: how often the source should run a batch with no new records while roots are in
    #: flight, so this window closes on time (None: it closes only on new tuples)
    idle_batch_ms: int | None
    #: whether :meth:`assign` places rows in windows, so the window may hold partial
    #: aggregates (a count window closes by its rows, so it holds them)
    holds_partials: bool

    def check(self, stage: str, message_timeout_ms: int, mode: Mode) -> None:
        """Refuse a window that cannot close before its tracked tuples' roots time out."""

    def stamp(self, new: DataFrame, now_ms: int, stage: str) -> DataFrame:
        """``new`` (this batch's input tuples) with the columns this rule keeps."""

    def close(
        self, rows: DataFrame, keys: list[str | Column], clock: int | None, now_ms: int, stage: str
    ) -> Closed:
        """Which windows ``rows`` (held and new tuples) close, given the clock saved by
        the batch before (None: none yet) and the batch's time."""

    def assign(
        self, rows: DataFrame, clock: int | None, now_ms: int, stage: str
    ) -> Assigned | None:
        """``rows`` (stamped, of one batch) in the windows still open that hold them,
        for a window that holds partial aggregates; None when this rule closes by
        the rows themselves (a count window), which then holds rows."""


class CountClosing:
    """Per key, a window of every ``count`` tuples in arrival order."""

    idle_batch_ms: int | None = None
    holds_partials = False

    def __init__(self, count: int):
        self.count = count

    def check(self, stage: str, message_timeout_ms: int, mode: Mode) -> None:
        return None

    def stamp(self, new: DataFrame, now_ms: int, stage: str) -> DataFrame:
        return new

    def assign(
        self, rows: DataFrame, clock: int | None, now_ms: int, stage: str
    ) -> Assigned | None:
        return None

    def close(
        self, rows: DataFrame, keys: list[str | Column], clock: int | None, now_ms: int, stage: str
    ) -> Closed:
        by_key = Window.partitionBy(*keys)
        order = [SINCE, *(c for c in _ARRIVAL if c in rows.columns), HOLD]
        ranked = (
            rows.withColumn(_COUNT, F.count(F.lit(1)).over(by_key))
            .withColumn(_RANK, F.row_number().over(by_key.orderBy(*order)))
            .persist()  # arrival order is fixed once: kept and released must agree
        )
        filled = F.col(_RANK) <= F.col(_COUNT) - F.col(_COUNT) % self.count
        released = ranked.where(filled).withColumn(
            _ORDINAL, F.expr(f"({_RANK} - 1) div {self.count}")
        )
        return Closed(
            windows=released,
            group_columns=[_ORDINAL],
            window_id=F.col(_ORDINAL),
            released=released,
            kept=ranked.where(~filled).drop(_COUNT, _RANK),
            hidden=[_ORDINAL],
            cached=(ranked,),
        )


class SlidingCountClosing(CountClosing):
    """Per key, a window of the last ``count`` tuples every ``slide`` tuples, in arrival
    order (``slide`` < ``count``; see the module doc)."""

    def __init__(self, count: int, slide: int):
        super().__init__(count)
        self.slide = slide

    def stamp(self, new: DataFrame, now_ms: int, stage: str) -> DataFrame:
        return new.withColumn(_SEQ, F.lit(None).cast("long"))  # placed in close()

    def close(
        self, rows: DataFrame, keys: list[str | Column], clock: int | None, now_ms: int, stage: str
    ) -> Closed:
        """The batch's tuples take the places after their key's held ones; the windows
        of the places ``slide`` divides, past the last one emitted before, emit; a
        tuple no later window can hold is released."""
        count, slide = F.lit(self.count).cast("long"), F.lit(self.slide).cast("long")
        by_key = Window.partitionBy(*keys)
        held = F.count(_SEQ).over(by_key)
        last_held = F.coalesce(F.max(_SEQ).over(by_key), F.lit(0).cast("long"))
        arrival = [c for c in (SINCE, *_ARRIVAL, HOLD) if c in rows.columns]
        place = F.row_number().over(by_key.orderBy(F.col(_SEQ).asc_nulls_last(), *arrival))
        seq = F.col(_SEQ)
        placed = (
            rows.withColumn(_RANK, last_held - held + place)  # a held tuple keeps its place
            .withColumn(_LAST, last_held + F.count(F.lit(1)).over(by_key) - held)
            .withColumn(_BEFORE, last_held)
            .withColumn(_SEQ, F.coalesce(seq, F.col(_RANK)))
            .persist()  # arrival order is fixed once: kept, released and windows must agree
        )
        # a window is named by its last place, a multiple of slide
        emitted = F.col(_BEFORE) - F.col(_BEFORE) % slide  # the last one before the batch
        last = F.col(_LAST) - F.col(_LAST) % slide  # the last one now
        first_window = F.greatest(seq, emitted + 1)
        first_window = first_window + F.pmod(-first_window, slide)
        last_window = F.least(seq + count - 1, last)
        last_window = last_window - last_window % slide
        windows = placed.where(first_window <= last_window).withColumn(
            _ORDINAL, F.explode(F.sequence(first_window, last_window, slide))
        )
        needed = seq > last + slide - count  # a later window holds it
        helpers = (_RANK, _LAST, _BEFORE)
        return Closed(
            windows=windows.drop(*helpers),
            group_columns=[_ORDINAL],
            window_id=F.col(_ORDINAL),
            released=placed.where(~needed).drop(*helpers),
            kept=placed.where(needed).drop(*helpers),
            hidden=[_ORDINAL],
            cached=(placed,),
        )


class TimeClosing:
    """Windows of ``duration_ms`` starting every ``slide_ms``, by the batch's time
    (``time`` None) or by the column ``time`` (event time: a timestamp, or a number
    of epoch milliseconds) with a watermark ``delay_ms`` behind the largest seen."""

    def __init__(
        self, duration_ms: int, slide_ms: int, time: str | Column | None = None, delay_ms: int = 0
    ):
        self.duration_ms, self.slide_ms = duration_ms, slide_ms
        self.time, self.delay_ms = time, delay_ms
        self.idle_batch_ms = slide_ms if time is None else None
        self.holds_partials = True

    def check(self, stage: str, message_timeout_ms: int, mode: Mode) -> None:
        if self.slide_ms > self.duration_ms:
            raise StageError(
                stage,
                f"slide {self.slide_ms} ms is longer than the window ({self.duration_ms} ms): "
                "give a slide no longer than the duration",
            )
        # Storm's rule, for windows on processing and on event time alike: an event-time
        # window holds its tuples at least as long, plus the watermark's delay
        held = self.duration_ms + self.slide_ms + self.delay_ms
        if mode.holding_keeps_trees_open and held > message_timeout_ms:
            what = "the window plus its slide" + (" and delay" if self.delay_ms else "")
            raise StageError(
                stage,
                f"a tuple may be held for {what} ({held} ms), longer "
                f"than the message timeout ({message_timeout_ms} ms): its root would time "
                "out first; shorten the window or raise message_timeout_ms",
            )

    def stamp(self, new: DataFrame, now_ms: int, stage: str) -> DataFrame:
        if WINDOW in new.columns:
            raise StageError(stage, f"the input has a column {WINDOW!r}, which a time window adds")
        if self.time is None:
            return new.withColumn(TIME, F.lit(now_ms).cast("long"))
        column = F.col(self.time) if isinstance(self.time, str) else self.time
        kind = new.select(column).schema.fields[0].dataType
        if isinstance(kind, NumericType):
            return new.withColumn(TIME, column.cast("long"))
        if kind.typeName() not in ("timestamp", "timestamp_ntz", "date"):
            raise StageError(
                stage, f"time={self.time!r} is a {kind.simpleString()}: give a timestamp or ms"
            )
        return new.withColumn(TIME, F.unix_millis(column.cast("timestamp")))

    def assign(
        self, rows: DataFrame, clock: int | None, now_ms: int, stage: str
    ) -> Assigned | None:
        """The batch's rows (stamped with the batch's time ``now``, or their own) in each
        window not closed before it (``clock``); an event-time row whose windows all
        closed is late."""
        before = _NO_CLOCK if clock is None else clock
        rows, late, after, times = self._advance(rows, clock, now_ms, stage)
        windowed = rows.withColumn(WINDOW, self._span()).where(self._end() > F.lit(before))
        if times is None:
            ends = []
        elif (times[1] - times[0]) // self.slide_ms < _SPREAD:
            ends = self._ends_holding(*times, before)
        else:  # times far apart: the windows the rows went into, exactly
            ends = sorted(r[0] for r in windowed.select(self._end()).distinct().collect())
        return Assigned(
            windowed, late, None if after == _NO_CLOCK else after, self._end() <= F.lit(after), ends
        )

    def _ends_holding(self, first: int, last: int, before: int) -> list[int]:
        """The ends of the windows that hold a time in ``[first, last]`` and end after
        ``before``."""
        start = ((first - self.duration_ms) // self.slide_ms + 1) * self.slide_ms
        ends = (s + self.duration_ms for s in range(start, last + 1, self.slide_ms))
        return [end for end in ends if end > before]

    def _advance(
        self, rows: DataFrame, clock: int | None, now_ms: int, stage: str
    ) -> tuple[DataFrame, DataFrame | None, int, tuple[int, int] | None]:
        """``rows`` less the late ones, the late ones with their reason (event time: a
        tuple whose windows all closed before it came), the clock after the batch, and
        the first and last time of the rows kept (None: none)."""
        before = _NO_CLOCK if clock is None else clock
        if self.time is None:
            return rows, None, max(before, now_ms), (now_ms, now_ms)
        late = None
        if clock is not None:
            reason = F.format_string(
                f"late for window stage {stage}: time %d ms is behind the watermark {before} ms",
                F.col(TIME),
            )
            is_late = self._last_end() <= F.lit(before)
            late = rows.where(is_late).withColumn(REASON, reason)
            rows = rows.where(~is_late)
        oldest, newest = rows.agg(F.min(TIME), F.max(TIME)).collect()[0]
        after = before if newest is None else max(before, int(newest) - self.delay_ms)
        return rows, late, after, None if newest is None else (int(oldest), int(newest))

    def _span(self) -> Column:
        return F.window(
            F.timestamp_millis(F.col(TIME)),
            f"{self.duration_ms} milliseconds",
            f"{self.slide_ms} milliseconds",
        )

    @staticmethod
    def _end() -> Column:
        return F.unix_millis(F.col(f"{WINDOW}.end"))

    def _last_end(self) -> Column:
        """The end of the last window that holds a tuple's time."""
        time = F.col(TIME)
        return time - F.pmod(time, F.lit(self.slide_ms)) + F.lit(self.duration_ms)

    def close(
        self, rows: DataFrame, keys: list[str | Column], clock: int | None, now_ms: int, stage: str
    ) -> Closed:
        before = _NO_CLOCK if clock is None else clock
        cached = rows.persist()  # read by several jobs: computed once
        rows, late, after, _ = self._advance(cached, clock, now_ms, stage)
        span = F.window(
            F.timestamp_millis(F.col(TIME)),
            f"{self.duration_ms} milliseconds",
            f"{self.slide_ms} milliseconds",
        )
        end = F.unix_millis(F.col(f"{WINDOW}.end"))
        windows = (
            rows.withColumn(WINDOW, span).where(
                (end > F.lit(before)) & (end <= F.lit(after))
            )  # open before, closed now
        )
        done = self._last_end() <= F.lit(after)
        return Closed(
            windows=windows,
            group_columns=[WINDOW],
            window_id=F.unix_millis(F.col(f"{WINDOW}.start")),
            released=rows.where(done),
            kept=rows.where(~done),
            late=late,
            clock=None if after == _NO_CLOCK else after,
            cached=(cached,),
        )


def window_closing(
    stage: str,
    count: int | None,
    duration: int | str | None,
    slide: int | str | None,
    time: str | Column | None,
    delay: int | str,
) -> Closing:
    """The closing ``Topology.window`` asks for: ``count`` or ``duration`` (with
    ``slide``, ``time`` and ``delay``), checked."""
    if (count is None) == (duration is None):
        raise StageError(stage, "give a window either count= (tuples) or duration= (time)")
    if count is not None:
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise StageError(stage, f"count={count!r}: give a whole number of tuples >= 1")
        if time is not None or delay:
            raise StageError(stage, "time= and delay= go with duration=, not count=")
        if slide is None:
            return CountClosing(count)
        if isinstance(slide, bool) or not isinstance(slide, int) or not 1 <= slide <= count:
            raise StageError(
                stage,
                f"slide={slide!r}: a count window slides by a whole number of tuples from 1 "
                f"to count={count}",
            )
        return CountClosing(count) if slide == count else SlidingCountClosing(count, slide)
    duration_ms = positive_ms(stage, "duration", duration)
    slide_ms = duration_ms if slide is None else positive_ms(stage, "slide", slide)
    delay_ms = 0 if not delay else positive_ms(stage, "delay", delay)
    if time is None and delay_ms:
        raise StageError(stage, "delay= is the watermark of an event-time window: give time=")
    return TimeClosing(duration_ms, slide_ms, time, delay_ms)


def positive_ms(stage: str, name: str, value: object) -> int:
    """``value`` (ms, or a duration such as ``"10s"``) as a positive number of ms, or a
    :class:`StageError` of ``stage`` naming the argument ``name``."""
    try:
        ms = parse_duration_ms(name, value)
    except OptionError as e:
        raise StageError(stage, f"{name}={value!r}: expected {e.allowed}") from None
    if ms <= 0:
        raise StageError(stage, f"{name}={value!r}: give a positive duration")
    return ms
