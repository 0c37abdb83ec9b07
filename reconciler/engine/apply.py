"""``apply``: a Plan's changes, servers concurrently (bounded), staged
rollouts stage by stage. Called by ``loop``; it executes what the plan decided and reaches
Triton, metrics and webhooks only through the ports it is given.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from reconciler.engine.change import apply_change, no_progress, no_stage_progress, server_lost
from reconciler.engine.context import ChangeContext, NoStepHooks, Timing
from reconciler.engine.orders import OrderWatch
from reconciler.engine.staged import run_staged
from reconciler.engine.stages import Rollout, RolloutKind
from reconciler.engine.traffic import run_traffic, set_route
from reconciler.model.errors import RouterUnavailable
from reconciler.model.plan import Action, ModelChange, Plan, RolloutPlan, Step
from reconciler.model.results import (
    ApplyResult,
    ChangeResult,
    Outcome,
    Progress,
    StagedProgress,
    StepResult,
)
from reconciler.model.traffic import RouteUpdate
from reconciler.ports import (
    Comparator,
    FiguresSource,
    ModelControl,
    OperatorOrders,
    StepHooks,
    TrafficRouter,
)


def apply(
    plan: Plan,
    controls: Mapping[str, ModelControl],
    *,
    max_parallel: int = 8,
    timing: Timing | None = None,
    progress: Progress = no_progress,
    metrics: Mapping[str, FiguresSource] | None = None,
    staged_progress: StagedProgress | None = None,
    hooks: StepHooks | None = None,
    routers: Mapping[str, TrafficRouter] | None = None,
    orders: OperatorOrders | None = None,
    resumed: Mapping[str, float] | None = None,
    comparator: Comparator | None = None,
) -> ApplyResult:
    """Execute every change of ``plan``; servers concurrently, each server's changes in order.

    ``progress`` is called with each step's result as it finishes (from worker threads).
    ``hooks`` calls the webhooks and replaceLibrary commands the plan's steps name (the
    caller passes ``adapters.hooks.HttpStepHooks()``); None: the executor was given none, and
    a step that needs one fails saying so. ``routers``: a client per Router the plan names
    (its steady-route updates run first; its traffic rollouts through them). ``orders``:
    where operators' aborts and promotes are read while the rollouts run (``engine/orders.py``);
    ``resumed``: the rollouts that resume an interrupted one, and since when their orders count
    (``core.orders.resumed_since``). ``comparator``: where a shadow phase's mirrored
    requests are compared (none: such a phase fails, saying so).
    """
    timing = timing or Timing()
    if orders is not None:
        deployments = {(c.server, c.model): c.deployment for c in plan.changes if c.deployment}
        watch = OrderWatch(orders, deployments, timing.wall(), timing.wall, resumed)
        timing = replace(timing, orders=watch)
    step_hooks: StepHooks = hooks or NoStepHooks()
    routers = routers or {}
    routes = tuple(_steady(routers, update, timing) for update in plan.routes)
    staged: dict[str, dict[str, ModelChange]] = {r.deployment: {} for r in plan.rollouts}
    members = {
        (r.deployment, server) for r in plan.rollouts for stage in r.stages for server in stage
    }
    by_server: dict[str, list[ModelChange]] = {}
    for change in plan.changes:
        if change.deployment is not None and (change.deployment, change.server) in members:
            staged[change.deployment][change.server] = change
            continue
        by_server.setdefault(change.server, []).append(change)
    # One server of a pool at a time for changes that take a model out of service there
    # (drains, library swaps, swaps without headroom).
    locks = {c.exclusive: threading.Lock() for c in plan.changes if c.exclusive}

    def run_server(server: str) -> list[ChangeResult]:
        results: list[ChangeResult] = []
        for change in by_server[server]:
            # Shutdown: finish the change in progress, start no other.
            if timing.stopping() or (results and server_lost(results[-1])):
                results.append(ChangeResult(change, Outcome.SKIPPED, ()))
                continue
            source = (metrics or {}).get(server)
            context = ChangeContext(source, hooks=step_hooks)
            if change.exclusive:
                with locks[change.exclusive]:
                    results.append(
                        apply_change(controls[server], change, timing, progress, source, context)
                    )
            else:
                results.append(
                    apply_change(controls[server], change, timing, progress, source, context)
                )
        return results

    with ThreadPoolExecutor(max_workers=max(1, max_parallel)) as pool:
        per_server = list(pool.map(run_server, sorted(by_server)))
    results = [r for server_results in per_server for r in server_results]
    for rollout in plan.rollouts:
        router = routers[rollout.traffic.router] if rollout.traffic is not None else None
        run = Rollout(
            plan=rollout,
            changes=staged[rollout.deployment],
            controls=controls,
            timing=timing,
            progress=progress,
            metrics=metrics or {},
            hooks=step_hooks,
            staged_progress=staged_progress or no_stage_progress,
            router=router,
            comparator=comparator,
        )
        results.extend(kind_of(rollout)(run))
    order = {(c.server, c.model): i for i, c in enumerate(plan.changes)}
    results.sort(key=lambda r: order[(r.change.server, r.change.model)])
    return ApplyResult(plan.revision, tuple(results), routes)


def kind_of(rollout: RolloutPlan) -> RolloutKind:
    """The one place that says which kind runs a rollout across servers: by traffic share
    through a router when the plan routes it, else stage by stage. (A change on one server,
    in place, is ``apply_change``.)"""
    return run_traffic if rollout.traffic is not None else run_staged


def _steady(
    routers: Mapping[str, TrafficRouter], update: RouteUpdate, timing: Timing
) -> StepResult:
    """A router put back to its steady route (``Plan.routes``)."""
    step = Step(
        "", "", Action.ROUTE, (), f"router {update.router}: {update.reason}", router=update.router
    )
    router = routers[update.router]
    if update.affinity:
        started = timing.clock()
        try:
            router.keep_affinity()
        except RouterUnavailable as exc:
            ended = timing.clock()
            return StepResult(step, False, ended - started, str(exc), exc.failure, ended_at=ended)
        if not update.weights:
            ended = timing.clock()
            return StepResult(step, True, ended - started, ended_at=ended)
    return set_route(router, update.weights, update.mirror, step, timing)
