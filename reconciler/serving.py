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

    @property
    def ready(self) -> frozenset[int]:
        return frozenset(v.version for v in self.versions if v.state == READY)

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
    error: str | None = None  # set when the server could not be observed

    @property
    def reachable(self) -> bool:
        return self.error is None

    def model(self, name: str) -> ModelState:
        return self.models.get(name) or ModelState(name)


ServingState = Mapping[str, ServerState]
