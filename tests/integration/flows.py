"""Helpers for the end-to-end tests: manifests as text, the CLI in-process, Triton queries."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as triton_grpc

from reconciler.cli import main
from testkit.local_triton import LocalTriton


def server_doc(
    name: str,
    address: str,
    repository: Path | None,
    labels: str = "",
    metrics: str | None = None,
) -> str:
    lines = [
        "apiVersion: triton-gitops/v1alpha1",
        "kind: TritonServer",
        "metadata:",
        f"  name: {name}",
    ]
    if labels:
        lines.append(f"  labels: {labels}")
    lines += ["spec:", f"  grpc: {address}"]
    if metrics is not None:
        lines.append(f"  metrics: {metrics}")
    if repository is not None:
        lines.append(f"  modelRepository: {repository}")
    return "\n".join(lines) + "\n"


def deployment_doc(
    name: str,
    versions: list[int],
    servers: list[str],
    *,
    model: str | None = None,
    expect_factor: float | None = None,
    extra: str = "",
) -> str:
    lines = [
        "apiVersion: triton-gitops/v1alpha1",
        "kind: ModelDeployment",
        "metadata:",
        f"  name: {name}",
        "spec:",
    ]
    if model:
        lines.append(f"  model: {model}")
    lines += [
        "  servers:",
        f"    names: [{', '.join(servers)}]",
        f"  versions: [{', '.join(map(str, versions))}]",
    ]
    if expect_factor is not None:
        lines += [
            "  verify:",
            "    smoke:",
            "      - name: doubles",
            "        inputs:",
            "          INPUT0: {datatype: FP32, shape: [1, 4], data: [1, 2, 3, 4]}",
            "        expect:",
            f"          OUTPUT0: {{data: {[x * expect_factor for x in (1, 2, 3, 4)]}, "
            "tolerance: 0.0001}",
        ]
    return "\n".join(lines) + "\n" + extra


@dataclass
class CliRun:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def cli(*args: str) -> CliRun:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse errors and --help
            code = int(exc.code or 0)
    return CliRun(code, out.getvalue(), err.getvalue())


class Reconciler:
    """The CLI pointed at one manifest remote, with its own state store and cache."""

    def __init__(self, repo_url: str, workdir: Path) -> None:
        self.repo_url = repo_url
        self.options = [
            "--repo",
            repo_url,
            "--state",
            str(workdir / "state.db"),
            "--cache-dir",
            str(workdir / "cache"),
        ]

    def plan(self, *extra: str) -> CliRun:
        return cli("plan", *self.options, *extra)

    def apply(self, *extra: str) -> CliRun:
        return cli("apply", *self.options, *extra)


def ready_versions(server: LocalTriton, model: str) -> set[int]:
    with triton_grpc.InferenceServerClient(server.grpc_address) as client:
        index = client.get_model_repository_index(as_json=True).get("models", [])
    return {
        int(m["version"])
        for m in index
        if m.get("name") == model and m.get("state") == "READY" and m.get("version")
    }


def served_factor(server: LocalTriton, model: str, version: int | None = None) -> float:
    """Which version answers (the test model multiplies its input by its version)."""
    with triton_grpc.InferenceServerClient(server.grpc_address) as client:
        item = triton_grpc.InferInput("INPUT0", [1, 4], "FP32")
        item.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        result = client.infer(model, [item], model_version=str(version) if version else "")
        return float(result.as_numpy("OUTPUT0")[0][0])
