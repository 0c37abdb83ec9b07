"""The command line's contract: options, output formats, sources, config changes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.local_triton import LocalTriton
from tests.conftest import ManifestRepo, git
from tests.integration.flows import (
    Reconciler,
    cli,
    deployment_doc,
    ready_versions,
    server_doc,
)


@pytest.mark.parametrize("command", ["validate", "plan", "apply"])
def test_help_is_complete(command: str) -> None:
    shown = cli(command, "--help")
    assert shown.code == 0
    if command != "validate":
        for option in ("--repo", "--ref", "--path", "--output", "--state", "--allow-empty"):
            assert option in shown.out


def test_module_and_script_entry_points() -> None:
    module = subprocess.run(
        [sys.executable, "-m", "reconciler", "--help"], capture_output=True, text=True
    )
    assert module.returncode == 0
    assert "validate" in module.stdout and "apply" in module.stdout
    script = shutil.which("triton-gitops", path=str(Path(sys.executable).parent))
    assert script is not None
    version = subprocess.run([script, "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("triton-gitops ")


def test_ref_and_path_select_what_is_reconciled(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    server = server_doc("edge-a", triton.grpc_address, model_repository)
    manifests.write("prod/servers.yaml", server)
    manifests.write("prod/echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
    manifests.write("staging/servers.yaml", server)
    manifests.write("staging/echo.yaml", deployment_doc("echo", [3], ["edge-a"]))
    release = manifests.commit("release")
    git(manifests.work, "tag", "release-1")
    git(manifests.work, "push", "--quiet", "origin", "release-1")
    manifests.write("prod/echo.yaml", deployment_doc("echo", [2], ["edge-a"]))
    manifests.commit("next")

    staged = reconciler.plan("--path", "staging", "--output", "json")
    assert staged.code == 2
    assert staged.json()["steps"][0]["versions"] == [3]
    tagged = reconciler.apply("--path", "prod", "--ref", "release-1", "--output", "json")
    assert tagged.code == 0, tagged.out
    doc = tagged.json()
    assert doc["revision"] == release
    assert doc["result"]["changes"][0]["outcome"] == "converged"
    assert [s["action"] for s in doc["result"]["changes"][0]["steps"]] == ["load", "verify"]
    assert ready_versions(triton, "echo") == {1}
    assert reconciler.apply("--path", "prod").code == 0
    assert ready_versions(triton, "echo") == {2}


def test_config_change_reloads_and_then_matches(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    manifests.write("servers.yaml", server_doc("edge-a", triton.grpc_address, model_repository))
    config = "  config:\n    max_batch_size: 0\n    instance_group: [{kind: KIND_CPU, count: %d}]\n"
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"]) + config % 1)
    manifests.commit("one instance")
    assert reconciler.apply().code == 0
    assert reconciler.plan().code == 0  # the server-filled instance name is not drift

    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"]) + config % 2)
    manifests.commit("two instances")
    planned = reconciler.plan("--output", "json")
    assert planned.code == 2
    steps = planned.json()["steps"]
    assert [(s["action"], s["versions"]) for s in steps] == [("load", [1]), ("verify", [1])]
    assert "config changed (instance_group)" in steps[0]["reason"]
    assert reconciler.apply().code == 0
    assert ready_versions(triton, "echo") == {1}
    assert reconciler.plan().code == 0


def test_unknown_config_field_is_a_validation_error(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text(
        server_doc("edge-a", "127.0.0.1:8001", tmp_path)
        + "---\n"
        + deployment_doc("echo", [1], ["edge-a"])
        + "  config:\n    max_batch_sise: 4\n"
    )
    result = cli("validate", str(tmp_path))
    assert result.code == 1
    assert 'm.yaml:18: spec.config: Message type "inference.ModelConfig" has no field named' in (
        result.err
    )


def test_vanished_repository_changes_nothing(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    manifests.write("servers.yaml", server_doc("edge-a", triton.grpc_address, model_repository))
    manifests.write("echo.yaml", deployment_doc("echo", [2], ["edge-a"]))
    manifests.commit("deploy")
    assert reconciler.apply().code == 0
    shutil.rmtree(manifests.bare)
    result = reconciler.apply()
    assert result.code == 1
    assert f"error: cannot fetch {manifests.url}: fatal: " in result.err
    assert ready_versions(triton, "echo") == {2}
