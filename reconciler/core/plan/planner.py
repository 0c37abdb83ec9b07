"""``plan``: the whole desired state against every server, into one
Plan.
"""

from __future__ import annotations

from collections.abc import Mapping

from reconciler.core.plan.changes import plan_model
from reconciler.core.plan.held import plan_held, plan_removal
from reconciler.core.plan.order import order_changes
from reconciler.core.plan.settle import as_before_the_stop, await_load_in_progress
from reconciler.core.plan.stages import staged_rollouts, with_restarted_finish
from reconciler.core.plan.traffic import steady_routes, unroutable
from reconciler.core.triton_config import DriftMemo
from reconciler.model.history import ALL_DEPLOYMENTS, Held, History
from reconciler.model.plan import ModelChange, Plan, PlanProblem
from reconciler.model.serving import ServingState
from reconciler.model.spec import DesiredState
from reconciler.model.traffic import RouteState


def plan(
    desired: DesiredState,
    serving: ServingState,
    history: History,
    revision: str,
    skip: Mapping[str, str] | None = None,
    settled: frozenset[str] = frozenset(),
    routes: Mapping[str, RouteState] | None = None,
    comparing: bool = True,
) -> Plan:
    """Diff what the manifests ask for against what the servers serve.

    Servers in ``skip`` (name -> why, e.g. backing off after failures) are reported as
    problems and left alone. Servers in ``settled`` are known to plan nothing: an earlier
    plan of the same ``settle_key`` had no change and no problem for them. They are reported
    in sync (or held, or suspended) without planning each model again, which is what keeps a
    no-op pass over a large fleet cheap. ``routes``: what each Router reports (a traffic
    rollout whose router is missing here, or unreachable, waits). ``comparing``: whether a
    comparator listens for shadow phases (without one, a rollout that begins with a shadow
    phase is a problem, nothing of it touched).
    """
    everything_suspended = ALL_DEPLOYMENTS in history.suspended
    drift_of = DriftMemo()
    changes: list[ModelChange] = []
    problems: list[PlanProblem] = []
    in_sync: list[tuple[str, str]] = []
    held: list[Held] = []
    suspended: list[tuple[str, str]] = []
    for server in sorted(desired.placements):
        if skip and server in skip:
            problems.append(PlanProblem(server, None, skip[server]))
            continue
        observed = serving.get(server)
        if observed is None or not observed.reachable:
            why = observed.error if observed is not None and observed.error else "not observed"
            problems.append(PlanProblem(server, None, why))
            continue
        placements = desired.placements[server]
        server_changes: list[ModelChange] = []
        for model_name in sorted(placements):
            deployment = placements[model_name].deployment
            if deployment.suspend or history.suspension_of(deployment.name) is not None:
                suspended.append((server, model_name))
                continue
            hold = history.holds.get(deployment.name)
            if hold is not None and hold.fingerprint != deployment.fingerprint:
                hold = None  # a commit changed the failed spec: the hold is over
            if hold is not None and (previous := hold.previous.get(server)) is not None:
                held.append(
                    Held(server, model_name, deployment.name, hold.revision, hold.reason, previous)
                )
            if server in settled:
                in_sync.append((server, model_name))
                continue
            if hold is not None:
                outcome = plan_held(server, deployment, hold, observed)
            else:
                outcome = plan_model(
                    server,
                    deployment,
                    as_before_the_stop(observed, deployment, history),
                    history,
                    drift_of,
                )
                outcome = await_load_in_progress(outcome, observed.model(model_name))
            if outcome is None:
                in_sync.append((server, model_name))
            elif isinstance(outcome, PlanProblem):
                problems.append(outcome)
            else:
                server_changes.append(outcome)
        if server in settled:
            continue
        # Suspended as a whole (``triton-gitops suspend``): no model leaves a server either.
        unplaced = set() if everything_suspended else history.managed.get(server, frozenset())
        for model_name in sorted(unplaced - set(placements)):
            removal = plan_removal(server, model_name, observed)
            if removal is not None:
                server_changes.append(removal)
        ordered, dependency_problems = order_changes(server, server_changes, placements, observed)
        changes.extend(ordered)
        problems.extend(dependency_problems)
    routes = routes or {}
    changes, waiting = unroutable(desired, changes, routes, comparing)
    problems.extend(waiting)
    rollouts, changes = staged_rollouts(desired, changes, history, routes)
    moving = {r.traffic.router for r in rollouts if r.traffic is not None}
    return Plan(
        revision,
        tuple(with_restarted_finish(changes, rollouts)),
        tuple(problems),
        tuple(in_sync),
        tuple(held),
        tuple(suspended),
        rollouts,
        () if everything_suspended else steady_routes(desired, routes, moving),
    )
