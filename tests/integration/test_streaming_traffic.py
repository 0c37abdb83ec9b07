"""Streams through a real router (issue 42, point 4): one Envoy on loopback in front of two
real tritonservers serving the streaming test model ``gen`` (testkit/models/gen/model.py),
the stable pool [a] on version 1 and the canary pool [c] on version 2, so that each
response's ``model_version`` tells the pool.

Envoy keeps a gRPC stream on the backend that started it: a route weight is a share of the
streams started, and a change of weights (a canary step, a blue-green switch, a switch back)
moves only the streams that start after it. Measured here, with the reconciler's own router
adapter setting the weights and clients streaming all along.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as triton_grpc

from reconciler.adapters.envoy import EnvoyRouter
from reconciler.model.traffic import EnvoyRoute, Pool, RouterSpec
from testkit.cli_run import Reconciler
from testkit.envoy import LocalEnvoy
from testkit.loadgen import Stream, StreamClient
from testkit.local_triton import LocalTriton
from testkit.manifests import (
    GENERATOR,
    ManifestRepo,
    router_doc,
    server_doc,
    write_generator_repository,
)
from tests.integration.flows import ready_versions
from tests.services import envoy_or_skip

pytestmark = pytest.mark.triton

# Generations of 20 tokens 10 ms apart (0.2 s), from four client threads one after another:
# streams are in flight at every change of weights.
TOKENS = 20
LONG = {"tokens": str(TOKENS), "token_ms": "10"}


class Pools:
    def __init__(self, stable: LocalTriton, canary: LocalTriton, envoy: LocalEnvoy) -> None:
        self.stable, self.canary, self.envoy = stable, canary, envoy
        spec = RouterSpec(
            "edge",
            (Pool("stable", server_names=("a",)), Pool("canary", server_names=("c",))),
            envoy=EnvoyRoute(envoy.admin_url, "routing.triton", "mirror.triton"),
        )
        self.router = EnvoyRouter(spec)

    def weights(self, canary_percent: int) -> None:
        share = canary_percent * 100
        self.router.route({"stable": 10_000 - share, "canary": share}, {})


def _load(server: LocalTriton, version: int, parameters: dict[str, str]) -> None:
    # A load's config replaces config.pbtxt whole (triton-on-cpu.md): all of it, as the
    # reconciler sends it.
    config = {
        "backend": "python",
        "max_batch_size": 0,
        "model_transaction_policy": {"decoupled": True},
        "input": [{"name": "PROMPT", "data_type": "TYPE_INT32", "dims": [-1]}],
        "output": [{"name": "TOKEN", "data_type": "TYPE_INT32", "dims": [1]}],
        # Two instances: a Python generator runs one request at a time per instance.
        "instance_group": [{"kind": "KIND_CPU", "count": 2}],
        "parameters": {k: {"string_value": v} for k, v in parameters.items()},
        "version_policy": {"specific": {"versions": [version]}},
    }
    with triton_grpc.InferenceServerClient(server.grpc_address) as client:
        client.load_model(GENERATOR, config=json.dumps(config))


@pytest.fixture(scope="module")
def pools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pools]:
    envoy_or_skip()
    root = tmp_path_factory.mktemp("streaming-traffic")
    models = write_generator_repository(root / "models")
    servers = [LocalTriton(models, log_file=root / f"triton-{n}.log") for n in "ac"]
    envoy: LocalEnvoy | None = None
    try:
        for server in servers:
            server.start()
        stable, canary = servers
        envoy = LocalEnvoy.of(
            root / "envoy",
            {"stable": [stable.grpc_address], "canary": [canary.grpc_address]},
            {"stable": 10_000},
        ).start()
        yield Pools(stable, canary, envoy)
    finally:
        if envoy is not None:
            envoy.stop()
        for server in servers:
            server.stop()


def _between(streams: list[Stream], start: float, end: float) -> list[Stream]:
    return [s for s in streams if start <= s.started < end]


def test_a_weight_is_a_share_of_streams_and_no_stream_is_cut_by_a_change(pools: Pools) -> None:
    _load(pools.stable, 1, LONG)
    _load(pools.canary, 2, LONG)
    steps = (0, 10, 50, 100, 0)  # canary steps, the switch to the new pool, the switch back
    windows: list[tuple[int, float, float]] = []
    with StreamClient(pools.envoy.address, GENERATOR, threads=4) as clients:
        for percent in steps:
            pools.weights(percent)
            began = time.monotonic()
            time.sleep(5.0)
            windows.append((percent, began, time.monotonic()))
    streams = clients.streams
    cut = [s for s in streams if s.error is not None or len(s.tokens) != TOKENS]
    assert cut == [], f"{len(cut)} of {len(streams)} streams cut or short, first: {cut[:2]}"
    mixed = [s.versions for s in streams if len(set(s.versions)) != 1]
    assert mixed == [], f"streams answered by both pools: {mixed[:3]}"
    shares = []
    for percent, start, end in windows:
        # Streams that started after the change (and a stream's setup) took the new weights.
        placed = _between(streams, start + 0.2, end)
        n = len(placed)
        on_canary = sum(s.versions[0] == "2" for s in placed) if n else 0
        p = percent / 100
        allowed = max(3 * math.sqrt(p * (1 - p) / n), 0.02) if n else 0.0
        shares.append((percent, n, on_canary / n if n else None, allowed))
        assert n >= 20, f"too few streams at {percent}%: {shares}"
        assert abs(on_canary / n - p) <= allowed, f"share of streams off the weight: {shares}"


def _deployment(version: int) -> str:
    return (
        "apiVersion: triton-gitops.dev/v1alpha1\n"
        "kind: ModelDeployment\n"
        "metadata: {name: gen}\n"
        "spec:\n"
        "  servers: {names: [a, c]}\n"
        f"  versions: [{version}]\n"
        "  config:\n"
        "    parameters: {tokens: {string_value: '20'}, token_ms: {string_value: '10'}}\n"
        "    instance_group: [{kind: KIND_CPU, count: 2}]\n"
        "  verify:\n"
        "    analysis:\n"
        "      interval: 1s\n"
        "      duration: 3s\n"
        "      probes: {maxShare: 0.5, timeout: 5s}\n"
        "      checks:\n"
        "        - name: success-rate\n"
        "          successRate: {min: 0.99}\n"
        "  rollout:\n"
        "    traffic: {router: edge, strategy: canary, stablePool: stable, canaryPool: canary,"
        " steps: [50%]}\n"
    )


def test_the_reconciler_rolls_a_streaming_model_through_envoy_without_cutting_a_stream(
    pools: Pools, manifests: ManifestRepo, tmp_path: Path
) -> None:
    """A canary rollout of the streaming model by the reconciler itself, clients streaming
    through Envoy all along: the good version is promoted with no client stream cut; one
    that errors in every stream is caught by the streaming probes before any client is
    moved to it, and the serving version stays."""
    for name, server in (("a", pools.stable), ("c", pools.canary)):
        with triton_grpc.InferenceServerClient(server.grpc_address) as client:
            client.unload_model(GENERATOR)
        manifests.write(
            f"servers/{name}.yaml",
            server_doc(
                name, server.grpc_address, server.model_repository, metrics=server.metrics_url
            ),
        )
    manifests.write(
        "router.yaml", router_doc(pools.envoy.admin_url, {"stable": ["a"], "canary": ["c"]})
    )
    manifests.write("gen.yaml", _deployment(1))
    manifests.commit("gen 1 through the router")
    reconciler = Reconciler(manifests.url, tmp_path / "reconciler")
    first = reconciler.apply()
    assert first.code == 0, first.explain()
    for version, expected in ((2, 0), (3, 1)):
        manifests.write("gen.yaml", _deployment(version))
        manifests.commit(f"gen {version}")
        with StreamClient(pools.envoy.address, GENERATOR, threads=2) as clients:
            time.sleep(0.5)
            result = reconciler.apply("--output", "json")
            time.sleep(0.5)
        assert result.code == expected, result.explain()
        cut = [s for s in clients.streams if s.error is not None or len(s.tokens) != 20]
        assert cut == [], f"{len(cut)} of {len(clients.streams)} client streams cut: {cut[:2]}"
    served = {s.versions[0] for s in clients.streams}
    assert served == {"2"}, f"clients reached {served} while version 3 was tried"
    assert ready_versions(pools.stable, GENERATOR) == {2}
    assert ready_versions(pools.canary, GENERATOR) == {2}
