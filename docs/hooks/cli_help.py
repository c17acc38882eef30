"""MkDocs hook: the command-line reference shows each command's ``--help`` as the
installed ackstream prints it, so the page cannot drift from the parser."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from unittest import mock

MARK = "<!-- ackstream --help -->"
ROOT = str(Path(__file__).resolve().parents[2])


def _helps() -> list[tuple[str, str]]:
    from ackstream.cli.parser import COMMANDS, build_parser

    clean = {k: v for k, v in os.environ.items() if not k.startswith("ACKSTREAM_")}
    with mock.patch.dict(os.environ, {**clean, "COLUMNS": "90"}, clear=True):
        parser = build_parser(*COMMANDS)
        out = [("ackstream", parser.format_help())]
        stack = [("ackstream", parser)]
        while stack:
            prefix, current = stack.pop(0)
            for action in current._actions:  # noqa: SLF001 - argparse has no public walk
                if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
                    for name, sub in action.choices.items():
                        out.append((f"{prefix} {name}", sub.format_help()))
                        stack.append((f"{prefix} {name}", sub))
    return [(name, text.replace(ROOT, "<checkout>")) for name, text in out]


def on_page_markdown(markdown, page, **kwargs):
    if MARK not in markdown:
        return markdown
    blocks = "\n".join(f"## `{name}`\n\n```text\n{text.rstrip()}\n```\n" for name, text in _helps())
    return markdown.replace(MARK, blocks)
