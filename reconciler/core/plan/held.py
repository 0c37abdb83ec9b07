"""A held ModelDeployment and a removed model on one server: keep (or bring back) what
served before a failed rollout, never the failed spec; unload what no ModelDeployment places
any more. Called by ``core/plan/planner.py``.
"""

from __future__ import annotations

from dataclasses import replace

from reconciler.core.plan.changes import plan_model
from reconciler.core.plan.revert import sorted_versions
from reconciler.model.history import Hold
from reconciler.model.plan import Action, ModelChange, OnFailure, PlanProblem, Step
from reconciler.model.serving import ServerState
from reconciler.model.spec import ModelDeployment


def plan_held(
    server: str, deployment: ModelDeployment, hold: Hold, observed: ServerState
) -> ModelChange | PlanProblem | None:
    """Keep (or bring back) what served before the failed rollout; never the failed spec."""
    previous = hold.previous.get(server)
    config = hold.configs.get(server)
    if previous is None:
        # This server took no part in the failed rollout. Serving the model, it is left as
        # it is; serving none of it (an instance DNS added since, or one restarted empty),
        # it gets the last good versions: what the rollout's servers served before, when
        # they agree, never the failed spec's.
        before = set(hold.previous.values())
        if observed.model(deployment.model).ready or len(before) != 1:
            return None
        previous = before.pop()
        config = next((c for c in hold.configs.values() if c is not None), None)
    if not previous:
        return plan_removal(server, deployment.model, observed)
    restored = replace(
        deployment,
        versions=previous,
        config=config if config is not None else deployment.config,
        smoke=(),
        analysis=None,
    )
    return plan_model(server, restored, observed)


def plan_removal(server: str, model_name: str, observed: ServerState) -> ModelChange | None:
    model = observed.model(model_name)
    if not model.ready:
        return None
    return ModelChange(
        server,
        model_name,
        None,
        sorted_versions(model.ready),
        (),
        (
            Step(
                server,
                model_name,
                Action.UNLOAD,
                (),
                "no ModelDeployment places this model on this server any more",
                dropped=sorted_versions(model.ready),
                on_failure=OnFailure.STOP,  # nothing to put back; the next pass retries
            ),
        ),
    )
