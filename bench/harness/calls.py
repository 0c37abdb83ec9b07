"""Every call a pass makes to Triton and to its metrics source, with when it started and
ended on the ``time.monotonic()`` clock (the clients' clock in the rollout scenarios): what
``Probe`` sums per phase, kept one by one, so that a scenario can lay the calls of one
rollout along its timeline (READY, the first probe, each metrics reading, the abort, the
revert). Like ``Probe.timed``, the port objects the pass is given are wrapped; nothing in the
reconciler is replaced (``bench.harness.passes.pass_ports``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    label: str  # "triton infer", "metrics figures"...
    started: float  # time.monotonic()
    ended: float
    version: int | None  # the version the call named (infer: the second argument), if one
    failed: str | None  # the exception's class when it raised


class CallLog:
    """The calls, in the order they ended."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self._lock = threading.Lock()

    def timed(self, port: T, label: str) -> T:
        """``port`` with every method call logged as ``"<label> <method>"``."""
        return LoggedPort(port, self, label)  # type: ignore[return-value]

    def call(self, label: str, version: int | None, call: Callable[[], T]) -> T:
        started = time.monotonic()
        failed: str | None = None
        try:
            return call()
        except Exception as exc:
            failed = type(exc).__name__
            raise
        finally:
            with self._lock:
                self.calls.append(Call(label, started, time.monotonic(), version, failed))


class LoggedPort(Generic[T]):
    """A port object whose method calls go to a ``CallLog``."""

    def __init__(self, port: T, log: CallLog, label: str) -> None:
        self._port, self._log, self._label = port, log, label

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._port, name)
        if not callable(value) or name.startswith("__"):
            return value
        label, log = f"{self._label} {name}", self._log

        def logged(*args: Any, **kwargs: Any) -> Any:
            version = args[1] if len(args) > 1 and isinstance(args[1], int) else None
            return log.call(label, version, lambda: value(*args, **kwargs))

        return logged

    def __enter__(self) -> LoggedPort[T]:
        self._port.__enter__()  # type: ignore[attr-defined]
        return self

    def __exit__(self, *exc: object) -> Any:
        return self._port.__exit__(*exc)  # type: ignore[attr-defined]


def between(calls: Sequence[Call], since: float, until: float) -> list[Call]:
    """The calls that started in [since, until)."""
    return [c for c in calls if since <= c.started < until]


def seconds_by_label(calls: Sequence[Call]) -> dict[str, float]:
    """Seconds spent in calls, per label (calls made one after the other: they add up)."""
    totals: dict[str, float] = {}
    for c in calls:
        totals[c.label] = totals.get(c.label, 0.0) + (c.ended - c.started)
    return totals
