"""The on-call person, as tests and benchmarks play them: ``OnCallAbort`` gives the
reconciler's ``abort`` command (a process of its own, as a person would) once what a
watcher reads has held for a while, and records when; ``AbortAt`` is that watcher for a
pool's weight in Envoy's runtime."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from testkit.envoy import pool_weight


class OnCallAbort:
    """``triton-gitops abort MODEL`` against the state at ``state``, given once ``seen``
    was told the condition holds ``after`` seconds after it first did; ``given``: when
    (monotonic); ``end`` waits for the command and keeps its ``code`` and ``answer``."""

    def __init__(self, model: str, state: Path, after: float) -> None:
        self.model, self.state, self.after = model, state, after
        self.given: float | None = None
        self.code: int | None = None
        self.answer = ""
        self._since: float | None = None
        self._process: subprocess.Popen[str] | None = None

    def seen(self, holds: bool) -> None:
        """One reading of the watcher: whether the condition holds now."""
        if self._process is not None or not holds:
            return
        now = time.monotonic()
        self._since = now if self._since is None else self._since
        if now - self._since >= self.after:
            self.given = now
            self._process = subprocess.Popen(
                [sys.executable, "-m", "reconciler", "abort", self.model,
                 "--state", str(self.state), "--reason", "on call: switch back"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip

    def end(self) -> None:
        if self._process is not None and self.code is None:
            self.answer, _ = self._process.communicate(timeout=60)
            self.code = self._process.returncode


class AbortAt(OnCallAbort):
    """The abort of ``model``, ``after`` seconds after Envoy's runtime (``admin_url``)
    first gives ``pool`` ``weight`` (of 10,000), read every 50 ms."""

    def __init__(
        self,
        admin_url: str,
        state: Path,
        model: str,
        pool: str = "canary",
        weight: int = 5_000,
        after: float = 1.5,
    ) -> None:
        super().__init__(model, state, after)
        self.admin_url, self.pool, self.weight = admin_url, pool, weight
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> AbortAt:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        self.end()

    def _watch(self) -> None:
        while not self._stop.is_set() and self.given is None:
            self.seen(pool_weight(self.admin_url, self.pool) == self.weight)
            time.sleep(0.05)
