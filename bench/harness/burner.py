"""A CPU burner: one busy-loop process per core (``python -c``, a loop on
``time.monotonic()``; stress-ng is not installed here), started just before a measured step
and ended by its pid right after it; each process stops itself after ``BURNER_LIMIT_S`` in
any case. ``burning`` records how many cores the burner got (from /proc). Used by
``bench.false_verdicts`` and ``bench.streaming``: the "busy machine" half of their rollouts.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from bench.harness.procfs import cpu_seconds
from testkit.local_triton import end_process_group

BURNER_LIMIT_S = 180.0  # a burner process stops itself after this, whatever happens

BURNER_CODE = (
    "import sys, time\n"
    "end = time.monotonic() + float(sys.argv[1])\n"
    "while time.monotonic() < end:\n"
    "    pass\n"
)


@dataclass
class Burner:
    """One busy-loop process per core while on; each stops itself after ``limit_s``."""

    cores: int
    limit_s: float = BURNER_LIMIT_S
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    started: float = 0.0

    def start(self) -> None:
        self.started = time.monotonic()
        for _ in range(self.cores):
            self.processes.append(
                subprocess.Popen(
                    [sys.executable, "-c", BURNER_CODE, f"{self.limit_s:g}"],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )

    def stop(self) -> dict[str, float] | None:
        """End every process by its pid; how many cores they held on average."""
        if not self.processes:
            return None
        wall = time.monotonic() - self.started
        used = 0.0
        for process in self.processes:
            with contextlib.suppress(OSError):
                used += cpu_seconds(process.pid)[0]
        for process in self.processes:
            end_process_group(process, 2.0)
        self.processes = []
        return {"seconds": round(wall, 3), "cpu_seconds": round(used, 3),
                "cores": round(used / wall, 3) if wall > 0 else 0.0}  # fmt: skip


@contextlib.contextmanager
def burning(on: bool, use: dict[str, Any]) -> Iterator[None]:
    """The burner for the block when ``on``; what it held goes into ``use``."""
    if not on:
        yield
        return
    burner = Burner(os.cpu_count() or 1)
    try:
        burner.start()
        yield
    finally:
        held = burner.stop()
        if held:
            use.update(held)


def burner_plan(count: int, rng: random.Random) -> list[bool]:
    """Which of ``count`` rollouts run with the burner: half of them (the extra one of an
    odd count without), in an order ``rng`` shuffles."""
    flags = [False] * (count - count // 2) + [True] * (count // 2)
    rng.shuffle(flags)
    return flags
