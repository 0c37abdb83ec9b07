"""What the end-to-end tests ask a real Triton: which versions are READY, which one answers.

The manifests as text and the in-process CLI are in ``testkit`` (``testkit.manifests``,
``testkit.cli_run``), shared with the benchmarks and the demo.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as triton_grpc

from reconciler.adapters.state import StateStore
from testkit.local_triton import LocalTriton


def live_servers(state: str | Path, model: str) -> dict[str, dict[str, Any]]:
    """Server -> what the live view (``status --watch``) of the apply writing the state
    store at ``state`` shows of ``model`` there: when a test acts on a step in progress
    (an analysis running), this says it runs, where a sleep guesses."""
    store = StateStore(Path(state), read_only=True)
    try:
        snapshot = store.live() or {"rollouts": []}
    finally:
        store.close()
    return {
        server: dict(entry)
        for rollout in snapshot["rollouts"]
        if rollout["model"] == model
        for server, entry in rollout["servers"].items()
    }


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
