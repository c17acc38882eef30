"""How a source option is declared, and how its text becomes a value.

An :class:`Option` is one row of the table of options in :mod:`ackstream.config.source`:
the name users write, the config field it sets, how its text is read (a
:class:`Reader`, whose type is the field's), its default, a check against the
options read before it, and one line of docs. The parser, the did-you-mean
suggestions for unknown names and the rows of the options page are all made from
that table, so an option is declared once.

>>> DURATION.read("ackstream.messageTimeout", "2 min")
120000
>>> FLAG.read("ackstream.tracking", " FALSE ")
False
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Generic, TypeVar, get_args

from ackstream.errors import OptionError

__all__ = [
    "DURATION",
    "FIELD",
    "FLAG",
    "TEXT",
    "NAME",
    "NotAllowed",
    "Only",
    "Option",
    "Reader",
    "Seen",
    "choice",
    "did_you_mean",
    "parse_duration_ms",
    "whole",
]

T = TypeVar("T")


class NotAllowed(ValueError):
    """Raised by a reader whose refusal says more than its ``allowed`` text."""


@dataclass(frozen=True)
class Reader(Generic[T]):
    """How an option's text becomes a value of type ``type``. ``convert`` raises
    ValueError (or TypeError, AttributeError) on text it does not take, and then the
    error says ``allowed``; :class:`NotAllowed` says its own message instead.
    ``blank`` readers take empty text as not given (names and paths)."""

    type: Any
    allowed: str
    convert: Callable[[str], T]
    show: Callable[[T], str] = str  #: the value as the options page writes it
    blank: bool = False

    def read(self, option: str, text: str) -> T:
        """The value of ``text`` given for ``option``, or an OptionError naming both."""
        try:
            return self.convert(text)
        except NotAllowed as refused:
            raise OptionError(option, text, str(refused)) from None
        except (ValueError, TypeError, AttributeError):
            raise OptionError(option, text, self.allowed) from None


_UNITS_MS = {
    **dict.fromkeys(("ms",), 1),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1000),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60_000),
    **dict.fromkeys(("h", "hour", "hours"), 3_600_000),
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$")


def _ms(text: str) -> int:
    match = _DURATION.match(str(text).lower())
    if not match or match.group(2) not in ("", *_UNITS_MS):
        raise ValueError(text)
    ms = float(match.group(1)) * _UNITS_MS.get(match.group(2), 1)
    if ms != int(ms):
        raise NotAllowed(DURATION.allowed + " (whole milliseconds)")
    return int(ms)


def _show_ms(ms: int) -> str:
    return f"{ms // 1000}s" if ms and ms % 1000 == 0 else f"{ms}ms"


#: a duration in milliseconds: ``"500ms"``, ``"30s"``, ``"2 min"`` or plain milliseconds
DURATION = Reader(
    int, 'a duration such as "500ms", "30s", "2 min" or plain milliseconds', _ms, _show_ms
)


def parse_duration_ms(option: str, value: object) -> int:
    """``"30s"``, ``"500ms"``, ``"2 min"`` or ``"1500"`` (ms) -> milliseconds."""
    return DURATION.read(option, str(value))


def _flag(text: str) -> bool:
    if text.strip().lower() not in ("true", "false"):
        raise ValueError(text)
    return text.strip().lower() == "true"


#: ``true`` or ``false``, any case
FLAG = Reader(bool, '"true" or "false"', _flag, lambda value: str(value).lower())
#: text taken as written
TEXT: Reader[str] = Reader(str, "text", str)
#: a name or a path: as written, empty text is not given
NAME: Reader[str] = Reader(str, "a name", str, blank=True)


def whole(minimum: int) -> Reader[int]:
    """A whole number of at least ``minimum``."""

    def convert(text: str) -> int:
        if (number := int(text.strip())) < minimum:
            raise ValueError(text)
        return number

    return Reader(int, f"a whole number >= {minimum}", convert)


def choice(choices: Any, allowed: str | None = None, blank: bool = False) -> Reader[Any]:
    """One of a ``Literal``'s values, any case, spaces around it ignored (and empty
    text as not given, when ``blank``)."""
    names = get_args(choices)

    def convert(text: str) -> str:
        if (value := text.strip().lower()) not in names:
            raise ValueError(text)
        return value

    allowed = allowed or " or ".join(f'"{name}"' for name in names)
    return Reader(choices, allowed, convert, blank=blank)


class _Default(Enum):
    FIELD = "the config field's own default"


#: The default of an option that is its config field's own default.
FIELD = _Default.FIELD


@dataclass
class Seen:
    """What an option's default and check may look at: every option's text as given
    (names lower-cased), the values of the options read before it (by field) and the
    config fields' own defaults."""

    given: Mapping[str, str]
    defaults: Mapping[str, Any]
    values: MutableMapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, field_name: str) -> Any:
        return self.values[field_name]

    def gave(self, name: str) -> bool:
        return name.lower() in self.given


@dataclass(frozen=True)
class Only:
    """An option read only while the field ``field`` read before it is ``value``.
    Otherwise its field is ``otherwise`` and a value given for it is ignored, or
    refused saying ``refused`` when that is set."""

    field: str
    value: Any
    refused: str | None = None
    otherwise: Any = FIELD


@dataclass(frozen=True)
class Option(Generic[T]):
    """One option: read from its text, else its default; then checked."""

    name: str  #: as users write it (Spark compares names case-insensitively)
    field: str  #: the config field it sets: ``group.field`` inside a group
    reader: Reader[T]
    doc: str  #: one line for the options page
    #: the value when not given: a value, :data:`FIELD`, or a function of :class:`Seen`
    default: Any = FIELD
    #: what is allowed, when the value is refused given the options read before it
    check: Callable[[T, Seen], str | None] | None = None
    only: Only | None = None
    #: what is allowed, when giving this option at all is refused given the others
    conflicts: Callable[[Seen], str | None] | None = None
    shown_default: str | None = None  #: the default as the page writes it, when not a value
    spark: str | None = None  #: an option of Spark's Kafka source: how ackstream's compares
    #: what two values are compared by, when not the values themselves (two spellings
    #: of one path)
    key: Callable[[T], Any] | None = None

    def value(self, seen: Seen) -> T:
        """This option's value; an OptionError naming it and its text when refused."""
        text = seen.given.get(self.name.lower())
        if text is not None and not text and self.reader.blank:
            text = None
        if self.only is not None and seen[self.only.field] != self.only.value:
            if text is not None and self.only.refused is not None:
                raise OptionError(self.name, text, self.only.refused)
            return self._default(self.only.otherwise, seen)
        if text is not None and self.conflicts is not None and (problem := self.conflicts(seen)):
            raise OptionError(self.name, text, problem)
        value = (
            self._default(self.default, seen) if text is None else self.reader.read(self.name, text)
        )
        problem = self.check(value, seen) if self.check is not None else None
        if problem:
            raise OptionError(self.name, text, problem)
        return value

    def same(self, given: object, wanted: object) -> bool:
        """Whether ``given`` and ``wanted`` (texts, or values written as their text) say
        the same value of this option once read; text it does not take says none.

        >>> Option("ackstream.messageTimeout", "t", DURATION, "").same("30s", 30_000)
        True
        """
        try:
            values = [self.reader.read(self.name, str(v)) for v in (given, wanted)]
        except OptionError:
            return False
        if self.key is not None:
            values = [self.key(v) for v in values]
        return values[0] == values[1]

    def _default(self, default: Any, seen: Seen) -> T:
        if default is FIELD:
            value: T = seen.defaults[self.field]
        else:
            value = default(seen) if callable(default) else default
        return value

    def page_row(self, defaults: Mapping[str, Any]) -> str:
        """This option's row in the options page's table."""
        default = self.default if self.default is not FIELD else defaults[self.field]
        if self.shown_default is not None:
            shown = self.shown_default
        else:
            shown = "" if default is None else f"`{self.reader.show(default)}`"
        cells = [f"`{self.name}`", shown, self.doc, *([self.spark] if self.spark else [])]
        return "| " + " | ".join(cells) + " |"


def did_you_mean(given: str, known: list[str]) -> str:
    """What to tell a user who gave an unknown option: the nearest known name, or all."""
    names = {name.lower(): name for name in known}
    near = difflib.get_close_matches(given.lower(), list(names), n=1, cutoff=0.6)
    if near:
        return f"a known option: did you mean {names[near[0]]!r}?"
    return f"a known option: one of {', '.join(sorted(known))}, or kafka.*"
