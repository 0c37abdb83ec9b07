"""A Python script run in a process of its own with a fault point armed: it dies there by
SIGKILL (``reconciler/faults.py``), as a power cut or an OOM kill would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def killed_at(point: str, script: str, path: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (``sys.argv[1]`` is ``path``) until it dies at ``point`` (``name`` or
    ``name:N``); fails when it did not die there."""
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)],
        env={**os.environ, "TRITON_GITOPS_FAULT": point},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    return done
