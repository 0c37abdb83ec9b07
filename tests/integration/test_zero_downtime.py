"""Zero downtime: clients sending unversioned requests all along see no failure."""

from __future__ import annotations

from pathlib import Path

from testkit.cli_run import Reconciler
from testkit.loadgen import WITNESS_PAUSE, LoadGenerator
from testkit.local_triton import LocalTriton
from testkit.manifests import ManifestRepo, deployment_doc, server_doc
from tests.integration.flows import ready_versions


def test_swaps_under_load_drop_no_request(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    reconciler = Reconciler(manifests.url, tmp_path / "reconciler")
    manifests.write("servers.yaml", server_doc("edge-a", triton.grpc_address, model_repository))
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"], expect_factor=1))
    manifests.commit("deploy echo 1")
    assert reconciler.apply().code == 0

    with LoadGenerator(triton.grpc_address, "echo", threads=4, pause=WITNESS_PAUSE) as load:
        load.wait_for_samples(200)
        manifests.write("echo.yaml", deployment_doc("echo", [2], ["edge-a"], expect_factor=2))
        manifests.commit("bump echo to 2")
        assert reconciler.apply().code == 0
        load.wait_for_samples(len(load.samples) + 200)
        manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"], expect_factor=1))
        manifests.commit("and back to 1")
        assert reconciler.apply().code == 0
        load.wait_for_samples(len(load.samples) + 200)
    samples = load.samples

    assert ready_versions(triton, "echo") == {1}
    assert load.failures == []
    assert len(samples) >= 600
    # Both swaps really happened under the clients: they were answered by 1, then 2, then 1.
    answered = [s.version for s in sorted(samples, key=lambda s: s.started)]
    changes = [v for i, v in enumerate(answered) if i == 0 or v != answered[i - 1]]
    assert changes[0] == 1 and 2 in changes and changes[-1] == 1
