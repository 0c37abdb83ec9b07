"""What machine a benchmark ran on: the figures every result records beside its numbers."""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path
from typing import Any


def host() -> dict[str, Any]:
    """Cores, CPU model and RAM (from /proc), Python and platform."""
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram_gib = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu,
        "ram_gib": ram_gib,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
