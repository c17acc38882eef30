"""The processes of this machine from /proc: what the benchmarks measure CPU with."""

from __future__ import annotations

import glob
import os

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def process_table() -> dict[int, tuple[int, float, str]]:
    """Per process id: its parent's id, its user + system CPU seconds with those of the
    children it has waited for, and its command line (arguments joined by spaces)."""
    table = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        pid = int(stat.split("/")[2])
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        ticks = sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
        table[pid] = (int(fields[1]), ticks / _CLK_TCK, cmdline)  # fields[1]: the parent
    return table


def thread_cpu(pid: int, tid: int) -> float:
    """User + system CPU seconds of the thread ``tid`` of process ``pid``."""
    with open(f"/proc/{pid}/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:13]) / _CLK_TCK  # utime stime


def descendants(table: dict, root: int) -> set[int]:
    """``root`` and every process below it in ``table``."""
    mine, grew = {root}, True
    while grew:
        new = {pid for pid, (parent, *_) in table.items() if parent in mine} - mine
        mine |= new
        grew = bool(new)
    return mine & set(table)
