"""Triton adapter: model control and observation over gRPC (tritonclient).

The only module that imports tritonclient's gRPC client. Observation reads the repository
index (the source of truth for which versions are loaded; ``get_model_config`` may be stale for
versions reused in place), for loaded models the config they run with, and for one loaded
version its interface (inputs and outputs, from the model metadata). Library errors are
re-raised as ours: an unreachable server as ``ServerUnavailable``, a refused load with Triton's
own message as ``LoadFailed``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from reconciler.adapters.model_repository import read_model
from reconciler.errors import LoadFailed, ServerUnavailable, StepFailed, UnloadFailed, VerifyFailed
from reconciler.serving import (
    ModelInterface,
    ModelState,
    ServerState,
    TensorSignature,
    VersionState,
)
from reconciler.smoke import as_array
from reconciler.spec.model import Tensor, TritonServer

_UNREACHABLE = {"StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED"}


def _unreachable(exc: InferenceServerException) -> bool:
    return str(exc.status()) in _UNREACHABLE


def _not_ready(exc: InferenceServerException) -> bool:
    """Triton's own refusal for a model or version that is not READY. It comes with the same
    gRPC code as an unreachable server (UNAVAILABLE), but the server did answer."""
    return str(exc.message()).startswith("Request for unknown model")


def _signature(tensor: Mapping[str, Any]) -> TensorSignature:
    # The JSON form renders int64 dims as strings.
    return TensorSignature(
        str(tensor["name"]),
        str(tensor["datatype"]),
        tuple(int(d) for d in tensor.get("shape", [])),
    )


class TritonServerClient:
    """One Triton server, as the planner observes it and as apply drives it."""

    def __init__(
        self,
        name: str,
        address: str,
        *,
        load_timeout: float = 600.0,
        call_timeout: float = 10.0,
        model_repository: str | None = None,
    ) -> None:
        self.name = name
        self.address = address
        self.load_timeout = load_timeout
        self.call_timeout = call_timeout
        self.model_repository = model_repository
        self._client = triton_grpc.InferenceServerClient(url=address)

    @classmethod
    def for_server(cls, server: TritonServer, **options: Any) -> TritonServerClient:
        return cls(server.name, server.grpc, model_repository=server.model_repository, **options)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> TritonServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _error(self, exc: InferenceServerException, doing: str) -> Exception:
        if _unreachable(exc):
            return ServerUnavailable(self.name, f"{self.address} did not answer ({doing})")
        return StepFailed(f"server {self.name}: {doing}: {exc.message()}")

    # -- observation -------------------------------------------------------------------------

    def index(self) -> list[dict[str, Any]]:
        try:
            answer = self._client.get_model_repository_index(
                as_json=True, client_timeout=self.call_timeout
            )
        except InferenceServerException as exc:
            raise self._error(exc, "reading the repository index") from exc
        return list(answer.get("models", []))

    def _loaded_config(self, model: str) -> dict[str, Any] | None:
        try:
            answer = self._client.get_model_config(
                model, as_json=True, client_timeout=self.call_timeout
            )
        except InferenceServerException as exc:
            if _unreachable(exc):
                raise self._error(exc, f"reading the config of {model}") from exc
            return None  # unloaded between the index and this call
        return dict(answer.get("config", {}))

    @staticmethod
    def _states(entries: Iterable[dict[str, Any]], model: str) -> tuple[VersionState, ...]:
        return tuple(
            sorted(
                (
                    VersionState(int(e["version"]), e.get("state", ""), e.get("reason", ""))
                    for e in entries
                    if e.get("name") == model and e.get("version")
                ),
                key=lambda v: v.version,
            )
        )

    def model_state(self, model: str) -> ModelState:
        return ModelState(model, self._states(self.index(), model))

    def observe(self, models: Iterable[str]) -> ServerState:
        """What the server serves of ``models``, and what its model repository holds."""
        try:
            entries = self.index()
        except ServerUnavailable as exc:
            return ServerState(self.name, error=str(exc))
        except StepFailed as exc:
            return ServerState(self.name, error=str(exc))
        states: dict[str, ModelState] = {}
        try:
            for model in models:
                versions = self._states(entries, model)
                loaded = (
                    self._loaded_config(model)
                    if any(v.state == "READY" for v in versions)
                    else None
                )
                repository_config, repository_versions = (
                    read_model(self.model_repository, model)
                    if self.model_repository
                    else (None, None)
                )
                states[model] = ModelState(
                    model, versions, loaded, repository_config, repository_versions
                )
        except ServerUnavailable as exc:
            return ServerState(self.name, error=str(exc))
        return ServerState(
            self.name,
            states,
            frozenset(str(e["name"]) for e in entries if e.get("name")),
        )

    def interface(self, model: str, version: int) -> ModelInterface:
        """The inputs and outputs ``version`` of ``model`` serves; the version must be loaded.

        Triton answers from the config the version runs with, so a config change that renames
        a tensor shows here as soon as the new load is in place: read the old versions'
        interface before loading the new ones.
        """
        doing = f"reading the interface of {model} version {version}"
        try:
            answer = self._client.get_model_metadata(
                model, model_version=str(version), as_json=True, client_timeout=self.call_timeout
            )
        except InferenceServerException as exc:
            if _unreachable(exc) and not _not_ready(exc):
                raise self._error(exc, doing) from exc
            raise VerifyFailed(f"server {self.name}: {doing}: {exc.message()}") from exc
        try:
            return ModelInterface(
                inputs=tuple(_signature(t) for t in answer.get("inputs", [])),
                outputs=tuple(_signature(t) for t in answer.get("outputs", [])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise VerifyFailed(f"server {self.name}: {doing}: unreadable metadata") from exc

    # -- control -----------------------------------------------------------------------------

    def load(self, model: str, config: Mapping[str, Any]) -> None:
        try:
            self._client.load_model(
                model, config=json.dumps(config), client_timeout=self.load_timeout
            )
        except InferenceServerException as exc:
            if str(exc.status()) == "StatusCode.DEADLINE_EXCEEDED":
                # Triton has no server-side load timeout: the load goes on there. Transient,
                # like an unreachable server: nothing is put back or held, and the next pass
                # waits for this load (its versions show LOADING) instead of starting another.
                raise ServerUnavailable(
                    self.name,
                    f"load of {model} not finished after {self.load_timeout:g}s "
                    "(--load-timeout); Triton goes on loading it, the next pass waits for it",
                ) from exc
            if _unreachable(exc):
                raise self._error(exc, f"loading {model}") from exc
            raise LoadFailed(f"server {self.name}: {exc.message()}") from exc

    def unload(self, model: str) -> None:
        try:
            self._client.unload_model(model, client_timeout=self.call_timeout)
        except InferenceServerException as exc:
            if _unreachable(exc):
                raise self._error(exc, f"unloading {model}") from exc
            raise UnloadFailed(f"server {self.name}: {exc.message()}") from exc

    def infer(
        self, model: str, version: int, inputs: tuple[Tensor, ...], outputs: tuple[str, ...]
    ) -> dict[str, npt.NDArray[np.generic]]:
        request = []
        for tensor in inputs:
            data = as_array(tensor)
            item = triton_grpc.InferInput(tensor.name, list(data.shape), tensor.datatype)
            item.set_data_from_numpy(data)
            request.append(item)
        try:
            result = self._client.infer(
                model,
                request,
                model_version=str(version),
                outputs=[triton_grpc.InferRequestedOutput(name) for name in outputs] or None,
                client_timeout=self.call_timeout,
            )
        except InferenceServerException as exc:
            # "not at ready state" comes with the unreachable code too; the server answered.
            if _unreachable(exc) and not _not_ready(exc):
                raise self._error(exc, f"inferring {model} version {version}") from exc
            raise VerifyFailed(
                f"server {self.name}: inference on {model} version {version}: {exc.message()}"
            ) from exc
        answer: dict[str, npt.NDArray[np.generic]] = {}
        for name in outputs:
            array = result.as_numpy(name)
            if array is not None:
                answer[name] = array
        return answer
