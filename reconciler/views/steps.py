"""Steps as JSON: the plan's wire form, also what a saved plan compares."""

from __future__ import annotations

from typing import Any

from reconciler.model.plan import Action, Plan, Step


def step_json(step: Step) -> dict[str, Any]:
    data: dict[str, Any] = {
        "server": step.server,
        "model": step.model,
        "action": str(step.action),
        "versions": list(step.versions),
        "reason": step.reason,
    }
    if step.action is Action.UNLOAD:
        data["dropped"] = list(step.dropped)
    if step.action is Action.VERIFY:
        data["smoke_cases"] = [case.name for case in step.smoke]
        data["smoke_versions"] = list(step.smoke_versions)
    if step.action is Action.ANALYZE and step.analysis is not None:
        data["analysis"] = {
            "interval_seconds": step.analysis.interval,
            "duration_seconds": step.analysis.duration,
            "failure_limit": step.analysis.failure_limit,
            "no_traffic": str(step.analysis.no_traffic),
            "checks": [c.name for c in step.analysis.checks],
            "baseline_versions": list(step.baseline),
        }
    return data


def plan_steps_json(plan_: Plan) -> list[dict[str, Any]]:
    """The plan's steps as JSON-ready data: what a saved plan commits to."""
    return [step_json(step) for step in plan_.steps]
