"""Fault points: named places where a crash test makes the reconciler die on purpose.

The crash harness (tests/integration/test_crash.py) sets ``TRITON_GITOPS_FAULT`` to one name of
``POINTS`` (or ``name:N``, to die on the N-th time that point is reached) and runs the CLI; the
process kills itself with SIGKILL there, flushing nothing, as a power cut or an OOM kill would.
The variable is read once, at import: when it is unset, ``fault_point`` is a function that does
nothing, so production code pays one call per point and nothing else.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

ENV = "TRITON_GITOPS_FAULT"

# Every point the code reaches, one line each on where it is. A unit test checks that each is
# called exactly once in the source and that no call names an unregistered point.
POINTS: tuple[str, ...] = (
    "apply.load.requested",  # a load step is about to call Triton
    "apply.load.accepted",  # Triton returned from a load; nothing recorded about it yet
    "apply.verify",  # a verify step is about to wait for READY and run smoke cases
    "apply.analysis",  # an analysis step has begun: new versions loaded and verified
    "apply.unload",  # an unload step is about to drop the old versions
    "apply.library.replaced",  # a backend library was replaced; nothing loaded on it yet
    "apply.revert",  # a failed change is about to run its revert steps (mid-revert)
    "loop.record",  # apply is done; the pass's outcome is not recorded yet
    "state.write",  # inside the state store's pass transaction, before its commit
    "state.migrate",  # inside a schema migration's transaction, before its commit
    "git.push.before",  # the revert commit is made locally and not pushed yet
    "git.push.after",  # the revert commit is pushed; the push is not recorded yet
    "loop.alerts",  # the pass is recorded; its alerts are not sent yet
)


def _noop(name: str) -> None:
    pass


def _armed(point: str, hits: int) -> Callable[[str], None]:
    lock = threading.Lock()
    seen = [0]

    def fault_point(name: str) -> None:
        if name != point:
            return
        with lock:  # points are reached from apply's worker threads too
            seen[0] += 1
            if seen[0] < hits:
                return
        os.kill(os.getpid(), signal.SIGKILL)

    return fault_point


def parse(value: str) -> tuple[str, int]:
    """``name`` or ``name:N`` -> (point, hit that kills); an unknown name is an error, so a
    misspelt point cannot make a crash test pass without crashing."""
    name, _, count = value.partition(":")
    if name not in POINTS:
        raise ValueError(f"{ENV}={value!r}: no such fault point; one of {', '.join(POINTS)}")
    return name, int(count) if count else 1


_setting = os.environ.get(ENV, "")
fault_point: Callable[[str], None] = _armed(*parse(_setting)) if _setting else _noop
