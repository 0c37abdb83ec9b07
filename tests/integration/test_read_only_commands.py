"""Commands that only look (plan, status, history) write nothing, and say what they found in
their exit codes; run as a user runs them, as subprocesses. No tritonserver: nothing listens
where the servers are declared."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from testkit.local_triton import free_port
from testkit.manifests import ManifestRepo, deployment_doc, server_doc


def triton_gitops(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reconciler", *args], capture_output=True, text=True, timeout=60
    )


def test_plan_status_and_history_leave_no_state_file(
    manifests: ManifestRepo, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    manifests.write("servers.yaml", server_doc("edge-z", f"127.0.0.1:{free_port()}", models))
    manifests.write("more.yaml", server_doc("edge-y", f"127.0.0.1:{free_port()}", models))
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-z", "edge-y"]))
    manifests.commit("echo on two servers that are down")
    state = tmp_path / "state" / "state.db"
    source = ["--repo", manifests.url, "--state", str(state), "--cache-dir", str(tmp_path / "c")]

    planned = triton_gitops("plan", *source, "--call-timeout", "0.5")
    # What the user saw: a warning that "its record is lost", and a state.db made by a plan.
    assert planned.returncode == 1, planned.stderr  # the servers are problems of the plan
    assert "server=edge-z kind=unreachable" in planned.stderr
    assert "record is lost" not in planned.stderr and "does not exist" not in planned.stderr
    assert not state.parent.exists()

    shown = triton_gitops("status", *source, "--call-timeout", "0.5")
    assert shown.returncode == 3, shown.stderr  # not one declared server answered
    assert "server edge-z: UNREACHABLE" in shown.stdout
    assert "no declared server answered" in shown.stderr
    assert not state.parent.exists()

    for output in ("text", "json"):
        history = triton_gitops("history", "--state", str(state), "--output", output)
        assert history.returncode == 0, history.stderr
        assert f"no history yet: no state store at {state}" in history.stderr
    assert history.stdout.strip().startswith("{")  # json: still a document
    assert not state.parent.exists()
