"""End to end through the CLI: real tritonserver processes, a real bare Git remote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testkit.alert_receiver import AlertReceiver
from testkit.cli_run import Reconciler, cli
from testkit.local_triton import LocalTriton, free_port
from testkit.manifests import ManifestRepo, deployment_doc, server_doc
from tests.integration.flows import ready_versions, served_factor


@pytest.fixture
def reconciler(manifests: ManifestRepo, tmp_path: Path) -> Reconciler:
    return Reconciler(manifests.url, tmp_path / "reconciler")


def _one_server(manifests: ManifestRepo, triton: LocalTriton, repository: Path) -> None:
    manifests.write("servers/edge-a.yaml", server_doc("edge-a", triton.grpc_address, repository))


def test_first_deploy_bump_and_rollback(
    manifests: ManifestRepo, reconciler: Reconciler, triton: LocalTriton, model_repository: Path
) -> None:
    _one_server(manifests, triton, model_repository)
    manifests.write("models/echo.yaml", deployment_doc("echo", [1], ["edge-a"], expect_factor=1))
    first = manifests.commit("deploy echo 1")

    planned = reconciler.plan("--output", "json")
    assert planned.code == 2, planned.err
    doc = planned.json()
    assert doc["format_version"] == "1"
    assert doc["revision"] == first
    assert [(s["action"], s["versions"]) for s in doc["steps"]] == [
        ("load", [1]),
        ("verify", [1]),
    ]
    assert all(s["server"] == "edge-a" and s["model"] == "echo" for s in doc["steps"])

    applied = reconciler.apply()
    assert applied.code == 0, applied.out + applied.err
    assert first in applied.out
    assert ready_versions(triton, "echo") == {1}
    assert served_factor(triton, "echo") == 1.0
    again = reconciler.plan()
    assert again.code == 0, again.out
    assert "nothing to do" in again.out

    manifests.write("models/echo.yaml", deployment_doc("echo", [2], ["edge-a"], expect_factor=2))
    manifests.commit("bump echo to 2")
    bump = reconciler.plan("--output", "json")
    assert bump.code == 2
    assert [(s["action"], s["versions"]) for s in bump.json()["steps"]] == [
        ("load", [1, 2]),
        ("verify", [2]),
        ("unload", [2]),
    ]
    assert bump.json()["steps"][2]["dropped"] == [1]
    assert reconciler.apply().code == 0
    assert ready_versions(triton, "echo") == {2}
    assert served_factor(triton, "echo") == 2.0

    # Rollback is just a later commit.
    manifests.write("models/echo.yaml", deployment_doc("echo", [1], ["edge-a"], expect_factor=1))
    manifests.commit("roll echo back to 1")
    assert reconciler.apply().code == 0
    assert ready_versions(triton, "echo") == {1}
    assert reconciler.plan().code == 0


def test_version_that_fails_to_load_keeps_old_serving(
    manifests: ManifestRepo, reconciler: Reconciler, triton: LocalTriton, model_repository: Path
) -> None:
    _one_server(manifests, triton, model_repository)
    manifests.write("models/echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
    manifests.write("models/other.yaml", deployment_doc("other", [1], ["edge-a"]))
    manifests.commit("deploy")
    assert reconciler.apply().code == 0

    manifests.write("models/echo.yaml", deployment_doc("echo", [9], ["edge-a"]))
    manifests.write("models/other.yaml", deployment_doc("other", [2], ["edge-a"]))
    manifests.commit("echo 9 is broken; other 2 is fine")
    result = reconciler.apply()
    assert result.code == 1
    assert "edge-a/echo: reverted" in result.out
    assert "version 9 is broken on purpose" in result.out  # Triton's own message
    # Progress is reported on stderr as each step finishes.
    assert "edge-a/echo: load 1, 9 FAILED" in result.err
    assert "edge-a/echo: revert load 1 ok" in result.err
    assert ready_versions(triton, "echo") == {1}
    assert served_factor(triton, "echo") == 1.0
    # The other model carried on.
    assert "edge-a/other: converged" in result.out
    assert ready_versions(triton, "other") == {2}


def test_smoke_failure_reverts_to_old_version(
    manifests: ManifestRepo, reconciler: Reconciler, triton: LocalTriton, model_repository: Path
) -> None:
    _one_server(manifests, triton, model_repository)
    manifests.write("models/echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
    manifests.commit("deploy")
    assert reconciler.apply().code == 0

    # Version 3 answers x3, the smoke case expects x2: caught before version 1 goes.
    manifests.write("models/echo.yaml", deployment_doc("echo", [3], ["edge-a"], expect_factor=2))
    manifests.commit("echo 3 with a smoke case it fails")
    result = reconciler.apply()
    assert result.code == 1
    assert "smoke doubles on version 3" in result.out
    assert ready_versions(triton, "echo") == {1}
    assert served_factor(triton, "echo") == 1.0


def test_missing_version_is_a_plan_error_for_that_model_only(
    manifests: ManifestRepo, reconciler: Reconciler, triton: LocalTriton, model_repository: Path
) -> None:
    _one_server(manifests, triton, model_repository)
    manifests.write("models/echo.yaml", deployment_doc("echo", [8], ["edge-a"]))
    manifests.write("models/other.yaml", deployment_doc("other", [1], ["edge-a"]))
    manifests.commit("echo 8 does not exist")
    planned = reconciler.plan()
    assert planned.code == 1
    assert "server edge-a, model echo: version(s) 8 not in the model repository" in planned.out
    result = reconciler.apply()
    assert result.code == 1
    assert ready_versions(triton, "other") == {1}
    assert ready_versions(triton, "echo") == set()


def test_missing_version_without_readable_repository_fails_verify(
    manifests: ManifestRepo, reconciler: Reconciler, triton: LocalTriton, model_repository: Path
) -> None:
    # Without spec.modelRepository the plan cannot know; Triton 2.51 accepts the load and
    # simply never shows the version, so verify catches it and the old version stays.
    config = (
        "  config:\n    backend: python\n"
        "    input: [{name: INPUT0, data_type: TYPE_FP32, dims: [-1, 4]}]\n"
        "    output: [{name: OUTPUT0, data_type: TYPE_FP32, dims: [-1, 4]}]\n"
    )
    manifests.write("servers/edge-a.yaml", server_doc("edge-a", triton.grpc_address, None))
    manifests.write("models/echo.yaml", deployment_doc("echo", [1], ["edge-a"]) + config)
    manifests.commit("deploy with a complete config")
    assert reconciler.apply().code == 0
    manifests.write("models/echo.yaml", deployment_doc("echo", [8], ["edge-a"]) + config)
    manifests.commit("echo 8 does not exist")
    result = reconciler.apply()
    assert result.code == 1
    assert "version 8 is not READY" in result.out
    assert ready_versions(triton, "echo") == {1}


def test_removal_unloads_and_empty_revision_is_refused(
    manifests: ManifestRepo, reconciler: Reconciler, triton: LocalTriton, model_repository: Path
) -> None:
    _one_server(manifests, triton, model_repository)
    manifests.write("models/echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
    manifests.write("models/other.yaml", deployment_doc("other", [2], ["edge-a"]))
    manifests.commit("deploy two models")
    assert reconciler.apply().code == 0

    manifests.remove("models/other.yaml")
    manifests.commit("retire other")
    planned = reconciler.plan("--output", "json")
    assert planned.code == 2
    assert [(s["model"], s["action"], s["versions"]) for s in planned.json()["steps"]] == [
        ("other", "unload", []),
    ]
    assert reconciler.apply().code == 0
    assert ready_versions(triton, "other") == set()
    assert ready_versions(triton, "echo") == {1}

    manifests.remove("models/echo.yaml")
    manifests.commit("an accidental commit that empties the server")
    refused = reconciler.apply()
    assert refused.code == 1
    assert "refusing revision" in refused.err and "edge-a" in refused.err
    assert ready_versions(triton, "echo") == {1}

    assert reconciler.apply("--allow-empty").code == 0
    assert ready_versions(triton, "echo") == set()


def test_unreachable_server_is_named_and_others_reconciled(
    manifests: ManifestRepo, reconciler: Reconciler, triton: LocalTriton, model_repository: Path
) -> None:
    _one_server(manifests, triton, model_repository)
    dead = f"127.0.0.1:{free_port()}"
    manifests.write("servers/edge-b.yaml", server_doc("edge-b", dead, model_repository))
    manifests.write("models/echo.yaml", deployment_doc("echo", [2], ["edge-a", "edge-b"]))
    manifests.commit("edge-b is down")
    result = reconciler.apply("--call-timeout", "2")
    assert result.code == 1
    assert f"server edge-b: {dead} did not answer" in result.out
    assert ready_versions(triton, "echo") == {2}


def test_broken_manifest_applies_nothing(
    manifests: ManifestRepo, reconciler: Reconciler, triton: LocalTriton, model_repository: Path
) -> None:
    _one_server(manifests, triton, model_repository)
    manifests.write("models/echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
    manifests.commit("deploy")
    assert reconciler.apply().code == 0

    manifests.write(
        "models/echo.yaml", deployment_doc("echo", [2], ["edge-a"]).replace("[2]", "[two]")
    )
    manifests.write("models/other.yaml", deployment_doc("other", [1], ["edge-a", "edge-z"]))
    manifests.commit("two mistakes")
    result = reconciler.apply()
    assert result.code == 1
    lines = result.err.splitlines()
    assert "models/echo.yaml:8: spec.versions[0]: 'two' is not a whole number" in lines
    assert "models/other.yaml:7: ModelDeployment 'other' names unknown TritonServer 'edge-z'" in (
        lines
    )
    assert lines[-1].startswith("2 problem(s) in the manifests at ")
    assert lines[-1].endswith("; nothing applied")
    assert ready_versions(triton, "echo") == {1}
    assert ready_versions(triton, "other") == set()


def test_two_servers_at_once(
    manifests: ManifestRepo,
    reconciler: Reconciler,
    triton: LocalTriton,
    triton_b: LocalTriton,
    model_repository: Path,
) -> None:
    manifests.write(
        "servers.yaml",
        server_doc("edge-a", triton.grpc_address, model_repository, "{pool: edge}")
        + "---\n"
        + server_doc("edge-b", triton_b.grpc_address, model_repository, "{pool: edge}"),
    )
    manifests.write(
        "models/echo.yaml",
        deployment_doc("echo", [2], ["x"]).replace("names: [x]", "matchLabels: {pool: edge}"),
    )
    manifests.commit("echo 2 on the edge pool")
    result = reconciler.apply()
    assert result.code == 0, result.out + result.err
    assert ready_versions(triton, "echo") == {2}
    assert ready_versions(triton_b, "echo") == {2}
    assert reconciler.plan().code == 0


def test_validate_command(tmp_path: Path, model_repository: Path) -> None:
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "all.yaml").write_text(
        server_doc("edge-a", "127.0.0.1:8001", model_repository)
        + "---\n"
        + deployment_doc("echo", [1], ["edge-a"])
    )
    valid = cli("validate", str(tmp_path / "ok"))
    assert valid.code == 0
    assert "valid: 1 server(s), 1 model deployment(s)" in valid.out
    (tmp_path / "ok" / "bad.yml").write_text("apiVersion: triton-gitops/v1alpha1\nkind: Model\n")
    invalid = cli("validate", str(tmp_path / "ok"))
    assert invalid.code == 1
    assert "bad.yml:2: unknown kind 'Model'" in invalid.err


def test_failed_loads_and_invalid_revisions_are_alerted(
    manifests: ManifestRepo, reconciler: Reconciler, triton: LocalTriton, model_repository: Path
) -> None:
    with AlertReceiver() as receiver:
        hook = receiver.hook
        _one_server(manifests, triton, model_repository)
        manifests.write("models/echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
        manifests.commit("deploy")
        assert reconciler.apply(*hook).code == 0
        manifests.write("models/echo.yaml", deployment_doc("echo", [9], ["edge-a"]))
        failing = manifests.commit("echo 9 fails to load")
        assert reconciler.apply(*hook).code == 1
        manifests.write("models/echo.yaml", "apiVersion: [\n")
        broken = manifests.commit("a broken manifest on the tracked branch")
        assert reconciler.apply(*hook).code == 1
    kinds = [(e["kind"], e["revision"]) for e in receiver.events]
    assert ("load-failed", failing) in kinds
    assert ("validation-failed", broken) in kinds
    load_failed = next(e for e in receiver.events if e["kind"] == "load-failed")
    assert load_failed["model"] == "echo" and load_failed["server"] == "edge-a"
    assert "broken on purpose" in json.dumps(load_failed["details"])
