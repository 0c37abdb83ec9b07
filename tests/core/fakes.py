"""Plain fakes for the pure core's tests: a Triton server in memory, and a clock.

``FakeTriton`` implements ``reconciler.apply.ModelControl`` with the model-control behaviour
observed on real Triton 2.51 in explicit mode (see ``triton-on-cpu.md``):

- ``load`` with ``version_policy.specific.versions`` makes exactly those versions READY;
  versions absent from the model repository silently never appear;
- a load is all-or-nothing: when a newly loaded version fails, ``LoadFailed`` is raised and
  the versions that served before keep serving;
- versions dropped from the policy, and every version on ``unload``, leave READY at once;
- the loaded config is reported as Triton reports it (through the ModelConfig message: int64
  fields as strings, defaults left out; instance groups named by the server), and a config
  that message cannot hold is refused;
- ``infer`` answers ``OUTPUT0 = INPUT * version`` as float32, and only from READY versions;
  a version listed in ``wrong_answers`` loads fine but adds 1 to every answer.

Every call appends a ``Snapshot`` of what is READY to ``timeline``, so a test can assert an
invariant over the whole history of an apply, not only its end. ``observe`` turns a fake into
the ``ServerState`` the planner reads; ``FakeClock`` drives ``apply.Timing`` without sleeping;
``deploy`` and ``desired_state`` build the desired side without YAML.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2

from reconciler.core.exchange import Reply
from reconciler.model.analysis import ProbeFigures
from reconciler.model.errors import LoadFailed, ServerUnavailable, VerifyFailed
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
from reconciler.model.spec import DesiredState, ModelDeployment, SmokeCase, Tensor

LOADING = "LOADING"
UNAVAILABLE = "UNAVAILABLE"
OUTPUT = "OUTPUT0"


def base_config(model: str) -> dict[str, Any]:
    """A whole config.pbtxt, as JSON, for a Python-backend model with one input and output."""
    return {
        "name": model,
        "backend": "python",
        "max_batch_size": 4,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": ["1"]}],
        "output": [{"name": OUTPUT, "data_type": "TYPE_FP32", "dims": ["1"]}],
        "instance_group": [{"kind": "KIND_CPU", "count": 1}],
    }


@dataclass(frozen=True)
class Snapshot:
    """What was READY, per model, right after one call to the fake."""

    call: str
    ready: Mapping[str, frozenset[int]]

    def of(self, model: str) -> frozenset[int]:
        return self.ready.get(model, frozenset())


@dataclass
class _Model:
    versions: dict[int, VersionState] = field(default_factory=dict)
    config: dict[str, Any] | None = None
    # version -> polls of model_state left before a LOADING version turns READY (None: never)
    loading: dict[int, int | None] = field(default_factory=dict)

    @property
    def ready(self) -> frozenset[int]:
        return frozenset(v for v, s in self.versions.items() if s.state == READY)

    @property
    def live(self) -> frozenset[int]:
        return frozenset(v for v, s in self.versions.items() if s.state in (READY, LOADING))


class FakeTriton:
    """One Triton server in explicit model-control mode, in memory."""

    def __init__(
        self,
        name: str = "fake",
        repository: Mapping[str, Iterable[int]] | None = None,
        *,
        configs: Mapping[str, Mapping[str, Any]] | None = None,
        failing: Iterable[tuple[str, int]] = (),
        loading_polls: Mapping[tuple[str, int], int | None] | None = None,
        wrong_answers: Iterable[tuple[str, int]] = (),
        changed_interfaces: Iterable[tuple[str, int]] = (),
    ) -> None:
        self.name = name
        # model -> the version folders its repository holds
        self.repository = {m: frozenset(vs) for m, vs in (repository or {}).items()}
        # model -> its config.pbtxt as JSON
        self.configs = {m: dict(c) for m, c in (configs or {}).items()}
        for model in self.repository:
            self.configs.setdefault(model, base_config(model))
        self.failing = set(failing)
        # (model, version) -> polls of model_state it stays LOADING after a load (None: forever)
        self.loading_polls = dict(loading_polls or {})
        self.wrong_answers = set(wrong_answers)
        self.changed_interfaces = set(changed_interfaces)
        self.unreachable = False
        # (model, version) -> the memory Triton's statistics report for it
        self.reported_memory: dict[tuple[str, int], tuple[DeviceMemory, ...]] = {}
        self.calls: list[str] = []
        self.timeline: list[Snapshot] = []
        self._models: dict[str, _Model] = {}
        self._record("start")

    # -- set-up and inspection ---------------------------------------------------------------

    def serve(
        self, model: str, versions: Iterable[int], config: Mapping[str, Any] | None = None
    ) -> None:
        """Put the server in a state as if ``versions`` had been loaded (not a control call)."""
        wanted = sorted(set(versions))
        state = self._models.setdefault(model, _Model())
        state.versions = {v: VersionState(v, READY) for v in wanted}
        state.loading = {}
        chosen = copy.deepcopy(dict(config)) if config is not None else self.configs[model]
        if wanted:
            state.config = _filled(as_reported(_with_policy(chosen, model, wanted)), model)
        else:
            state.config = None
        self._record(f"serve {model} {wanted}")

    def ready(self, model: str) -> frozenset[int]:
        state = self._models.get(model)
        return state.ready if state else frozenset()

    def loaded_config(self, model: str) -> dict[str, Any] | None:
        state = self._models.get(model)
        return copy.deepcopy(state.config) if state and state.ready else None

    def history(self, model: str) -> list[frozenset[int]]:
        return [snapshot.of(model) for snapshot in self.timeline]

    # -- ModelControl ------------------------------------------------------------------------

    def load(self, model: str, config: Mapping[str, Any]) -> None:
        self._call(f"load {model}")
        try:
            if model not in self.repository:
                raise LoadFailed(f"server {self.name}: failed to load '{model}': not found")
            if config.get("name", model) != model:
                raise LoadFailed(
                    f"server {self.name}: config name {config.get('name')!r} is not {model!r}"
                )
            try:
                reported = _filled(as_reported(config), model)
            except json_format.ParseError as exc:
                raise LoadFailed(f"server {self.name}: bad config for '{model}': {exc}") from exc
            requested = _policy_versions(config, self.repository[model])
            present = requested & self.repository[model]
            state = self._models.setdefault(model, _Model())
            new = present - state.live
            broken = sorted(v for v in new if (model, v) in self.failing)
            if broken:
                # All-or-nothing: the versions that served keep serving; the broken one shows
                # UNAVAILABLE only if the server had never seen it.
                for v in broken:
                    if v not in state.versions:
                        state.versions[v] = VersionState(v, UNAVAILABLE, "initialize failed")
                raise LoadFailed(
                    f"server {self.name}: failed to load '{model}' version {broken[0]}: "
                    "initialize failed"
                )
            for v in sorted(state.live - present):
                state.versions[v] = VersionState(v, UNAVAILABLE, "unloaded")
                state.loading.pop(v, None)
            for v in sorted(new):
                polls = self.loading_polls.get((model, v), 0)
                if polls == 0:
                    state.versions[v] = VersionState(v, READY)
                else:
                    state.versions[v] = VersionState(v, LOADING)
                    state.loading[v] = polls
            state.config = reported if present else None
        finally:
            self._record(f"load {model}")

    def unload(self, model: str) -> None:
        self._call(f"unload {model}")
        state = self._models.get(model)
        if state is not None:
            for v in sorted(state.live):
                state.versions[v] = VersionState(v, UNAVAILABLE, "unloaded")
            state.loading = {}
            state.config = None
        self._record(f"unload {model}")

    def model_state(self, model: str) -> ModelState:
        self._call(f"model_state {model}")
        state = self._models.get(model)
        if state is None:
            self._record(f"model_state {model}")
            return ModelState(model)
        for v, left in list(state.loading.items()):
            if left is None:
                continue
            if left == 0:
                state.versions[v] = VersionState(v, READY)
                del state.loading[v]
            else:
                state.loading[v] = left - 1  # this answer still says LOADING
        self._record(f"model_state {model}")
        return ModelState(model, tuple(state.versions[v] for v in sorted(state.versions)))

    def infer(
        self,
        model: str,
        version: int,
        inputs: tuple[Tensor, ...],
        outputs: tuple[str, ...],
        timeout: float | None = None,
    ) -> dict[str, npt.NDArray[np.generic]]:
        self._call(f"infer {model} {version}")
        self._record(f"infer {model} {version}")
        if version not in self.ready(model):
            raise VerifyFailed(
                f"server {self.name}: inference on {model} version {version}: not ready"
            )
        first = inputs[0]
        data = np.asarray(first.data, dtype=np.float32).reshape(first.shape)
        result = data * np.float32(version)
        if (model, version) in self.wrong_answers:
            result = result + np.float32(1)
        answer = {OUTPUT: result.astype(np.float32)}
        return {name: answer[name] for name in outputs if name in answer}

    def sequence(
        self,
        model: str,
        version: int,
        inputs: tuple[Tensor, ...],
        outputs: tuple[str, ...],
        requests: int,
        timeout: float | None = None,
    ) -> Reply:
        """A whole sequence: ``requests`` calls, each answered as ``infer`` answers."""
        answers = tuple(
            self.infer(model, version, inputs, outputs, timeout) for _ in range(requests)
        )
        return Reply(answers, (0.0,) * requests)

    def memory_usage(self, model: str) -> dict[int, tuple[DeviceMemory, ...]]:
        """What Triton's statistics report for each loaded version: ``reported_memory``
        (nothing by default, as the Python backend)."""
        state = self._models.get(model)
        loaded = state.live if state is not None else frozenset()
        return {v: self.reported_memory.get((model, v), ()) for v in sorted(loaded)}

    def interface(self, model: str, version: int) -> ModelInterface:
        """Every version of the fake takes INPUT0 and gives OUTPUT0, except those listed in
        ``changed_interfaces``, which give OUTPUT1 instead."""
        self._call(f"interface {model} {version}")
        output = "OUTPUT1" if (model, version) in self.changed_interfaces else OUTPUT
        return ModelInterface(
            (TensorSignature("INPUT0", "FP32", (-1, 2)),),
            (TensorSignature(output, "FP32", (-1, 2)),),
        )

    # -- internals ---------------------------------------------------------------------------

    def _call(self, what: str) -> None:
        self.calls.append(what)
        if self.unreachable:
            raise ServerUnavailable(self.name, f"did not answer ({what})")

    def _record(self, call: str) -> None:
        ready = {m: s.ready for m, s in self._models.items() if s.ready}
        self.timeline.append(Snapshot(call, ready))


class StuckUnloading(FakeTriton):
    """Reports the dropped versions READY forever (in-flight requests that never finish)."""

    def model_state(self, model: str) -> ModelState:
        state = super().model_state(model)
        stuck = tuple(
            VersionState(v.version, READY) if v.reason == "unloaded" else v for v in state.versions
        )
        return ModelState(model, stuck)


def as_reported(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` as Triton's get_model_config reports it (JSON of the ModelConfig message)."""
    message = json_format.ParseDict(copy.deepcopy(dict(config)), model_config_pb2.ModelConfig())
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def _filled(reported: dict[str, Any], model: str) -> dict[str, Any]:
    """What the server adds on load: a name for every instance group that has none."""
    for index, group in enumerate(reported.get("instance_group", [])):
        group.setdefault("name", f"{model}_{index}")
    return reported


def _policy_versions(config: Mapping[str, Any], repository: frozenset[int]) -> frozenset[int]:
    policy = config.get("version_policy")
    if policy is None:
        # Triton's default policy: the latest version only.
        return frozenset({max(repository)}) if repository else frozenset()
    if "specific" in policy:
        return frozenset(int(v) for v in policy["specific"]["versions"])
    if "all" in policy:
        return repository
    count = int(policy.get("latest", {}).get("num_versions", 1))
    return frozenset(sorted(repository)[-count:])


def _with_policy(config: Mapping[str, Any], model: str, versions: Iterable[int]) -> dict[str, Any]:
    result = copy.deepcopy(dict(config))
    result["name"] = model
    result["version_policy"] = {"specific": {"versions": sorted(set(versions))}}
    return result


def observe(fake: FakeTriton, *, readable_repository: bool = True) -> ServerState:
    """What the reconciler's observe phase would report for ``fake``, as a ServerState."""
    if fake.unreachable:
        return ServerState(fake.name, error="did not answer")
    models: dict[str, ModelState] = {}
    for model in sorted(set(fake.repository) | set(fake._models)):
        state = fake._models.get(model)
        versions = tuple(state.versions[v] for v in sorted(state.versions)) if state else ()
        models[model] = ModelState(
            model,
            versions,
            loaded_config=fake.loaded_config(model),
            repository_config=copy.deepcopy(fake.configs.get(model))
            if readable_repository
            else None,
            repository_versions=fake.repository.get(model) if readable_repository else None,
        )
    # Exact, as the adapter's token is: equal exactly when everything observed is.
    token = (repr(models), tuple(sorted(fake.repository)))
    return ServerState(fake.name, models, frozenset(fake.repository), token=token)


class FakeClock:
    """A monotonic clock that only moves when something sleeps on it."""

    def __init__(self, start: float = 1000.0) -> None:
        self.start = start
        self.now = start
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    @property
    def elapsed(self) -> float:
        return self.now - self.start


def deploy(
    model: str,
    versions: Iterable[int],
    *,
    servers: Sequence[str] = ("s1",),
    config: Mapping[str, Any] | None = None,
    smoke: Sequence[SmokeCase] = (),
    verify_timeout: float = 120.0,
) -> ModelDeployment:
    """A ModelDeployment named after its model, placing it on ``servers`` by name."""
    return ModelDeployment(
        name=model,
        model=model,
        versions=tuple(sorted(set(versions))),
        server_names=tuple(servers),
        config=dict(config or {}),
        smoke=tuple(smoke),
        verify_timeout=verify_timeout,
    )


def desired_state(*deployments: ModelDeployment, servers: Sequence[str] = ("s1",)) -> DesiredState:
    return DesiredState.build(
        [TritonServer(s, f"{s}:8001", model_repository=f"/models/{s}") for s in servers],
        list(deployments),
    )


def timed_probes(new: Sequence[float], old: Sequence[float] = ()) -> ProbeFigures:
    """Probes that passed and took these seconds each, to the new versions and to the old."""
    return ProbeFigures(
        sent=len(new),
        seconds=sum(new),
        old_sent=len(old),
        old_seconds=sum(old),
        latencies=tuple(new),
        old_latencies=tuple(old),
    )
