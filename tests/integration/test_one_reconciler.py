"""One reconciler at a time, with real processes: ``run`` and one-shot ``apply`` on one state
store take the lock next to it (``<state>.lock``). An ``apply`` started beside a running
service refuses, naming the service's pid, or waits for it to stop and then runs; a service
started while an ``apply`` runs serves its health checks and waits, then reconciles.

No Triton is needed: the manifests name a server that never answers (``MuteServer``), so a
pass or an apply lasts its call timeout, or until the test closes that server, and the lock
is what is watched.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit.cli_run import cli
from testkit.manifests import ManifestRepo, deployment_doc, server_doc
from testkit.service_process import Service, wait_until
from tests.integration.test_daemon import service_process

# The service's passes end a second after they ask the mute server anything.
FAST = ("--call-timeout", "1")


class MuteServer:
    """A listener that never accepts: connections queue and calls wait for their timeout,
    until ``close`` resets them (then every call fails at once)."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def mute_server() -> Iterator[MuteServer]:
    server = MuteServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def repo(manifests: ManifestRepo, mute_server: MuteServer, model_repository: Path) -> str:
    manifests.write("servers.yaml", server_doc("edge-a", mute_server.address, model_repository))
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
    manifests.commit("echo 1 on a server that never answers")
    return manifests.url


StartApply = Callable[..., subprocess.Popen[str]]


@pytest.fixture
def start_apply(repo: str) -> Iterator[StartApply]:
    """``start_apply(state, workdir, *options)``: ``triton-gitops apply`` as its own process
    on ``state``, its output in files in ``workdir``; ended by its pid if still running."""
    started: list[subprocess.Popen[str]] = []

    def start(state: Path, workdir: Path, *options: str) -> subprocess.Popen[str]:
        workdir.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable, "-m", "reconciler", "apply", "--repo", repo, "--state", str(state),
            "--cache-dir", str(workdir / "cache"), *options,
        ]  # fmt: skip
        with (workdir / "stdout").open("w") as out, (workdir / "stderr").open("w") as err:
            started.append(subprocess.Popen(command, stdout=out, stderr=err, text=True))
        return started[-1]

    try:
        yield start
    finally:
        for process in started:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()


def events_named(service: Service, message: str) -> list[dict[str, object]]:
    return [e for e in service.events() if e.get("message") == message]


def test_an_apply_beside_a_running_service_refuses_naming_it_or_waits_for_it(
    repo: str, mute_server: MuteServer, start_apply: StartApply, tmp_path: Path
) -> None:
    service = service_process(repo, tmp_path / "service", FAST).start()
    state, pid = service.workdir / "state.db", service.pid
    try:
        wait_until(lambda: events_named(service, "started"), 15, "the service holds the lock")
        host = socket.gethostname()

        refused = start_apply(state, tmp_path / "refused", "--lock-timeout", "0")
        assert refused.wait(30) == 1
        err = (tmp_path / "refused" / "stderr").read_text()
        assert f"another reconciler holds the lock {state}.lock: pid {pid} (run) on {host}" in err
        assert "triton-gitops reconcile --service URL" in err
        assert not (tmp_path / "refused" / "cache").exists()  # it fetched nothing
        # undo pushes to Git: the same lock (in this process, against the service's).
        options = ("--repo", repo, "--state", str(state), "--cache-dir", str(tmp_path / "u"))
        undone = cli("undo", "echo", *options, "--lock-timeout", "0")
        assert undone.code == 1 and f"pid {pid} (run)" in undone.err, undone.err

        waiting = start_apply(state, tmp_path / "waits", "--lock-timeout", "30")
        wait_until(
            lambda: "waiting up to 30 s" in (tmp_path / "waits" / "stderr").read_text(),
            15,
            "the apply says it waits",
        )
        assert waiting.poll() is None
        mute_server.close()  # from now on every call fails at once
    finally:
        assert service.stop() == 0  # its pass ends; the lock is let go
    assert waiting.wait(30) == 1  # it ran: the server is gone
    err = (tmp_path / "waits" / "stderr").read_text()
    assert f"reconciler lock {state}.lock, held by pid {pid} (run)" in err
    assert "another reconciler holds" not in err
    assert "edge-a" in (tmp_path / "waits" / "stdout").read_text()  # its own report
    assert (Path(f"{state}.lock")).read_text() == ""  # let go again


def test_a_service_started_while_an_apply_runs_waits_for_it_then_reconciles(
    repo: str, mute_server: MuteServer, start_apply: StartApply, tmp_path: Path
) -> None:
    state = tmp_path / "service" / "state.db"
    # The apply waits on the mute server until the test closes it.
    apply = start_apply(state, tmp_path / "apply", "--call-timeout", "60")
    lock_file = Path(f"{state}.lock")
    wait_until(lambda: f'"pid": {apply.pid}' in lock_file.read_text(), 15, "apply holds it")

    service = service_process(repo, tmp_path / "service", FAST)
    try:
        service.start()  # /healthz answers while it waits
        wait_until(lambda: events_named(service, "waiting for the reconciler lock"), 10, "it waits")
        (waiting,) = events_named(service, "waiting for the reconciler lock")
        assert (waiting["holder_pid"], waiting["holder_command"]) == (apply.pid, "apply")
        assert waiting["lock"] == str(lock_file)
        status, body = service.get("/readyz")
        assert status == 503 and b'"leading": false' in body
        assert apply.poll() is None
        assert service.passes() == 0  # nothing while the apply holds the lock

        mute_server.close()  # the apply's call fails at once: it ends, and lets go
        assert apply.wait(30) == 1
        began = time.monotonic()
        wait_until(lambda: events_named(service, "reconciler lock taken"), 10, "the lock")
        wait_until(lambda: service.passes() >= 1, 15, "a pass after the apply")
        assert time.monotonic() - began < 15
        assert f'"pid": {service.pid}' in lock_file.read_text()
    finally:
        service.stop()
