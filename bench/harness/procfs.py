"""Processes as /proc sees them: children, memory (``VmRSS`` and the rest of
``/proc/PID/status``) and CPU time. Linux only, as the benchmarks are.

The scenarios sample the service, the tritonservers and their backend stubs with these.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """The process ids whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def status_kb(pid: int, key: str) -> int:
    """A field of ``/proc/PID/status`` in KB (``VmRSS``, ``VmHWM``, ``RssAnon``...; also
    counts such as ``Threads``); 0 when absent, OSError when the process is gone."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def rss_kb(pid: int) -> int:
    """VmRSS of ``pid`` in KB; 0 once it has gone."""
    with contextlib.suppress(OSError):
        return status_kb(pid, "VmRSS")
    return 0


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(utime+stime, cutime+cstime) of ``pid`` in seconds: itself, and its waited-for
    children. OSError when the process is gone."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state): utime, stime, cutime, cstime are fields 14 to 17.
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime) / CLK_TCK, (cutime + cstime) / CLK_TCK


def pin(pid: int, cpus: set[int], below: bool = True) -> int:
    """Keep ``pid``, every thread of it and (``below``) every process below it on ``cpus``
    (what ``taskset -a -p`` does, and down the tree: Triton's backend stubs are its
    children); threads and processes they start later inherit it. The tasks pinned."""
    pinned = 0
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(task.name), cpus)
                pinned += 1
    for child in children(pid) if below else ():
        pinned += pin(child, cpus)
    return pinned
