"""The reconciler lock as a file next to the state store (``<state>.lock``): ``apply``,
``undo`` and ``run`` hold it while they run, so two of them never share one state store and
Git mirror at once. ``wiring.reconciler_lock`` makes it (and the Kubernetes Lease beside it
when one is configured); ``cli/`` (apply, undo) and ``service/daemon.py`` take it.

``fcntl.flock`` rather than a lock library: the kernel drops the lock when its holder dies
(SIGKILL included), so there is never a stale lock to clean up, and the holder's pid,
command and start time are written into the file for a refusal to name. A waiting process
reads them only while the lock is held, so a file left behind by a dead holder names nobody.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

from reconciler.ports import LockHolder, ReconcilerLock

# How often a waiting acquire tries again.
_POLL = 0.1


def lock_path(state_path: Path) -> Path:
    """The lock file of a state store."""
    return state_path.with_name(state_path.name + ".lock")


class StateLockFile:
    """An exclusive ``flock`` on ``<state>.lock``, recording its holder in the file."""

    def __init__(self, path: Path, me: LockHolder) -> None:
        self.path = path
        self.where = str(path)
        self.me = me
        self._fd: int | None = None

    def acquire(self, timeout: float) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # No O_TRUNC: the file holds the holder's name until we hold the lock ourselves.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    os.close(fd)
                    return False
                time.sleep(min(_POLL, left))
        record = {
            "pid": self.me.pid,
            "command": self.me.command,
            "since": self.me.since,
            "host": self.me.host,
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        self._fd = fd
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # nobody holds it: the file names nobody either
        os.close(fd)  # closing drops the flock

    def held(self) -> bool:
        return self._fd is not None

    def holder(self) -> LockHolder | None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return _recorded(self.path)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None  # free: what the file says is a past holder's
        finally:
            os.close(fd)


def _recorded(path: Path) -> LockHolder:
    """The holder the lock file names; a holder that has just taken the lock may not have
    written it yet, so an empty file is read again a few times."""
    for _ in range(20):
        try:
            record = json.loads(path.read_text())
            return LockHolder(
                int(record["pid"]), str(record["command"]), str(record["since"]),
                str(record["host"]),
            )  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError):
            time.sleep(0.01)
    return LockHolder(0, "unknown", "unknown", "unknown")


class Locks:
    """Several locks taken in order and released in reverse (the file lock, then the Lease),
    held as one."""

    def __init__(self, locks: tuple[ReconcilerLock, ...]) -> None:
        self.locks = locks
        self.where = " and ".join(lock.where for lock in locks)
        self._taken: list[ReconcilerLock] = []

    def acquire(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for lock in self.locks:
            if not lock.acquire(max(0.0, deadline - time.monotonic())):
                self.release()
                return False
            self._taken.append(lock)
        return True

    def release(self) -> None:
        while self._taken:
            self._taken.pop().release()

    def held(self) -> bool:
        return bool(self._taken) and all(lock.held() for lock in self._taken)

    def holder(self) -> LockHolder | None:
        for lock in self.locks:
            found = lock.holder()
            if found is not None:
                return found
        return None
