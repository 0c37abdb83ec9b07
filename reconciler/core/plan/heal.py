"""The reload in place of versions that stopped answering: serving as declared by Triton's
index (READY), while every request fails (a Python stub that died or hangs: Triton 2.51
keeps the version READY and answers "Stub process 'm_0_0' is not healthy"). The service's
probes between rollouts find them (``ModelState.stopped_answering``); the plan reloads the
model with the same versions and a config whose reload marker is one higher
(``core.triton_config.HEAL_MARKER``): Triton loads the new instances beside the broken ones
and swaps them in once READY, which a load of the same config again does not do. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from reconciler.core.triton_config import (
    heal_generation,
    in_sequences,
    streams,
    with_heal_marker,
    with_versions,
)
from reconciler.model.plan import Action, ModelChange, OnFailure, Step
from reconciler.model.serving import ModelState
from reconciler.model.spec import ModelDeployment


def heal_change(
    server: str,
    deployment: ModelDeployment,
    model: ModelState,
    target: Callable[[], Mapping[str, Any]],
) -> ModelChange | None:
    """The reload in place of ``model`` on ``server`` when versions it serves as declared
    stopped answering; None when none did. ``target()``: the config it is declared with
    (asked only when one did)."""
    broken = sorted(v for v in model.stopped_answering if v in model.ready)
    if not broken:
        return None
    versions = tuple(sorted(model.ready))
    listed = ", ".join(map(str, versions))
    why = "; ".join(f"version {v} stopped answering: {model.stopped_answering[v]}" for v in broken)
    generation = heal_generation(model.loaded_config) + 1
    config = with_heal_marker(with_versions(target(), deployment.model, versions), generation)
    # Nothing to put back: what serves now does not answer. A load or verify that fails
    # stops here; the probes go on, and the next pass tries again.
    load = Step(
        server,
        deployment.model,
        Action.LOAD,
        versions,
        f"{why}; reload {listed} in place (reload {generation}: Triton swaps the new "
        "instances in once they are READY)",
        config=config,
        on_failure=OnFailure.STOP,
    )
    verify = Step(
        server,
        deployment.model,
        Action.VERIFY,
        versions,
        f"{listed} READY"
        + (f"; {len(deployment.smoke)} smoke case(s)" if deployment.smoke else ""),
        smoke=deployment.smoke,
        smoke_versions=versions if deployment.smoke else (),
        timeout=deployment.verify_timeout,
        on_failure=OnFailure.STOP,
        streaming=streams(config),
        sequence=in_sequences(config),
    )
    return ModelChange(
        server,
        deployment.model,
        deployment.name,
        serving=versions,
        desired=versions,
        steps=(load, verify),
        heals=tuple(broken),
    )
