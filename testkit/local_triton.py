"""The local tritonserver the demo, the tests and the benchmarks start: the product's own
launcher (``reconciler/adapters/local_triton.py``, which the ``gate`` command uses too),
under the name the test code has always imported, ending its servers at once (SIGKILL, their
shared memory removed): a test needs no graceful shutdown, which costs 1 to 3 s a server.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from reconciler.adapters.local_triton import (
    MOUNT_DIRECTORY_VARIABLES,
    LocalTritonError,
    end_process_group,
    free_port,
    mount_directory_variable,
)
from reconciler.adapters.local_triton import LocalTriton as _LocalTriton

# Triton 2.51's Python backend now and then aborts the whole server (SIGABRT) with this in its
# log, most often while a stub starts or ends on a loaded host: the same abort as
# triton-inference-server/server#8882, open upstream. Clean-clone CI runs 2 and 16 of 17 lost
# one test each to it. The suite reruns a test once when, and only when, a server it started
# or a server shared by its module ended this way (tests/conftest.py), and says so in its
# summary.
TRITON_ABORT = "boost::interprocess::lock_exception"

_started: list["LocalTriton"] = []
# Servers that outlive a test (a module's fixture), each with what puts it back in the state
# its fixture made (models loaded by hand), and the size of its log when the current test
# attempt began: only what an attempt's own time wrote is that attempt's abort.
_shared: list[tuple["LocalTriton", Callable[["LocalTriton"], None] | None]] = []
_log_marks: dict[int, int] = {}
# Where each shared server's log stood when it was last started: why it ended is after that.
_run_marks: dict[int, int] = {}


@dataclass
class LocalTriton(_LocalTriton):
    """The product's launcher, ended at once (over a bucket its copy folder goes with it)."""

    fast_stop: bool = True

    def start(self, ready_timeout: float = 60.0) -> "LocalTriton":
        _started.append(self)  # before: the abort may come while it starts
        super().start(ready_timeout)
        return self


def forget_started() -> None:
    """Start a new record of the servers started in this process (one per test attempt), and
    mark where each shared server's log stands."""
    _started.clear()
    _log_marks.clear()
    for server, _ in _shared:
        _log_marks[id(server)] = _log_size(server)


@contextmanager
def shared_between_tests(
    server: "LocalTriton", prepare: Callable[["LocalTriton"], None] | None = None
) -> Iterator["LocalTriton"]:
    """Use ``server`` across a module's tests: an abort in its log during a test counts as
    that test's (``triton_aborts``), and ``revive_shared`` starts it again, on the same ports,
    before the next test, so that one abort in Triton fails one test and not every test after
    it (clean-clone CI on 06169b4: test_crash.py's module server aborted, 28 tests failed).
    ``prepare`` puts back what the fixture did to a fresh server (models it loaded by hand)."""
    entry = (server, prepare)
    _shared.append(entry)
    _log_marks[id(server)] = _run_marks[id(server)] = _log_size(server)
    try:
        yield server
    finally:
        _shared.remove(entry)
        _log_marks.pop(id(server), None)
        _run_marks.pop(id(server), None)


def revive_shared() -> list[str]:
    """Start again every shared server whose process has ended, on its own ports, and run its
    ``prepare``: "<log file>: <why it ended>" for each one started again."""
    revived = []
    for server, prepare in _shared:
        process = server.process
        if process is None or process.poll() is None:
            continue
        code = process.returncode
        why = _abort_line(server, _run_marks.get(id(server), 0)) or f"exited with {code}"
        server.kill()  # its shared memory and copy folder go; the process has already ended
        _run_marks[id(server)] = _log_size(server)
        server.start()
        if prepare is not None:
            prepare(server)
        _log_marks[id(server)] = _log_size(server)
        revived.append(f"{server.log_file}: {why}")
    return revived


def triton_aborts() -> list[str]:
    """The servers started since ``forget_started``, and the shared ones, whose log shows
    Triton's own abort written during this attempt: "<log file>: <the line>" for each."""
    found = []
    # By identity: LocalTriton is a dataclass, and == compares its fields.
    started = {id(s) for s in _started}
    for server in [*_started, *(s for s, _ in _shared if id(s) not in started)]:
        line = _abort_line(server, _log_marks.get(id(server), 0))
        if line is not None:
            found.append(f"{server.log_file}: {line}")
    return found


def _log_size(server: "LocalTriton") -> int:
    log = server.log_file
    return Path(log).stat().st_size if log is not None and Path(log).is_file() else 0


def _abort_line(server: "LocalTriton", since: int) -> str | None:
    """The first line of the server's log after byte ``since`` that shows Triton's abort."""
    log = server.log_file
    if log is None or not Path(log).is_file():
        return None
    with open(log, "rb") as text:
        text.seek(since)
        for line in text.read().decode(errors="replace").splitlines():
            if TRITON_ABORT in line:
                return line.strip()
    return None


__all__ = [
    "MOUNT_DIRECTORY_VARIABLES",
    "TRITON_ABORT",
    "LocalTriton",
    "LocalTritonError",
    "end_process_group",
    "forget_started",
    "free_port",
    "mount_directory_variable",
    "revive_shared",
    "shared_between_tests",
    "triton_aborts",
]
