"""MkDocs hook: docstrings name code with Sphinx roles (``:class:`~a.B```), which
Markdown shows as the role's text before a code span; keep the code span only."""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:class|mod|func|meth|data|attr|exc|obj):(?=<code>)")
_TILDE = re.compile(r"<code>~(?:[\w]+\.)*(\w+)</code>")


def on_page_content(html, **kwargs):
    return _TILDE.sub(r"<code>\1</code>", _ROLE.sub("", html))
