"""docs/reference/options.md and the parser in ackstream/config/source.py say the same: every
option the parser knows is on the page and every option on the page is known, the
refused ones are listed as refused, and the defaults the page gives are the parser's."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

from ackstream.config.source import option_names, parse, parse_duration_ms

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "options.md"
KAFKA = {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "t"}
GENERATOR = {"ackstream.upstream": "generator"}

#: option -> (the options parsed for it, the parsed default as the page writes it)
DEFAULTS = {
    "startingOffsets": (KAFKA, lambda c: c.kafka.starting_offsets),
    "startingOffsetsByTimestampStrategy": (KAFKA, lambda c: c.kafka.starting_timestamp_strategy),
    "includeHeaders": (KAFKA, lambda c: str(c.kafka.include_headers).lower()),
    "failOnDataLoss": (KAFKA, lambda c: str(c.kafka.fail_on_data_loss).lower()),
    "ackstream.topology": (KAFKA, lambda c: c.topology),
    "ackstream.upstream": (KAFKA, lambda c: c.upstream),
    "ackstream.tracking": (KAFKA, lambda c: str(c.tracking).lower()),
    "ackstream.channelShared": (KAFKA, lambda c: str(c.channel_shared).lower()),
    "ackstream.messageTimeout": (KAFKA, lambda c: c.message_timeout_ms),
    "ackstream.retryInitialDelay": (KAFKA, lambda c: c.retry.initial_delay_ms),
    "ackstream.retryMaxDelay": (KAFKA, lambda c: c.retry.max_delay_ms),
    "ackstream.maxRetries": (KAFKA, lambda c: c.retry.max_retries),
    "ackstream.maxValueBytes": (KAFKA, lambda c: c.admission.max_value_bytes),
    "ackstream.generator.rate": (GENERATOR, lambda c: c.generator.rate),
    "ackstream.generator.partitions": (GENERATOR, lambda c: c.generator.partitions),
}


def table_rows(text: str) -> dict[str, list[str]]:
    """The rows of the page's tables whose first cell is a code span: name -> cells."""
    rows = {}
    for line in text.splitlines():
        match = re.match(r"\| `([^`]+)` \|(.*)\|\s*$", line)
        if match:
            rows[match.group(1)] = [cell.strip() for cell in match.group(2).split("|")]
    return rows


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    following = text.find("\n## ", start + len(heading))
    return text[start : following if following >= 0 else None]


@pytest.fixture(scope="module")
def page() -> str:
    return PAGE.read_text()


def test_every_option_the_parser_knows_is_on_the_page_and_no_other(page):
    on_page = set(table_rows(page))
    known = set(option_names()["ackstream"]) | set(option_names()["spark"])
    assert known - on_page == set(), "options the page does not list"
    extra = {name for name in on_page - known if not name.startswith("kafka.")}
    assert extra == set(), "options on the page that the parser does not take"


def test_the_refused_options_are_listed_as_refused(page):
    """Each bullet of the section names refused options before its colon."""
    refused = section(page, "## Options of Spark's Kafka source that ackstream refuses")
    items = re.findall(r"^- (.+?):", refused, flags=re.MULTILINE | re.DOTALL)
    listed = {name for item in items for name in re.findall(r"`([^`]+)`", item)}
    assert listed == set(option_names()["refused"])


@pytest.mark.parametrize("option", sorted(DEFAULTS))
def test_the_default_on_the_page_is_the_parsers(page, option):
    cells = table_rows(page)[option]
    written = re.fullmatch(r"`([^`]+)`", cells[0])
    assert written, f"{option}: the default cell {cells[0]!r} is not one code span"
    options, read = DEFAULTS[option]
    default = read(parse(options))
    if isinstance(default, int) and option.endswith(("Timeout", "Delay")):
        assert parse_duration_ms(option, written.group(1)) == default
    elif isinstance(default, int | float):
        assert float(written.group(1)) == default
    else:
        assert written.group(1) == default


def test_the_page_tables_are_the_ones_the_option_table_makes(page):
    """The tables are made from ackstream.config.source.OPTIONS (docs/hooks/options_page.py):
    a row changed in one and not the other fails here; `make options-page` rewrites."""
    hook = runpy.run_path(str(PAGE.parents[1] / "hooks" / "options_page.py"))
    assert page.count("<!-- options: ") == 3
    assert hook["render"](page) == page, "the options page is stale: run make options-page"
