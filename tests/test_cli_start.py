"""What a command's start costs: ``validate`` (every pull request's check, issue 46) imports
no client library the service uses. Each of these took part of the 1.5 s a validate of
1,000 manifests may take (bench/fleet.py --repository): scipy.stats 0.5 s, the Kubernetes
client 0.17 s, tritonclient's gRPC package with numpy and ml_dtypes 0.2 s. Checked in a
fresh interpreter: a test process has imported them all long before.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HEAVY = ("grpc", "tritonclient.grpc", "scipy", "kubernetes", "httpx", "apscheduler")

PROGRAM = """
import json, sys
from reconciler.cli import main
code = main(["validate", sys.argv[1]])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def test_validate_starts_no_client_library(tmp_path: Path) -> None:
    (tmp_path / "server.yaml").write_text(
        "apiVersion: triton-gitops.dev/v1alpha1\nkind: TritonServer\nmetadata: {name: s}\n"
        "spec: {grpc: '127.0.0.1:8001', modelRepository: /models}\n"
    )
    (tmp_path / "model.yaml").write_text(
        "apiVersion: triton-gitops.dev/v1alpha1\nkind: ModelDeployment\nmetadata: {name: m}\n"
        "spec:\n  servers: {names: [s]}\n  versions: [1]\n"
        "  config: {backend: python, max_batch_size: 8}\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.splitlines()[-1])
    assert result["code"] == 0, run.stdout
    imported = [m for m in HEAVY if m in result["modules"]]
    assert imported == [], f"validate imported {imported}; see reconciler/cli/__init__.py"
