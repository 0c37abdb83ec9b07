"""Triton adapter: model control and observation over gRPC (tritonclient).

The only module that imports tritonclient's gRPC client. Observation reads the repository
index (the source of truth for which versions are loaded; ``get_model_config`` may be stale for
versions reused in place), for loaded models the config they run with, and for one loaded
version its interface (inputs and outputs, from the model metadata). Library errors are
re-raised as ours: an unreachable server as ``ServerUnavailable``, a refused load with Triton's
own message as ``LoadFailed``. A failed call on a server whose model repository is in object
storage asks that store once (``model_repository.store_trouble``): when it cannot be read
either, the error names the store and its cause first, since Triton waits on it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from reconciler.adapters.config_memory import ConfigMemory, ServerConfigs
from reconciler.adapters.model_repository import read_model, store_trouble
from reconciler.adapters.triton_channel import channel_options
from reconciler.adapters.triton_configs import read_configs
from reconciler.adapters.triton_sequence import correlation_id, start_deadline, whole_sequence
from reconciler.adapters.triton_stream import StreamRequest, stream_once
from reconciler.core.exchange import MAX_RESPONSES, Reply
from reconciler.core.smoke import as_array
from reconciler.credentials import redact
from reconciler.model.errors import (
    LoadFailed,
    ProbeTimedOut,
    RepositoryUnavailable,
    ServerUnavailable,
    StepFailed,
    UnloadFailed,
    VerifyFailed,
)
from reconciler.model.repository import RepositoryModel
from reconciler.model.servers import TritonServer
from reconciler.model.serving import (
    READY,
    DeviceMemory,
    ModelInterface,
    ModelState,
    ServerState,
    TensorSignature,
    VersionState,
)
from reconciler.model.spec import Tensor

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


@dataclass(frozen=True)
class _LastObservation:
    raw: bytes  # the repository index as the server sent it
    models: tuple[str, ...]  # the models asked about
    state: ServerState
    due: float  # the earliest config recheck among them


_EPOCHS = itertools.count()

_READY = grpc.ChannelConnectivity.READY


def infer_inputs(tensors: tuple[Tensor, ...]) -> list[triton_grpc.InferInput]:
    """A request's inputs for tritonclient, from manifest tensors (also the gate's load
    generator's, ``adapters/triton_load.py``)."""
    items = []
    for tensor in tensors:
        data = as_array(tensor)
        item = triton_grpc.InferInput(tensor.name, list(data.shape), tensor.datatype)
        item.set_data_from_numpy(data)
        items.append(item)
    return items


class TritonServerClient:
    """One Triton server, as the planner observes it and as apply drives it.

    A client kept from pass to pass (the service does) remembers the configs it read; a new
    client reads them all.
    """

    def __init__(
        self,
        name: str,
        address: str,
        *,
        load_timeout: float = 600.0,
        call_timeout: float = 10.0,
        model_repository: str | None = None,
        config_recheck: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        keep_connection: bool = False,
        config_memory: ConfigMemory | None = None,
    ) -> None:
        self.name = name
        self.address = address
        self.load_timeout = load_timeout
        self.call_timeout = call_timeout
        self.model_repository = model_repository
        self.config_recheck = config_recheck
        self._clock = clock
        self._configs = ServerConfigs(name, address, config_recheck, clock, config_memory)
        self._last: _LastObservation | None = None
        # Tokens of two clients never compare equal, even for one server.
        self._epoch = next(_EPOCHS)
        self._client = triton_grpc.InferenceServerClient(
            url=address, channel_args=channel_options(keep_connection)
        )
        # Whether the connection answered a call since its last drop was told, and whom to
        # tell (``when_dropped``).
        self._connection_lock = threading.Lock()
        self._connection_answered = False
        self._dropped: list[Callable[[], None]] = []

    @classmethod
    def for_server(cls, server: TritonServer, **options: Any) -> TritonServerClient:
        return cls(server.name, server.grpc, model_repository=server.model_repository, **options)

    def close(self) -> None:
        self._configs.remember()  # for the next process's clients (adapters/config_memory.py)
        self._client.close()

    def __enter__(self) -> TritonServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _error(self, exc: InferenceServerException, doing: str) -> Exception:
        # Triton reads its models from the repository's store on index reads and loads, and
        # waits on it (about 25 s for a store that refuses connections, measured on 2.51),
        # so a store that is down shows first as a Triton that does not answer: the store is
        # asked once, and when it fails too the message names it first.
        trouble = store_trouble(self.model_repository) if self.model_repository else None
        if trouble is not None:
            symptom = (
                f"did not answer either ({doing})"
                if _unreachable(exc)
                else f"failed too ({doing}: {exc.message()})"
            )
            return ServerUnavailable(
                self.name,
                f"{trouble}; Triton at {self.address} {symptom}: it reads its models from that "
                "store",
                repository=trouble.url,
            )
        if _unreachable(exc):
            return ServerUnavailable(self.name, f"{self.address} did not answer ({doing})")
        return StepFailed(f"server {self.name}: {doing}: {exc.message()}")

    def _hung(self, exc: InferenceServerException) -> str | None:
        """Why a call out of time on a server that answers at once is the version's; None
        when it is not that. Taken for a lost server, a version that hangs was neither put
        back nor held, and the next pass promoted it unverified (a hand check, 2026-12-07)."""
        if str(exc.status()) == "StatusCode.DEADLINE_EXCEEDED":
            with contextlib.suppress(InferenceServerException):
                if self._client.is_server_live(client_timeout=min(self.call_timeout, 2.0)):
                    return (
                        f"no answer within {self.call_timeout:g}s (--call-timeout) while the "
                        "server answers: the version hangs, or is slower than that"
                    )
        return None

    def _unobserved(self, exc: ServerUnavailable | StepFailed) -> str:
        # A ServerState names its server: its error says only why, so that a plan problem
        # or a status line that shows the name shows it once.
        if isinstance(exc, ServerUnavailable):
            return exc.reason
        return str(exc).removeprefix(f"server {self.name}: ")

    # -- observation -------------------------------------------------------------------------

    def _index_answer(self) -> Any:
        # Protobuf, not as_json: the JSON round trip costs three times the call itself.
        try:
            answer = self._client.get_model_repository_index(client_timeout=self.call_timeout)
        except InferenceServerException as exc:
            raise self._error(exc, "reading the repository index") from exc
        self._answered()
        return answer

    def _index(self) -> list[Any]:
        return list(self._index_answer().models)

    def version_states(self) -> dict[str, dict[int, str]]:
        """Per model in the repository index, each version's state (READY, LOADING,
        UNLOADING, UNAVAILABLE), from one index call: the service's watch reads it between
        passes (``model.serving.ready_in`` gives the versions READY)."""
        states: dict[str, dict[int, str]] = {}
        for entry in self._index():
            if entry.version:
                states.setdefault(str(entry.name), {})[int(entry.version)] = str(entry.state)
        return states

    # -- the connection (the service's watch, ``ports.ServerConnection``) --------------------
    #
    # Both read the state of tritonclient's own channel (``InferenceServerClient._channel``,
    # the one its calls go over; tritonclient offers no accessor), so that the connection
    # watched is the one the watch's index readings travel on. A drop is told once per
    # connection that answered a call: by gRPC's event, or by ``connected`` when it finds
    # the connection down first (gRPC's events tell only the states its thread saw, and a
    # connection that went down within milliseconds of being made may pass unseen).

    def connected(self) -> bool:
        """Whether the channel holds an established connection now (READY). Asked of gRPC's
        core, with no call to the server and no wait: the core sees a closed socket at once,
        where ``subscribe`` tells Python later, from a thread of its own (2 to 6 ms measured
        here, more on a busy host), and a restarted Triton answers its index, empty, about
        100 ms after its old process ended. ``_channel`` of grpc's Channel is the core's
        channel; its ``check_connectivity_state`` is what ``subscribe`` itself polls."""
        state = self._client._channel._channel.check_connectivity_state(False)
        up = bool(state == _READY.value[0])
        if not up:
            self._went_down()
        return up

    def when_dropped(self, dropped: Callable[[], None]) -> None:
        """Call ``dropped`` once for each connection that answered a call and then went
        down. gRPC watches the channel from one thread per channel (it wakes 5 times a
        second; no call is made to the server)."""
        self._dropped.append(dropped)
        self._client._channel.subscribe(self._state_changed, try_to_connect=False)

    def _state_changed(self, state: grpc.ChannelConnectivity) -> None:
        if state is not _READY:
            # ``connected`` asks the core and tells the drop; an event late enough that a
            # call has made another connection since finds it up (the drop was told before
            # that call: the watch asks ``connected`` before each reading).
            self.connected()

    def _answered(self) -> None:
        with self._connection_lock:
            self._connection_answered = True

    def _went_down(self) -> None:
        with self._connection_lock:
            answered, self._connection_answered = self._connection_answered, False
        if answered:
            for dropped in self._dropped:
                dropped()

    def _loaded_config(self, model: str) -> dict[str, Any] | None:
        return self._loaded_configs([model])[model]

    def _loaded_configs(self, models: Iterable[str]) -> dict[str, dict[str, Any] | None]:
        """The config each of ``models`` runs with, read concurrently (``triton_configs``);
        None for a model unloaded between the index and its call."""
        answers = read_configs(self._client._client_stub, models, self.call_timeout)
        configs: dict[str, dict[str, Any] | None] = {}
        for model, answer in answers.items():
            if isinstance(answer, InferenceServerException):
                if _unreachable(answer):
                    raise self._error(answer, f"reading the config of {model}") from answer
                answer = None
            configs[model] = answer
        return configs

    @staticmethod
    def _by_model(entries: Iterable[Any]) -> dict[str, tuple[VersionState, ...]]:
        grouped: dict[str, list[VersionState]] = {}
        for e in entries:
            if e.name and e.version:
                grouped.setdefault(e.name, []).append(
                    VersionState(int(e.version), e.state, e.reason)
                )
        return {
            name: tuple(sorted(versions, key=lambda v: v.version))
            for name, versions in grouped.items()
        }

    def model_state(self, model: str) -> ModelState:
        return ModelState(model, self._by_model(self._index()).get(model, ()))

    def server_version(self) -> str:
        """Triton's version, from its server metadata (``triton-gitops check``)."""
        try:
            metadata = self._client.get_server_metadata(client_timeout=self.call_timeout)
        except InferenceServerException as exc:
            raise self._error(exc, "reading the server metadata") from exc
        return str(metadata.version)

    def explicit_model_control(self) -> bool:
        """Whether the server runs in EXPLICIT model-control mode, asked without changing
        anything: an unload of a model name no repository holds is a no-op in EXPLICIT mode,
        and refused in POLL and NONE modes ("explicit model load / unload is not allowed if
        polling is enabled", measured on 2.51). Triton reports the mode nowhere else."""
        try:
            self._client.unload_model(
                f"triton-gitops-check-{uuid.uuid4().hex}", client_timeout=self.call_timeout
            )
        except InferenceServerException as exc:
            if "not allowed if polling is enabled" in str(exc.message()):
                return False
            raise self._error(exc, "asking for its model-control mode") from exc
        return True

    def observe(self, models: Iterable[str]) -> ServerState:
        """What the server serves of ``models``, and what its model repository holds.

        The state's ``token`` is equal across two observations by this client exactly when
        the index, the loaded configs and the repository's content read the same (a config
        is re-read when its model's index entries change, after this client's own load or
        unload, and every ``config_recheck`` seconds otherwise: Triton's index does not say
        when a version was reloaded by hand with another config).
        """
        try:
            answer = self._index_answer()
        except (ServerUnavailable, StepFailed) as exc:
            return ServerState(self.name, error=self._unobserved(exc))
        models = tuple(models)
        raw = answer.SerializeToString(deterministic=True)
        last = self._last
        if (
            last is not None
            and not self.model_repository  # its files may change without the index
            and (last.raw, last.models) == (raw, models)
            and self._clock() < last.due
        ):
            return last.state  # the same index, no config due: the same observation
        entries = list(answer.models)
        by_model = self._by_model(entries)
        states: dict[str, ModelState] = {}
        token: list[Any] = [self._epoch]
        due = float("inf")
        try:
            ready = {
                m: by_model[m] for m in models if any(v.state == READY for v in by_model.get(m, ()))
            }
            configs = self._configs.of(ready, self._loaded_configs)
            for model in models:
                versions = by_model.get(model, ())
                loaded = None
                if model in configs:
                    cached = configs[model]
                    loaded = cached.config
                    due = min(due, cached.due)
                    token.append((model, versions, cached.generation))
                else:
                    token.append((model, versions))
                found = (
                    read_model(self.model_repository, model)
                    if self.model_repository
                    else RepositoryModel(None, None)
                )
                if self.model_repository:
                    token.append((repr(found.config), found.versions, found.config_error))
                states[model] = ModelState(
                    model,
                    versions,
                    loaded,
                    found.config,
                    found.versions,
                    repository_config_error=found.config_error,
                )
        except ServerUnavailable as exc:
            return ServerState(self.name, error=self._unobserved(exc))
        except RepositoryUnavailable as exc:
            # Nothing is known of what the repository holds: a reason to wait, as for a
            # server that does not answer (nothing is loaded or unloaded on it this pass).
            return ServerState(self.name, error=str(exc))
        listed = frozenset(e.name for e in entries if e.name)
        token.append(listed)
        state = ServerState(
            self.name,
            states,
            listed,
            repository_url=redact(self.model_repository) if self.model_repository else None,
            token=tuple(token),
        )
        self._last = _LastObservation(raw, models, state, due)
        return state

    def memory_usage(self, model: str) -> dict[int, tuple[DeviceMemory, ...]]:
        try:
            answer = self._client.get_inference_statistics(model, client_timeout=self.call_timeout)
        except InferenceServerException as exc:
            if _unreachable(exc):
                raise self._error(exc, f"reading the statistics of {model}") from exc
            return {}  # not loaded (any more): nothing held
        return {
            int(stats.version): tuple(
                DeviceMemory(str(u.type), int(u.id), int(u.byte_size)) for u in stats.memory_usage
            )
            for stats in answer.model_stats
            if stats.version.isdigit()
        }

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

    def _forget(self, model: str) -> None:
        # A load may change the config with the same versions: read it again.
        self._configs.forget(model)
        self._last = None

    def load(self, model: str, config: Mapping[str, Any]) -> None:
        self._forget(model)
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
        self._forget(model)
        try:
            self._client.unload_model(model, client_timeout=self.call_timeout)
        except InferenceServerException as exc:
            if _unreachable(exc):
                raise self._error(exc, f"unloading {model}") from exc
            raise UnloadFailed(f"server {self.name}: {exc.message()}") from exc

    def infer(
        self,
        model: str,
        version: int,
        inputs: tuple[Tensor, ...],
        outputs: tuple[str, ...],
        timeout: float | None = None,
    ) -> dict[str, npt.NDArray[np.generic]]:
        return self._call(model, version, infer_inputs(inputs), outputs, timeout)

    def sequence(
        self,
        model: str,
        version: int,
        inputs: tuple[Tensor, ...],
        outputs: tuple[str, ...],
        requests: int,
        timeout: float | None = None,
    ) -> Reply:
        """A whole sequence of ``inputs`` pinned to ``version`` (``adapters/triton_sequence``);
        its START may wait for a slot as long as ``start_deadline`` says."""
        config = self._loaded_config(model) or {}
        request, key = infer_inputs(inputs), correlation_id(config)
        first = start_deadline(config, timeout)

        def call(index: int, part: str) -> dict[str, npt.NDArray[np.generic]]:
            place = (key, index == 0, index == requests - 1, part)
            deadline = first if index == 0 else timeout
            return self._call(model, version, request, outputs, deadline, place)

        return whole_sequence(call, requests, self._clock)

    def _call(
        self,
        model: str,
        version: int,
        request: list[triton_grpc.InferInput],
        outputs: tuple[str, ...],
        timeout: float | None,
        place: tuple[int | str, bool, bool, str] = (0, False, False, ""),
    ) -> dict[str, npt.NDArray[np.generic]]:
        """One call pinned to ``version`` (``place``: its sequence's ID, START, END, name)."""
        sequence, start, end, part = place
        doing = f"inference on {model} version {version}" + (f" ({part})" if part else "")
        try:
            result = self._client.infer(
                model,
                request,
                model_version=str(version),
                outputs=[triton_grpc.InferRequestedOutput(name) for name in outputs] or None,
                client_timeout=timeout or self.call_timeout,
                sequence_id=sequence,
                sequence_start=start,
                sequence_end=end,
            )
        except InferenceServerException as exc:
            if timeout is not None and str(exc.status()) == "StatusCode.DEADLINE_EXCEEDED":
                # A probe's own deadline: the client would have given up, so it failed.
                raise ProbeTimedOut(
                    f"server {self.name}: {doing}: no answer within {timeout:g}s"
                ) from exc
            # "not at ready state" comes with the unreachable code too; the server answered.
            hung = self._hung(exc)
            if _unreachable(exc) and not _not_ready(exc) and hung is None:
                raise self._error(exc, f"inferring {model} version {version}") from exc
            raise VerifyFailed(f"server {self.name}: {doing}: {hung or exc.message()}") from exc
        answer: dict[str, npt.NDArray[np.generic]] = {}
        for name in outputs:
            array = result.as_numpy(name)
            if array is not None:
                answer[name] = array
        return answer

    def stream(
        self,
        model: str,
        version: int,
        inputs: tuple[Tensor, ...],
        outputs: tuple[str, ...],
        timeout: float | None = None,
        max_responses: int = MAX_RESPONSES,
    ) -> Reply:
        """One request over gRPC ModelStreamInfer, pinned to ``version``, until Triton's
        final flag (``adapters/triton_stream.py``)."""
        request = StreamRequest(
            model,
            version,
            infer_inputs(inputs),
            outputs,
            timeout or self.call_timeout,
            max_responses,
        )
        try:
            return stream_once(
                self.address,
                request,
                f"server {self.name}",
                lambda error: _unreachable(error) and not _not_ready(error),
            )
        except InferenceServerException as exc:
            doing = f"streaming {model} version {version}"
            if _unreachable(exc) and not _not_ready(exc):
                raise self._error(exc, doing) from exc
            raise VerifyFailed(f"server {self.name}: {doing}: {exc.message()}") from exc
