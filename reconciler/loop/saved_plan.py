"""Saved plans (``plan --out`` / ``apply --plan``): the digest of what
each server serves, and the check that nothing moved since the plan was made.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from reconciler.model.errors import StalePlan
from reconciler.model.plan import Plan
from reconciler.model.reports import SavedPlan
from reconciler.model.serving import ServerState
from reconciler.views.steps import plan_steps_json


def serving_digest(serving: Mapping[str, ServerState]) -> dict[str, str]:
    """Per server, a digest of what it serves of the models observed (versions, states,
    loaded config), so a saved plan can tell that a server moved since."""
    digests = {}
    for name, server in sorted(serving.items()):
        view = {
            "error": server.error,
            "models": {
                model: {
                    "versions": [[v.version, v.state] for v in state.versions],
                    "config": state.loaded_config,
                }
                for model, state in sorted(server.models.items())
            },
        }
        text = json.dumps(view, sort_keys=True, default=str)
        digests[name] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return digests


def check_saved_plan(saved: SavedPlan, served: Mapping[str, str], plan_: Plan) -> None:
    moved = sorted(
        name
        for name in set(saved.served) | set(served)
        if saved.served.get(name) != served.get(name)
    )
    if moved:
        raise StalePlan(
            f"stale plan: server(s) {', '.join(moved)} changed since the plan was made; "
            "make a new plan"
        )
    steps = tuple(plan_steps_json(plan_))
    if steps != tuple(saved.steps):
        raise StalePlan("stale plan: the same revision and servers now plan other steps")
