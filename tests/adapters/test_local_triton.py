"""LocalTriton's process environment: extra variables reach the server, and only the server."""

from __future__ import annotations

import os
from pathlib import Path

from testkit.local_triton import LocalTriton


def test_extra_env_reaches_the_server_process_only(model_repository: Path, tmp_path: Path) -> None:
    name = "TRITON_GITOPS_TEST_MARKER"
    server = LocalTriton(
        model_repository, log_file=tmp_path / "triton.log", extra_env={name: "soak"}
    ).start()
    try:
        assert server.process is not None
        environ = Path(f"/proc/{server.process.pid}/environ").read_bytes().split(b"\0")
        assert f"{name}=soak".encode() in environ
        assert name not in os.environ
    finally:
        server.stop()
