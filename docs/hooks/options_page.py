"""The tables of the options page, made from the table of options in
``ackstream.config.source``, so the page and the parser cannot disagree.

Between ``<!-- options: NAME -->`` and ``<!-- /options -->`` the page holds what
:func:`render` makes: the ``kafka`` table (Spark's Kafka source's options), the
``ackstream`` table (ackstream's own) and the ``refused`` list. Run as a script
(``make options-page``) it rewrites ``docs/reference/options.md``; as an MkDocs hook it
renders the tables again at build time; ``tests/test_docs_options.py`` fails when the
committed page is not what the table makes."""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "reference" / "options.md"
_MARKED = re.compile(r"(<!-- options: (\w+) -->\n\n)(.*?)(\n\n<!-- /options -->)", re.DOTALL)


def section(name: str) -> str:
    """The Markdown between the marks named ``name``."""
    from ackstream.config.source import DEFAULTS, OPTIONS, REFUSED

    if name == "refused":
        items = (f"- {', '.join(f'`{n}`' for n in names)}: {why}" for names, why in REFUSED)
        return ";\n".join(items) + "."
    spark = name == "kafka"
    rows = [o.page_row(DEFAULTS) for o in OPTIONS if (o.spark is not None) == spark]
    head = ["option", "default", "meaning", *(["against Spark's Kafka source"] if spark else [])]
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *rows])


def render(markdown: str) -> str:
    """``markdown`` with every marked section made again from the table."""
    return _MARKED.sub(lambda m: m.group(1) + section(m.group(2)) + m.group(4), markdown)


def on_page_markdown(markdown, page, **kwargs):
    return render(markdown) if page.file.src_uri == "reference/options.md" else markdown


if __name__ == "__main__":
    text = PAGE.read_text()
    PAGE.write_text(render(text))
