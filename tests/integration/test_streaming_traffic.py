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

import pytest
import tritonclient.grpc as triton_grpc

from reconciler.adapters.envoy import EnvoyRouter
from reconciler.model.traffic import EnvoyRoute, Pool, RouterSpec
from testkit.envoy import LocalEnvoy
from testkit.loadgen import Stream, StreamClient
from testkit.local_triton import LocalTriton
from testkit.manifests import GENERATOR, write_generator_repository
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
