"""The small Protocols the pass and the executor are given: what they need of
Triton, of metrics, and of the other adapters. ``adapters/`` holds the real ones, the tests
plain fakes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from reconciler.model.analysis import Figures
from reconciler.model.plan import Step
from reconciler.model.serving import ModelInterface, ModelState
from reconciler.model.spec import Tensor


class ModelControl(Protocol):
    """What apply needs from one Triton server (``adapters/triton.py`` is the real one)."""

    def load(self, model: str, config: Mapping[str, Any]) -> None: ...

    def unload(self, model: str) -> None: ...

    def model_state(self, model: str) -> ModelState: ...

    def infer(
        self, model: str, version: int, inputs: tuple[Tensor, ...], outputs: tuple[str, ...]
    ) -> dict[str, npt.NDArray[np.generic]]: ...

    def interface(self, model: str, version: int) -> ModelInterface: ...


class FiguresSource(Protocol):
    """Where an analyze step reads metrics (``adapters/metrics.py`` has the real ones)."""

    def figures(
        self, model: str, versions: tuple[int, ...], queries: Mapping[str, str] = ...
    ) -> Figures: ...


# -- the executor's calls outside Triton (engine/) ------------------------------------------


class StepHooks(Protocol):
    """What a change calls outside Triton: the webhooks around its steps (the drain webhook,
    a staged rollout's preStep/postStep) and a backend's replaceLibrary (its command, then
    its webhook). ``adapters/hooks.py``'s ``HttpStepHooks`` is the real one; given to
    ``engine.apply.apply`` by its caller. Each call raises StepFailed when the other side
    says no or does not answer."""

    def call_webhook(self, url: str, payload: Mapping[str, Any]) -> None: ...

    def replace_library(self, step: Step) -> None: ...
