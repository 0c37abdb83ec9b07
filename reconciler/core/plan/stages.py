"""Staged rollouts across servers: which servers each stage of a
ModelDeployment's rollout takes, in order.
"""

from __future__ import annotations

from reconciler.model.history import History
from reconciler.model.plan import Action, ModelChange, RolloutPlan
from reconciler.model.spec import DesiredState


def _count(value: int | str, total: int) -> int:
    """A count, or a percentage of ``total`` rounded up; at least 1, at most ``total``."""
    number = -(-total * int(value.rstrip("%")) // 100) if isinstance(value, str) else value
    return max(1, min(total, number))


def _rollouts(
    desired: DesiredState, changes: list[ModelChange], history: History
) -> tuple[RolloutPlan, ...]:
    by_deployment: dict[str, list[ModelChange]] = {}
    resumed: dict[str, list[str]] = {}
    for change in changes:
        if change.deployment is None:
            continue
        loads = any(s.action is Action.LOAD for s in change.steps)
        record = history.staged.get(change.deployment)
        fingerprint = desired.deployments[change.deployment].fingerprint
        if loads:
            by_deployment.setdefault(change.deployment, []).append(change)
        elif record and record.fingerprint == fingerprint and change.server in record.completed:
            # Touched before the reconciler stopped: new versions loaded and verified, old
            # ones still loaded. It waits for the rest of the rollout, as it would have.
            by_deployment.setdefault(change.deployment, []).append(change)
            resumed.setdefault(change.deployment, []).append(change.server)
    plans = []
    for name, staged in sorted(by_deployment.items()):
        deployment = desired.deployments[name]
        spec = deployment.rollout
        if not spec.staged:
            continue
        already = sorted(resumed.get(name, ()))
        servers = sorted(c.server for c in staged if c.server not in already)
        preview = tuple(s for s in servers if spec.previews(desired.servers[s]))
        production = [s for s in servers if s not in preview]
        stages: list[tuple[str, ...]] = []
        names: list[str] = []
        if already:
            stages.append(tuple(already))
            names.append("resumed")
        if preview:
            stages.append(preview)
            names.append("preview")
        # Step targets count every production server, those a stopped pass already took
        # included, so a resumed rollout goes on from the step it had reached.
        total = len(production) + len([s for s in already if not spec.previews(desired.servers[s])])
        done = total - len(production)
        steps = list(spec.steps) or ["100%"]
        for index, step in enumerate(steps):
            target = _count(step, total) if total else 0
            if index == len(steps) - 1:
                target = total  # the last step takes every server that is left
            if target > done:
                stages.append(
                    tuple(
                        production[
                            done - (total - len(production)) : target - (total - len(production))
                        ]
                    )
                )
                names.append(f"step {index + 1} of {len(steps)}")
                done = target
        plans.append(
            RolloutPlan(
                name,
                deployment.model,
                deployment.fingerprint,
                tuple(stages),
                tuple(names),
                tuple(
                    _count(spec.max_parallel, len(stage)) if spec.max_parallel else len(stage)
                    for stage in stages
                ),
                spec.pre_step,
                spec.post_step,
            )
        )
    return tuple(plans)
