"""What Triton servers report: the observed side of the diff, as frozen values.

Built by the Triton adapter (``adapters/triton.py``) and the model-repository reader; read by
the planner. Only READY versions count as serving.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

READY = "READY"


@dataclass(frozen=True)
class VersionState:
    version: int
    state: str  # READY, LOADING, UNLOADING, UNAVAILABLE
    reason: str = ""


@dataclass(frozen=True)
class ModelState:
    """One model as a server reports it, plus what its model repository holds (if readable)."""

    name: str
    versions: tuple[VersionState, ...] = ()
    # The config the server runs the model with (only when some version is loaded).
    loaded_config: Mapping[str, Any] | None = None
    # The repository's config.pbtxt as JSON, and its version folders, when the reconciler can
    # read the server's model repository; None when it cannot.
    repository_config: Mapping[str, Any] | None = None
    repository_versions: frozenset[int] | None = None
    # Why the repository's config.pbtxt does not parse (the file named), when it does not.
    repository_config_error: str | None = None
    # Digests of the version folders whose digest a manifest pins (None: folder missing).
    repository_digests: Mapping[int, str | None] = field(default_factory=dict)
    # Versions READY in the index whose probes between rollouts failed in a row after they
    # had answered (the service's probes), with the last error: reloaded in place.
    stopped_answering: Mapping[int, str] = field(default_factory=dict)

    @property
    def ready(self) -> frozenset[int]:
        return frozenset(v.version for v in self.versions if v.state == READY)

    def unloaded(self, version: int) -> bool:
        """Whether ``version`` was taken out by an unload call: UNLOADING, or UNAVAILABLE with
        Triton's reason "unloaded" (a version that failed to load says why instead)."""
        return any(
            v.version == version
            and (v.state == "UNLOADING" or (v.state == "UNAVAILABLE" and v.reason == "unloaded"))
            for v in self.versions
        )

    def reason(self, version: int) -> str:
        for v in self.versions:
            if v.version == version:
                return f"{v.state}: {v.reason}" if v.reason else v.state
        return "not loaded"


@dataclass(frozen=True)
class ServerState:
    """Everything observed on one server, or why it could not be observed."""

    server: str
    models: Mapping[str, ModelState] = field(default_factory=dict)
    in_repository: frozenset[str] = frozenset()  # model names Triton's repository index lists
    error: str | None = None  # why the server could not be observed (without its name)
    # The model repository the models' repository_* fields were read from, for messages
    # (credentials hidden); None when the server declares none.
    repository_url: str | None = None
    memory_free: float | None = None  # bytes, from the server's metrics when it has them
    # Which figure ``memory_free`` is: "on GPU-..., the fullest of N GPU(s)", "host" (a CPU
    # server: the whole host's), or "GPU" (a sum without per-device figures).
    memory_free_on: str | None = None
    # Equal for two observations exactly when the server reads the same in both (see
    # TritonServerClient.observe); None when the observer cannot tell. Free memory is left
    # out: it only matters to loads, and a server with nothing to load plans the same.
    token: tuple[Any, ...] | None = field(default=None, compare=False)

    @property
    def reachable(self) -> bool:
        return self.error is None

    def model(self, name: str) -> ModelState:
        return self.models.get(name) or ModelState(name)


ServingState = Mapping[str, ServerState]


def ready_in(states: Mapping[str, Mapping[int, str]]) -> dict[str, frozenset[int]]:
    """Per model of a repository index's version states, the versions READY (models with
    none left out)."""
    return {
        model: frozenset(v for v, state in versions.items() if state == READY)
        for model, versions in states.items()
        if READY in versions.values()
    }


@dataclass(frozen=True)
class DeviceMemory:
    """Memory a loaded version holds as Triton's statistics report it (``memory_usage``:
    what the backend measured while loading; ONNX Runtime and TensorRT report GPU memory,
    the Python backend nothing)."""

    kind: str  # CPU, CPU_PINNED or GPU
    device: int  # the device's id for its kind
    bytes: int


def version_cost(usage: tuple[DeviceMemory, ...]) -> int | None:
    """What one version needs on each device it runs on: the most it holds on any one GPU,
    else its CPU memory (pinned included); None when nothing is reported."""
    gpu = [u.bytes for u in usage if u.kind == "GPU"]
    if gpu:
        return max(gpu)
    cpu = [u.bytes for u in usage if u.kind in ("CPU", "CPU_PINNED")]
    return sum(cpu) if cpu else None


@dataclass(frozen=True)
class TensorSignature:
    """One input or output of a model version, as Triton's model metadata gives it."""

    name: str
    datatype: str  # FP32, INT64, BYTES...
    shape: tuple[int, ...]  # -1 for a variable dimension; the batch dimension included


@dataclass(frozen=True)
class ModelInterface:
    """What a model version takes and gives (from Triton's model metadata).

    Inputs and outputs are kept sorted by name, so two interfaces are equal exactly when
    they declare the same tensors, whatever order the server listed them in.
    """

    inputs: tuple[TensorSignature, ...] = ()
    outputs: tuple[TensorSignature, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(sorted(self.inputs, key=lambda t: t.name)))
        object.__setattr__(self, "outputs", tuple(sorted(self.outputs, key=lambda t: t.name)))


def interface_difference(old: ModelInterface, new: ModelInterface) -> list[str]:
    """Every way ``new`` differs from ``old``, one human line each; empty when they agree.

    Exact, on purpose: a widened shape (``[-1, 4]`` to ``[-1, -1]``) is a difference too,
    since a client built for one interface may not handle the other. Whether a difference is
    allowed is the deployment's call (``spec.allowInterfaceChange``), not this function's.
    Lines come inputs first, then outputs, each by name, e.g. ``output OUTPUT0 removed``,
    ``input INPUT0 shape [-1, 4] -> [-1, 8]``.
    """
    lines: list[str] = []
    for kind, before, after in (
        ("input", old.inputs, new.inputs),
        ("output", old.outputs, new.outputs),
    ):
        was = {t.name: t for t in before}
        now = {t.name: t for t in after}
        for name in sorted(was.keys() | now.keys()):
            if name not in now:
                lines.append(f"{kind} {name} removed")
            elif name not in was:
                lines.append(f"{kind} {name} added")
            else:
                if was[name].datatype != now[name].datatype:
                    lines.append(
                        f"{kind} {name} datatype {was[name].datatype} -> {now[name].datatype}"
                    )
                if was[name].shape != now[name].shape:
                    lines.append(
                        f"{kind} {name} shape {list(was[name].shape)} -> {list(now[name].shape)}"
                    )
    return lines
