"""The reconciler lock as a file next to the state store, for real: ``flock`` between open
files of this process and against another process, the holder it names, a bounded wait, a
holder killed by SIGKILL, and several locks held as one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from reconciler.adapters.reconciler_lock import Locks, StateLockFile, lock_path
from reconciler.ports import LockHolder

RUN = LockHolder(4242, "run", "2026-12-01T22:00:00Z", "pod-a")
APPLY = LockHolder(4343, "apply", "2026-12-01T22:01:00Z", "pod-a")


def test_the_lock_file_sits_next_to_the_state_store() -> None:
    assert lock_path(Path("/var/lib/x/state.db")) == Path("/var/lib/x/state.db.lock")


def test_a_second_holder_is_refused_and_told_who_holds_it(tmp_path: Path) -> None:
    path = lock_path(tmp_path / "state" / "state.db")
    service, apply = StateLockFile(path, RUN), StateLockFile(path, APPLY)
    assert apply.holder() is None  # no file yet
    assert service.acquire(0) and service.held()
    assert not apply.acquire(0) and not apply.held()
    assert apply.holder() == RUN
    assert service.holder() == RUN

    service.release()
    assert apply.holder() is None  # the file names nobody once let go
    assert path.read_text() == ""
    assert apply.acquire(0)
    assert service.holder() == APPLY
    apply.release()


def test_a_waiting_acquire_gives_up_after_its_timeout_or_takes_the_lock_when_freed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db.lock"
    service, apply = StateLockFile(path, RUN), StateLockFile(path, APPLY)
    assert service.acquire(0)
    began = time.monotonic()
    assert not apply.acquire(0.3)
    assert 0.3 <= time.monotonic() - began < 1.5

    proc = _holder_process(path, hold=0.5)
    service.release()
    try:
        _wait_for(lambda: (h := apply.holder()) is not None and h.pid == proc.pid)
        began = time.monotonic()
        assert apply.acquire(5)  # the other process lets go after its half second
        assert time.monotonic() - began < 4
    finally:
        apply.release()
        proc.wait(10)


def test_a_holder_killed_by_sigkill_leaves_no_stale_lock(tmp_path: Path) -> None:
    path = tmp_path / "state.db.lock"
    proc = _holder_process(path, hold=60)
    apply = StateLockFile(path, APPLY)
    try:
        _wait_for(lambda: apply.holder() is not None)
        holder = apply.holder()
        assert holder is not None and (holder.pid, holder.command) == (proc.pid, "run")
        assert not apply.acquire(0)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        # The file still names the dead holder, but nobody holds the flock.
        assert str(proc.pid) in path.read_text()
        assert apply.holder() is None
        assert apply.acquire(0)
    finally:
        apply.release()
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_several_locks_are_taken_in_order_and_all_let_go_when_one_is_held(
    tmp_path: Path,
) -> None:
    first, second = tmp_path / "a.lock", tmp_path / "b.lock"
    other = StateLockFile(second, RUN)
    assert other.acquire(0)
    both = Locks((StateLockFile(first, APPLY), StateLockFile(second, APPLY)))
    assert both.where == f"{first} and {second}"
    assert not both.acquire(0.2) and not both.held()
    assert StateLockFile(first, RUN).holder() is None  # the first was let go again
    assert both.holder() == RUN
    other.release()
    assert both.acquire(0) and both.held()
    assert both.holder() == APPLY
    both.release()
    assert both.holder() is None


def _holder_process(path: Path, hold: float) -> subprocess.Popen[bytes]:
    """Another process holding the lock as ``run`` for ``hold`` seconds."""
    code = textwrap.dedent(f"""
        import os, sys, time
        from pathlib import Path
        from reconciler.adapters.reconciler_lock import StateLockFile
        from reconciler.ports import LockHolder
        lock = StateLockFile(Path({str(path)!r}), LockHolder(os.getpid(), "run", "now", "here"))
        assert lock.acquire(10)
        time.sleep({hold})
        lock.release()
    """)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    return subprocess.Popen([sys.executable, "-c", code], env=env)


def _wait_for(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.02)
