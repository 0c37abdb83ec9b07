"""What a result was measured on: the machine, the versions of Triton and its clients, the
reconciler code (commit, uncommitted files, a digest of the tree) and how busy the machine
was. Every scenario records these beside its numbers; BENCHMARKS.md quotes them.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


def host() -> dict[str, Any]:
    """Cores, CPU model and RAM (from /proc), Python and platform."""
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram_gib = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu,
        "ram_gib": ram_gib,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def machine(server_version: str) -> dict[str, Any]:
    """``host()`` and the Triton server's and clients' versions."""
    return {
        **host(),
        "triton_server": server_version,
        "nvidia_pytriton": importlib.metadata.version("nvidia-pytriton"),
        "tritonclient": importlib.metadata.version("tritonclient"),
    }


def _git(*args: str) -> str:
    try:
        done = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return ""
    return done.stdout.strip()


def provenance() -> dict[str, Any]:
    """The reconciler code measured: commit, and files changed since (others edit it)."""
    return {
        "commit": _git("rev-parse", "HEAD"),
        "uncommitted_reconciler_files": _git("status", "--porcelain", "reconciler").splitlines(),
    }


def tree_digest() -> str:
    """A digest of the reconciler's code and schemas as they are on disk now (other sessions
    edit them while benchmarks run)."""
    digest = hashlib.sha256()
    for path in sorted([*REPO_ROOT.glob("reconciler/**/*.py"), *REPO_ROOT.glob("schemas/*.json")]):
        digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def other_tritonservers(own_pid: int | None = None) -> int:
    """tritonserver processes on this machine not started by this run (read from /proc)."""
    count = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == own_pid:
            continue
        with contextlib.suppress(OSError):
            command = (entry / "cmdline").read_bytes().split(b"\0", 1)[0]
            count += command.endswith(b"/tritonserver")
    return count


def busy_processes(limit: int = 5) -> list[str]:
    """The processes (not ours) with the most CPU time, to say how shared the machine was."""
    try:
        done = subprocess.run(
            ["ps", "-eo", "pid,pcpu,etime,comm", "--sort=-pcpu"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return []
    own = os.getpid()
    rows = []
    for line in done.stdout.splitlines()[1:]:
        fields = line.split(None, 3)
        if len(fields) == 4 and int(fields[0]) != own and float(fields[1]) >= 5.0:
            rows.append(" ".join(fields))
    return rows[:limit]
