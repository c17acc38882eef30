"""Files that readers see whole or not at all.

Spark's file stream, the source and ``ackstream status`` list folders that other
processes write to. A writer writes under a hidden name (a leading dot, which
they all skip) in the same folder, then renames or links it into place, which is
atomic on one file system.
"""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["hidden_path", "write_atomically"]


def hidden_path(path: str) -> str:
    """The hidden name beside ``path`` that a writer fills before publishing it."""
    head, tail = os.path.split(path)
    return os.path.join(head, "." + tail)


def write_atomically(path: str, write: Callable[[str], object]) -> None:
    """Call ``write(hidden)`` to fill a hidden file, then rename it to ``path``
    (replacing a file of that name): a reader sees the old file or the new one."""
    hidden = hidden_path(path)
    write(hidden)
    os.replace(hidden, path)
