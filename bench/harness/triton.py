"""The benchmarks' own view of a Triton server: its repository index, read with tritonclient
gRPC, and loads done by hand (the floors the reconciler is measured against).

One ``Index`` per server. ``settle`` is what every scenario waits for between two changes:
exactly one version READY and nothing LOADING or UNLOADING, except versions that Triton is
known to leave UNLOADING (see ``stuck_unloading``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection
from typing import Any

import tritonclient.grpc as triton_grpc

from bench.harness.errors import BenchError
from reconciler.core.triton_config import with_versions

POLL_S = 0.01


def wait_for(
    condition: Callable[[], bool], timeout: float, what: str, poll: float = POLL_S
) -> float:
    """time.monotonic() when ``condition`` first held (an exception counts as not yet);
    BenchError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():
                return time.monotonic()
        except Exception:  # the server restarting, a connection refused: not yet
            pass
        if time.monotonic() > deadline:
            raise BenchError(f"not within {timeout:g} s: {what}")
        time.sleep(poll)


class Index:
    """One server's repository index and model control, as the benchmark sees them.

    ``own_subchannel``: a gRPC subchannel of this client's own, so that it is never one left
    in backoff by another client after a server restart.
    """

    def __init__(self, address: str, *, own_subchannel: bool = False) -> None:
        options = [("grpc.use_local_subchannel_pool", 1)] if own_subchannel else None
        self.client = triton_grpc.InferenceServerClient(address, channel_args=options)

    def close(self) -> None:
        self.client.close()

    def server_version(self) -> str:
        return str(self.client.get_server_metadata(as_json=True)["version"])

    def states(self, model: str) -> dict[int, str]:
        index = self.client.get_model_repository_index(as_json=True).get("models", [])
        return {
            int(m["version"]): str(m.get("state", ""))
            for m in index
            if m.get("name") == model and m.get("version")
        }

    def ready(self, model: str) -> set[int]:
        return {v for v, s in self.states(model).items() if s == "READY"}

    def ready_models(self) -> set[str]:
        index = self.client.get_model_repository_index(as_json=True).get("models", [])
        return {str(m["name"]) for m in index if m.get("state") == "READY"}

    def is_settled(
        self, model: str, version: int, stuck_unloading: Collection[int] = ()
    ) -> dict[int, str] | None:
        """The states when ``version`` alone is READY and nothing else is LOADING or
        UNLOADING (versions in ``stuck_unloading`` may stay UNLOADING); else None."""
        states = self.states(model)
        ready = {v for v, s in states.items() if s == "READY"}
        busy = {
            v
            for v, s in states.items()
            if s == "LOADING" or (s == "UNLOADING" and v not in stuck_unloading)
        }
        return states if ready == {version} and not busy else None

    def settle(
        self,
        model: str,
        version: int,
        timeout: float = 60.0,
        stuck_unloading: Collection[int] = (),
    ) -> dict[int, str]:
        """Wait until ``is_settled``; the states it settled on. BenchError after ``timeout``.

        ``stuck_unloading``: Triton 2.51 never finishes unloading a Python-backend version
        whose ``execute`` raised (it stays UNLOADING, its stub process alive; a later load of
        it starts a new instance beside it), so waiting for it would never end."""
        deadline = time.monotonic() + timeout
        while True:
            settled = self.is_settled(model, version, stuck_unloading)
            if settled is not None:
                return settled
            if time.monotonic() > deadline:
                raise BenchError(f"{model} did not settle on {version}: {self.states(model)}")
            time.sleep(0.02)

    def config(self, model: str) -> dict[str, Any]:
        """The config the model runs with: what the reconciler reads to build its loads."""
        return dict(self.client.get_model_config(model, as_json=True)["config"])

    def load(self, model: str, config: dict[str, Any], versions: list[int]) -> None:
        """Load ``model`` with ``config`` and exactly ``versions``, as the reconciler does."""
        body = json.dumps(with_versions(config, model, versions))
        self.client.load_model(model, config=body, client_timeout=600)

    def serves_alone(self, model: str, version: int) -> Callable[[], bool]:
        """A condition for ``wait_for``: ``version`` is the one READY version."""
        return lambda: self.ready(model) == {version}
