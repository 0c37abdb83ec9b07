"""The steps that take a planned change back (a change's ``revert``): load again what served
before it, with the config it served with, and verify it READY; a model that served nothing
before is unloaded. Pure: ``core/plan/changes.py`` builds them with each change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconciler.core.triton_config import with_versions
from reconciler.model.plan import Action, Step
from reconciler.model.serving import ModelState


def sorted_versions(values: frozenset[int] | set[int]) -> tuple[int, ...]:
    return tuple(sorted(values))


def put_back_unloaded(
    server: str, model_name: str, target: Mapping[str, Any], before: frozenset[int]
) -> tuple[Step, ...]:
    """The revert of a change that starts from nothing because an in-place swap, stopped
    after its unload, took away what served (``before``): those versions back, with the
    declared config (the one they were unloaded with is not known any more)."""
    return load_back(server, model_name, with_versions(target, model_name, before), before)


def revert_steps(
    server: str, model_name: str, model: ModelState, ready: frozenset[int]
) -> tuple[Step, ...]:
    if not ready:
        return (Step(server, model_name, Action.UNLOAD, (), "revert: it served nothing before"),)
    previous = model.loaded_config or {}
    return load_back(server, model_name, with_versions(previous, model_name, ready), ready)


def load_back(
    server: str, model_name: str, config: Mapping[str, Any], ready: frozenset[int]
) -> tuple[Step, ...]:
    return (
        Step(
            server,
            model_name,
            Action.LOAD,
            sorted_versions(ready),
            f"revert: serve only {', '.join(map(str, sorted(ready)))} as before",
            config=config,
        ),
        Step(
            server,
            model_name,
            Action.VERIFY,
            sorted_versions(ready),
            f"revert: {', '.join(map(str, sorted(ready)))} READY",
        ),
    )
