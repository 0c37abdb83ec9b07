"""The pre-merge gate of a sequence model (``sequence_batching``: the counter, a running sum
per sequence), with the built-in load generator, which once sent its requests with no
sequence and failed every one ("must specify a non-zero or non-empty correlation ID"): a
good version failed the gate on its errors. Each concurrent worker now sends sequences of
its own (``adapters/triton_load``). perf_analyzer makes its own from the config: measured by
hand, the same change passed with it (BENCHMARKS.md does not time it; the suite does not
run it here, to keep its time).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from testkit.cli_run import CliRun, cli
from testkit.manifests import SEQUENCE_MODEL, ManifestRepo, git, write_model_repository

pytestmark = pytest.mark.triton

SERVER = """\
apiVersion: triton-gitops/v1alpha1
kind: TritonServer
metadata: {name: prod}
spec: {grpc: "10.0.0.1:8001", modelRepository: /models}
"""
# Errors only: the verdicts here do not ride on the machine's noise.
GATE = "    gate: {maxErrorRate: 0, concurrency: [1, 4], rounds: 2, requests: 60}\n"


def _counter(version: int, fail_later: str = "") -> str:
    config = (
        f"  config: {{parameters: {{fail_later: {{string_value: '{fail_later}'}}}}}}\n"
        if fail_later
        else ""
    )
    return (
        "apiVersion: triton-gitops/v1alpha1\n"
        "kind: ModelDeployment\n"
        f"metadata: {{name: {SEQUENCE_MODEL}}}\n"
        "spec:\n"
        "  servers: {names: [prod]}\n"
        f"  versions: [{version}]\n" + config + "  verify:\n" + GATE
    )


def _gate(tmp_path: Path, head: str) -> tuple[CliRun, dict[str, Any]]:
    repository = write_model_repository(tmp_path / "models")
    manifests = ManifestRepo(tmp_path / "git")
    manifests.write("manifests/servers.yaml", SERVER)
    manifests.write("manifests/counter.yaml", _counter(1))
    manifests.commit("base")
    git(manifests.work, "checkout", "--quiet", "-b", "change")
    manifests.write("manifests/counter.yaml", head)
    git(manifests.work, "commit", "--quiet", "--all", "-m", "counter 2")
    reports = tmp_path / "reports"
    run = cli(
        "gate", "--repo", str(manifests.work), "--path", "manifests", "--base", "main",
        "--head", "change", "--model-repository", str(repository),
        "--cache-dir", str(tmp_path / "cache"), "--load-generator", "built-in",
        "--report-dir", str(reports),
    )  # fmt: skip
    report = json.loads((reports / "gate.json").read_text()) if reports.exists() else {}
    return run, report


def test_the_built_in_generator_drives_a_sequence_model_by_sequences(tmp_path: Path) -> None:
    run, report = _gate(tmp_path, _counter(2))
    assert run.code == 0, run.explain()
    (model,) = report["models"]
    assert (model["old_version"], model["new_version"], model["verdict"]) == (1, 2, "pass")
    figures = model["old_figures"] + model["new_figures"]
    # Every request answered: each sent within a sequence of its own worker's.
    assert len(figures) == 8 and all(
        f["requests"] == 60 and f["errors"] == 0 and f["throughput"] > 0 for f in figures
    ), figures


def test_a_version_that_loses_its_sequences_fails_the_gate(tmp_path: Path) -> None:
    run, report = _gate(tmp_path, _counter(2, fail_later="2:1"))
    assert run.code == 3, run.explain()
    (model,) = report["models"]
    assert model["verdict"] == "fail", model
    messages = [f["message"] for f in model["findings"]]
    assert any("request 2 of 3 of a sequence" in m for m in messages), messages
