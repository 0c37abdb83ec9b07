"""Staged rollouts across servers: which servers each stage of a
ModelDeployment's rollout takes, in order; each stage's latency baseline; and the finish of a
server found restarted after its stage passed. Called by ``core/plan/planner.py``; what it
plans, ``engine/staged.py`` only runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from reconciler.core.plan.traffic import traffic_rollout
from reconciler.core.triton_config import with_versions
from reconciler.model.history import History
from reconciler.model.plan import Action, ModelChange, RolloutPlan, Step
from reconciler.model.spec import DesiredState, RolloutSpec
from reconciler.model.traffic import RouteState


def _count(value: int | str, total: int) -> int:
    """A count, or a percentage of ``total`` rounded up; at least 1, at most ``total``."""
    number = -(-total * int(value.rstrip("%")) // 100) if isinstance(value, str) else value
    return max(1, min(total, number))


def staged_rollouts(
    desired: DesiredState,
    changes: list[ModelChange],
    history: History,
    routes: Mapping[str, RouteState],
) -> tuple[tuple[RolloutPlan, ...], list[ModelChange]]:
    """The staged rollouts, and ``changes`` as they run in them (a traffic rollout's
    without their analyze steps, which run under the router's phases)."""
    by_deployment, resumed = _staged_changes(desired, changes, history)
    plans = []
    replaced: dict[tuple[str, str], ModelChange] = {}
    for name, staged in sorted(by_deployment.items()):
        deployment = desired.deployments[name]
        spec = deployment.rollout
        if not spec.staged:
            continue
        if spec.traffic is not None:
            rollout, stripped = traffic_rollout(
                desired, deployment, staged, routes[spec.traffic.router]
            )
            plans.append(rollout)
            replaced.update({(c.server, c.model): c for c in stripped})
            continue
        already = sorted(resumed.get(name, ()))
        servers = sorted(c.server for c in staged if c.server not in already)
        stages, names = _stages(desired, spec, servers, already)
        plans.append(
            RolloutPlan(
                name,
                deployment.model,
                deployment.fingerprint,
                stages,
                names,
                tuple(
                    _count(spec.max_parallel, len(stage)) if spec.max_parallel else len(stage)
                    for stage in stages
                ),
                spec.pre_step,
                spec.post_step,
                _baselines(stages, names),
            )
        )
    return tuple(plans), [replaced.get((c.server, c.model), c) for c in changes]


def _staged_changes(
    desired: DesiredState, changes: list[ModelChange], history: History
) -> tuple[dict[str, list[ModelChange]], dict[str, list[str]]]:
    """Per ModelDeployment, the changes a staged rollout would take (those that load), and
    the servers among them a stopped pass had already taken through their stage."""
    by_deployment: dict[str, list[ModelChange]] = {}
    resumed: dict[str, list[str]] = {}
    for change in changes:
        if change.deployment is None or change.heals:
            # A reload in place of versions that stopped answering is no rollout: no stage,
            # no route change, one server as its probes found it.
            continue
        loads = any(s.action is Action.LOAD for s in change.steps)
        record = history.staged.get(change.deployment)
        deployment = desired.deployments[change.deployment]
        fingerprint = deployment.fingerprint
        if loads or deployment.rollout.traffic is not None:
            # Through a router every change takes part: a new-pool server a stopped pass
            # left with both versions is analysed under the route again, never promoted.
            by_deployment.setdefault(change.deployment, []).append(change)
        elif record and record.fingerprint == fingerprint and change.server in record.completed:
            # Touched before the reconciler stopped: new versions loaded and verified, old
            # ones still loaded. It waits for the rest of the rollout, as it would have.
            by_deployment.setdefault(change.deployment, []).append(change)
            resumed.setdefault(change.deployment, []).append(change.server)
    return by_deployment, resumed


def _stages(
    desired: DesiredState, spec: RolloutSpec, servers: list[str], already: list[str]
) -> tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]:
    """The stages (server names) and their names: resumed, preview, then each step."""
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
    return tuple(stages), tuple(names)


def _baselines(
    stages: tuple[tuple[str, ...], ...], names: tuple[str, ...]
) -> tuple[tuple[str, ...], ...]:
    """Per stage, the servers whose old versions pool into its latency baseline: the
    production servers of later stages, still on the old versions, as a canary's baseline
    (preview and resumed servers are not production, or already carry new versions)."""
    return tuple(
        tuple(
            server
            for later, name in zip(stages[index + 1 :], names[index + 1 :], strict=True)
            if name not in ("preview", "resumed")
            for server in later
        )
        for index in range(len(stages))
    )


def with_restarted_finish(
    changes: list[ModelChange], rollouts: tuple[RolloutPlan, ...]
) -> list[ModelChange]:
    """``changes`` with the finish planned for every staged rollout's server that is found,
    once the rollout passed, to have lost every version of the model (see
    ``_restarted_finish``)."""
    members = {(r.deployment, server) for r in rollouts for stage in r.stages for server in stage}
    return [
        replace(change, restarted_finish=_restarted_finish(change))
        if change.deployment is not None and (change.deployment, change.server) in members
        else change
        for change in changes
    ]


def _restarted_finish(change: ModelChange) -> tuple[Step, ...]:
    """The end of a passed rollout on a server that lost every version of the model since
    its stage passed (restarted: EXPLICIT mode starts empty): load and verify the desired
    versions again, saying why. They passed their verify and analysis on this server before
    the restart, and every later stage passed since, so they are what it must serve; the
    planned finish would load them without a word, or, with no old version to drop, leave
    the server empty. Nothing when the change has no config to load with."""
    config = next((s.config for s in change.steps if s.config is not None), None)
    if config is None:
        return ()
    versions = ", ".join(map(str, change.desired))
    lost = (
        f"server {change.server} lost every version of {change.model} after its stage "
        "passed (restarted?)"
    )
    verify = next((s for s in change.steps if s.action is Action.VERIFY), None)
    return (
        Step(
            change.server,
            change.model,
            Action.LOAD,
            change.desired,
            f"{lost}: load {versions} again, which the rollout passed with",
            config=with_versions(config, change.model, change.desired),
        ),
        replace(
            verify or Step(change.server, change.model, Action.VERIFY, (), ""),
            versions=change.desired,
            reason=f"{lost}: {versions} READY again",
            # The old versions are gone from this server: nothing to compare with there.
            interface_check=False,
            shadow=None,
            shadow_against=None,
        ),
    )
