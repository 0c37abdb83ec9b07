"""``triton-gitops check`` against real parts: a bare Git remote, a state store, Prometheus,
and three real tritonservers, one in EXPLICIT mode, one in POLL mode and one in NONE mode
(the two the reconciler cannot drive, refused with the fix)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.cli_run import cli
from testkit.local_triton import LocalTriton, free_port
from testkit.manifests import ManifestRepo, deployment_doc, echo_repository, server_doc
from tests.services import StartPrometheus

pytestmark = pytest.mark.triton


@pytest.fixture
def modes(tmp_path: Path) -> Iterator[dict[str, LocalTriton]]:
    repository = echo_repository(tmp_path / "echo-models", 1, 2)
    servers = {}
    try:
        for mode in ("poll", "none"):
            servers[mode] = LocalTriton(
                repository,
                log_file=tmp_path / f"triton-{mode}.log",
                extra_args=(f"--model-control-mode={mode}",),
            ).start()
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def test_check_names_each_problem_with_its_fix_and_exits_1(
    manifests: ManifestRepo,
    triton: LocalTriton,
    model_repository: Path,
    modes: dict[str, LocalTriton],
    tmp_path: Path,
    start_prometheus: StartPrometheus,
) -> None:
    prometheus = start_prometheus([], scrape_interval="1s")
    manifests.write(
        "servers.yaml",
        "---\n".join(
            (
                server_doc("edge-a", triton.grpc_address, model_repository,
                           metrics=triton.metrics_url),
                server_doc("edge-poll", modes["poll"].grpc_address, None),
                server_doc("edge-none", modes["none"].grpc_address, None),
                server_doc("edge-gone", f"127.0.0.1:{free_port()}", None),
            )
        ),
    )  # fmt: skip
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
    manifests.commit("four servers")
    common = ("--repo", manifests.url, "--state", str(tmp_path / "state.db"),
              "--cache-dir", str(tmp_path / "cache"), "--call-timeout", "2")  # fmt: skip

    run = cli("check", *common, "--prometheus-url", prometheus.url, "--output", "json")
    assert run.code == 1, run.explain()
    checks = {c["name"]: c for c in run.json()["checks"]}
    results = {name: c["result"] for name, c in checks.items()}
    assert results == {
        "git": "ok",
        "manifests": "ok",
        "state": "ok",
        "prometheus": "ok",
        "server edge-a": "ok",
        "server edge-a model control": "ok",
        "server edge-a repository": "ok",
        "server edge-a metrics": "ok",
        "server edge-gone": "fail",
        "server edge-none": "ok",
        "server edge-none model control": "fail",
        "server edge-none metrics": "warn",
        "server edge-poll": "ok",
        "server edge-poll model control": "fail",
        "server edge-poll metrics": "warn",
    }, run.out
    assert checks["server edge-a"]["detail"] == f"Triton 2.51.0 at {triton.grpc_address}"
    for mode in ("poll", "none"):
        refused = checks[f"server edge-{mode} model control"]
        assert refused["fix"] == "start tritonserver with --model-control-mode=explicit"
        assert refused["detail"].startswith("POLL or NONE")
    assert checks["server edge-gone"]["fix"].startswith("check that tritonserver runs at")
    # Nothing was loaded or unloaded anywhere: the EXPLICIT server still serves nothing.
    assert cli("status", *common).code == 0

    # --pre asks no server; text output names each failure's fix under it.
    pre = cli("check", *common, "--pre")
    assert pre.code == 0, pre.explain()
    assert "server edge" not in pre.out and pre.out.strip().endswith("all 3 checks passed")
    down = cli("check", *common, "--pre", "--alertmanager-url", f"http://127.0.0.1:{free_port()}")
    assert down.code == 1
    assert "FAIL alertmanager: http://127.0.0.1:" in down.out
    assert "     fix: --alertmanager-url: its base URL" in down.out
