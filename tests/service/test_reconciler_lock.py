"""What the service does with the reconciler lock, with a plain fake lock: no pass and no Git
push without it, a lost lock (a Lease another replica took) stops the service with exit 1,
and the lock is let go at an orderly stop."""

from __future__ import annotations

from pathlib import Path

from reconciler.model.settings import RunSettings, Settings
from reconciler.model.source import Source
from reconciler.ports import LockHolder
from reconciler.service.daemon import Daemon


class FakeLock:
    where = "Lease triton/triton-gitops"

    def __init__(self, free: bool = True) -> None:
        self.free = free
        self.ours = False
        self.released = 0

    def acquire(self, timeout: float) -> bool:
        self.ours = self.free
        return self.ours

    def release(self) -> None:
        self.released += 1
        self.ours = False

    def held(self) -> bool:
        return self.ours

    def holder(self) -> LockHolder | None:
        return None if self.free else LockHolder(7, "run", "2026-12-01T22:00:00Z", "pod-b")


def daemon(tmp_path: Path, lock: FakeLock) -> Daemon:
    settings = Settings(cache_dir=tmp_path / "cache", state_path=tmp_path / "state.db")
    return Daemon(Source(str(tmp_path / "no-repo")), settings, RunSettings(), lock=lock)


def test_a_replica_without_the_lock_runs_no_pass_pushes_nothing_and_is_not_ready(
    tmp_path: Path,
) -> None:
    lock = FakeLock(free=False)
    service = daemon(tmp_path, lock)
    service.request_stop()  # take_lock gives up once asked to stop
    assert not service.take_lock()
    assert service.readiness()[1]["leading"] is False
    status, reply = service.operator("reconcile", None, "alice", "")
    assert status == 503 and "does not hold Lease triton/triton-gitops" in reply["error"]
    status, reply = service.operator("undo", "echo", "alice", "")
    assert status == 503 and "does not hold" in reply["error"]


def test_a_lost_lock_stops_the_service_with_exit_1_and_a_held_one_is_let_go_at_stop(
    tmp_path: Path,
) -> None:
    lock = FakeLock()
    service = daemon(tmp_path, lock)
    assert service.take_lock() and service.readiness()[1]["leading"] is True
    lock.ours = False  # the Lease could not be renewed
    assert service.run_pass() is None
    assert service.stop_requested.is_set()
    assert service.shutdown() == 1

    lock = FakeLock()
    service = daemon(tmp_path, lock)
    assert service.take_lock()
    assert service.shutdown() == 0
    assert lock.released == 1 and not lock.held()
