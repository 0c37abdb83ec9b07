"""Where a reconcile pass spends its time, measured through the pass's own seams.

The pass reports its phases to ``ports.hooks`` (a ``PassHooks``: ``phase_started(phase)``,
``phase_ended(phase, seconds)``) and reaches Triton, Git and its state store only through the
port objects ``reconciler.wiring`` builds. ``Probe`` is a ``PassHooks`` that sums seconds (and
this process's CPU) per phase; ``Probe.timed(port, label)`` wraps any port object so that
each method call is timed too, under the phase it ran in (``"apply > triton load"``). Nothing
in the reconciler is replaced or patched: the benchmark hands these to the pass it runs.

Labels nest through one stack shared by all threads: right for the scenarios that use it
(one pass at a time; where the pass runs calls in a pool, a call is filed under the phase
that was running when it started).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Probe:
    """Seconds, CPU seconds and calls per label; a ``PassHooks`` for the pass's phases."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)  # this process, all threads
        self.calls: dict[str, int] = defaultdict(int)
        self._stack: list[str] = []
        self._cpu_started: dict[str, float] = {}
        self._lock = threading.Lock()

    def reset(self) -> None:
        with self._lock:
            self.seconds.clear()
            self.cpu.clear()
            self.calls.clear()

    def path(self, label: str) -> str:
        """``label`` under the phases running now: ``"outer > inner > label"``."""
        return " > ".join([*self._stack, label])

    def record(self, path: str, seconds: float, cpu: float = 0.0) -> None:
        with self._lock:
            self.seconds[path] += seconds
            self.cpu[path] += cpu
            self.calls[path] += 1

    # -- PassHooks -----------------------------------------------------------------------

    def phase_started(self, phase: str) -> None:
        path = self.path(phase)
        with self._lock:
            self.seconds.setdefault(path, 0.0)  # rows in the order the phases start
            self._cpu_started[path] = time.process_time()
        self._stack.append(phase)

    def phase_ended(self, phase: str, seconds: float) -> None:
        if self._stack and self._stack[-1] == phase:
            self._stack.pop()
        path = self.path(phase)
        cpu = time.process_time() - self._cpu_started.pop(path, time.process_time())
        self.record(path, seconds, cpu)

    # -- ports ---------------------------------------------------------------------------

    def timed(self, port: T, label: str, names: Mapping[str, str] | None = None) -> T:
        """``port`` with every method call timed, as ``"<label> <method>"`` or as
        ``names[method]``; the proxy passes everything else through unchanged."""
        return TimedPort(port, self, label, names or {})  # type: ignore[return-value]

    def time_call(self, label: str, call: Callable[[], T]) -> T:
        """``call()``, timed under ``label`` beneath the running phases."""
        path = self.path(label)
        with self._lock:
            self.seconds.setdefault(path, 0.0)
        started, cpu = time.perf_counter(), time.process_time()
        try:
            return call()
        finally:
            self.record(path, time.perf_counter() - started, time.process_time() - cpu)


class TimedPort(Generic[T]):
    """A port object whose method calls are timed by a ``Probe``."""

    def __init__(self, port: T, probe: Probe, label: str, names: Mapping[str, str]) -> None:
        self._port = port
        self._probe = probe
        self._label = label
        self._names = names

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._port, name)
        if not callable(value) or name.startswith("__"):
            return value
        label = self._names.get(name, f"{self._label} {name}")
        probe = self._probe

        def timed(*args: Any, **kwargs: Any) -> Any:
            return probe.time_call(label, lambda: value(*args, **kwargs))

        return timed

    # ``with port:`` looks these up on the type, not through __getattr__.
    def __enter__(self) -> TimedPort[T]:
        self._port.__enter__()  # type: ignore[attr-defined]
        return self

    def __exit__(self, *exc: object) -> Any:
        return self._port.__exit__(*exc)  # type: ignore[attr-defined]
