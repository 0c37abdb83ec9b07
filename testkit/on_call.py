"""The on-call person, as tests and benchmarks play them: ``AbortAt`` gives the reconciler's
``abort`` command (a process of its own, as a person would) once Envoy's runtime has given
a pool a weight for a while, and records when."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from testkit.envoy import pool_weight


class AbortAt:
    """``triton-gitops abort MODEL`` against the state at ``state``, ``after`` seconds
    after Envoy's runtime (``admin_url``) first gives ``pool`` ``weight`` (of 10,000);
    ``given``: when it was given (monotonic), ``answer``: what the command said."""

    def __init__(
        self,
        admin_url: str,
        state: Path,
        model: str,
        pool: str = "canary",
        weight: int = 5_000,
        after: float = 1.5,
    ) -> None:
        self.admin_url, self.state, self.model = admin_url, state, model
        self.pool, self.weight, self.after = pool, weight, after
        self.given: float | None = None
        self.answer = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> AbortAt:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _watch(self) -> None:
        since: float | None = None
        while not self._stop.is_set() and self.given is None:
            if pool_weight(self.admin_url, self.pool) == self.weight:
                since = time.monotonic() if since is None else since
                if time.monotonic() - since >= self.after:
                    self.given = time.monotonic()
                    done = subprocess.run(
                        [sys.executable, "-m", "reconciler", "abort", self.model,
                         "--state", str(self.state), "--reason", "on call: switch back"],
                        capture_output=True, text=True, timeout=60, check=False,
                    )  # fmt: skip
                    self.answer = done.stdout + done.stderr
            time.sleep(0.05)
