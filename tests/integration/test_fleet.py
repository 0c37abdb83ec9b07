"""A fleet found through one name: real tritonservers on 127.0.0.2-5, a hosts file the test
controls standing in for the DNS of a headless Service."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.local_triton import LocalTriton, free_port
from tests.conftest import ManifestRepo
from tests.integration.flows import Reconciler, cli, deployment_doc, ready_versions
from tests.loadgen import LoadGenerator

ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")


@pytest.fixture
def fleet(model_repository: Path, tmp_path: Path) -> Iterator[dict[str, LocalTriton]]:
    # One gRPC and one metrics port for every instance, as a Service's pods have.
    grpc_port, metrics_port = free_port(), free_port()
    servers: dict[str, LocalTriton] = {}
    try:
        for address in ADDRESSES:
            servers[address] = LocalTriton(
                model_repository,
                host=address,
                grpc_port=grpc_port,
                metrics_port=metrics_port,
                log_file=tmp_path / f"triton-{address}.log",
            ).start()
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def _manifests(manifests: ManifestRepo, fleet: dict[str, LocalTriton], repository: Path) -> None:
    any_server = next(iter(fleet.values()))
    manifests.write(
        "servers.yaml",
        "apiVersion: triton-gitops/v1alpha1\nkind: TritonServer\nmetadata:\n  name: pool\n"
        "spec:\n  discovery:\n"
        "    dns: triton-headless.models.test\n"
        f"    grpcPort: {any_server.grpc_port}\n"
        f"    metricsPort: {any_server.metrics_port}\n"
        f"  modelRepository: {repository}\n",
    )


def test_instances_are_discovered_added_and_dropped(
    manifests: ManifestRepo,
    fleet: dict[str, LocalTriton],
    model_repository: Path,
    tmp_path: Path,
) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(f"triton-headless.models.test {' '.join(ADDRESSES[:3])}\n")
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    options = ("--hosts-file", str(hosts))
    _manifests(manifests, fleet, model_repository)
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["pool"]))
    manifests.commit("echo 1 on the pool")

    planned = reconciler.plan(*options, "--output", "json")
    assert planned.code == 2, planned.err
    assert sorted({s["server"] for s in planned.json()["steps"]}) == [
        f"pool/{a}" for a in ADDRESSES[:3]
    ]
    assert reconciler.apply(*options).code == 0
    assert [ready_versions(fleet[a], "echo") for a in ADDRESSES] == [{1}, {1}, {1}, set()]

    # A fourth instance appears in DNS: it is brought to the desired state.
    hosts.write_text(f"triton-headless.models.test {' '.join(ADDRESSES)}\n")
    assert reconciler.apply(*options).code == 0
    assert ready_versions(fleet[ADDRESSES[3]], "echo") == {1}

    # A version bump across the fleet, with clients spread over every instance.
    manifests.write("echo.yaml", deployment_doc("echo", [2], ["pool"]))
    manifests.commit("echo 2 on the pool")
    loads = [LoadGenerator(fleet[a].grpc_address, "echo", threads=1).start() for a in ADDRESSES]
    try:
        assert reconciler.apply(*options).code == 0
    finally:
        samples = [load.stop() for load in loads]
    assert all(s.error is None for sample in samples for s in sample)
    assert all(ready_versions(fleet[a], "echo") == {2} for a in ADDRESSES)

    # An instance leaves DNS: it is dropped, not "emptied" (nothing refused, nothing
    # unloaded there), and status no longer lists it.
    hosts.write_text(f"triton-headless.models.test {' '.join(ADDRESSES[1:])}\n")
    assert reconciler.apply(*options).code == 0
    shown = cli("status", *reconciler.options, *options, "--output", "json")
    assert sorted({m["server"] for m in shown.json()["models"]}) == [
        f"pool/{a}" for a in ADDRESSES[1:]
    ]
    assert all(m["state"] == "in-sync" for m in shown.json()["models"])


def test_a_name_that_does_not_resolve_is_an_error_naming_it(
    manifests: ManifestRepo, model_repository: Path, tmp_path: Path
) -> None:
    manifests.write(
        "servers.yaml",
        "apiVersion: triton-gitops/v1alpha1\nkind: TritonServer\nmetadata:\n  name: pool\n"
        "spec:\n  discovery: {dns: no-such-name.invalid, grpcPort: 8001}\n"
        f"  modelRepository: {model_repository}\n",
    )
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["pool"]))
    manifests.commit("a pool nobody can find")
    result = Reconciler(manifests.url, tmp_path / "r").apply()
    assert result.code == 1
    assert "cannot resolve no-such-name.invalid" in result.err


@pytest.mark.parametrize(
    "spec",
    [
        "  grpc: 127.0.0.1:8001\n  discovery: {dns: pool.test, grpcPort: 8001}\n",
        "  modelRepository: /models\n",
        "  discovery: {dns: pool.test, grpcPort: 8001}\n  metrics: http://127.0.0.1:8002\n",
    ],
    ids=["both", "neither", "metrics-url-with-discovery"],
)
def test_exactly_one_of_grpc_or_discovery(spec: str, tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(
        "apiVersion: triton-gitops/v1alpha1\nkind: TritonServer\nmetadata:\n  name: pool\n"
        "spec:\n" + spec
    )
    result = cli("validate", str(tmp_path))
    assert result.code == 1
    assert "s.yaml:5: spec: exactly one of grpc (with an optional metrics URL) or discovery" in (
        result.err
    )
