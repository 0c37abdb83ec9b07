"""The local tritonserver the demo, the tests and the benchmarks start: the product's own
launcher (``reconciler/adapters/local_triton.py``, which the ``gate`` command uses too),
under the name the test code has always imported, ending its servers at once (SIGKILL, their
shared memory removed): a test needs no graceful shutdown, which costs 1 to 3 s a server.
"""

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
# ended this way (tests/conftest.py), and says so in its summary.
TRITON_ABORT = "boost::interprocess::lock_exception"

_started: list["LocalTriton"] = []


@dataclass
class LocalTriton(_LocalTriton):
    """The product's launcher, ended at once (over a bucket its copy folder goes with it)."""

    fast_stop: bool = True

    def start(self, ready_timeout: float = 60.0) -> "LocalTriton":
        _started.append(self)  # before: the abort may come while it starts
        super().start(ready_timeout)
        return self


def forget_started() -> None:
    """Start a new record of the servers started in this process (one per test attempt)."""
    _started.clear()


def triton_aborts() -> list[str]:
    """The servers started since ``forget_started`` whose log shows Triton's own abort:
    "<log file>: <the line>" for each."""
    found = []
    for server in _started:
        log = server.log_file
        if log is None or not Path(log).is_file():
            continue
        for line in Path(log).read_text(errors="replace").splitlines():
            if TRITON_ABORT in line:
                found.append(f"{log}: {line.strip()}")
                break
    return found


__all__ = [
    "MOUNT_DIRECTORY_VARIABLES",
    "TRITON_ABORT",
    "LocalTriton",
    "LocalTritonError",
    "end_process_group",
    "forget_started",
    "free_port",
    "mount_directory_variable",
    "triton_aborts",
]
