"""Rollouts that move traffic through a router: which pool is old and which new, the
route's phases (mirror, each step's share, blue-green's switch) with the analysis each
runs, the route a failure goes back to, and the steady route of every router that no
rollout is moving this pass (the drift a restarted Envoy or a hand edit leaves). Called by
``core/plan/planner.py`` and ``core/plan/stages.py``; ``engine/traffic.py`` only runs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from reconciler.core.triton_config import in_sequences, streams
from reconciler.model.plan import Action, ModelChange, PlanProblem, RolloutPlan, Step
from reconciler.model.shadow import ShadowTarget
from reconciler.model.spec import DesiredState, ModelDeployment
from reconciler.model.traffic import (
    WEIGHT_SCALE,
    RouterSpec,
    RouteState,
    RouteUpdate,
    Strategy,
    TrafficPhase,
    TrafficPlan,
    TrafficSpec,
    share_text,
)


def live_pool(traffic: TrafficSpec, state: RouteState) -> str:
    """blueGreen: the pool of the two with the larger share now (the first on a tie)."""
    return max(traffic.pools, key=lambda pool: (state.share(pool), -traffic.pools.index(pool)))


def _only(router: RouterSpec, pool: str) -> dict[str, int]:
    return {p.name: WEIGHT_SCALE if p.name == pool else 0 for p in router.pools}


def _none_mirrored(router: RouterSpec) -> dict[str, int]:
    return dict.fromkeys(router.mirror_targets, 0)


def routes_as(state: RouteState, weights: Mapping[str, int], mirror: Mapping[str, int]) -> bool:
    """The router routes by ``weights`` (as shares) and mirrors ``mirror``'s shares."""
    total = sum(weights.values())
    return all(
        state.share(pool) == round(weight * WEIGHT_SCALE / total)
        for pool, weight in weights.items()
    ) and all(state.mirror.get(pool, 0) == share for pool, share in mirror.items())


def steady_routes(
    desired: DesiredState, routes: Mapping[str, RouteState], moving: set[str]
) -> tuple[RouteUpdate, ...]:
    """For every reachable router no rollout moves this pass (``moving``) and that does not
    route as it should when at rest, the update that puts it back: every request to the
    stable pool of a canary deployment, or to the pool a blue-green deployment left live,
    nothing mirrored."""
    updates = []
    for name, router in sorted(desired.routers.items()):
        state = routes.get(name)
        if state is None or not state.reachable:
            continue
        if name in moving:
            if state.affinity_drift:  # written back before the rollout moves the route
                updates.append(RouteUpdate(name, {}, {}, _restoring(state), affinity=True))
            continue
        uses = [
            d.rollout.traffic
            for d in sorted(desired.deployments.values(), key=lambda d: d.name)
            if d.rollout.traffic is not None and d.rollout.traffic.router == name
        ]
        if not uses:
            continue
        canary = next((t for t in uses if t.strategy is Strategy.CANARY), None)
        pool = canary.pools[0] if canary is not None else live_pool(uses[0], state)
        weights, mirror = _only(router, pool), _none_mirrored(router)
        if not routes_as(state, weights, mirror):
            reason = (
                f"router {name} routes {state}; at rest it sends every request to "
                f"{pool}, nothing mirrored"
            )
            if state.affinity_drift:
                reason = f"{_restoring(state)}; {reason}"
            updates.append(
                RouteUpdate(name, weights, mirror, reason, affinity=bool(state.affinity_drift))
            )
        elif state.affinity_drift:
            updates.append(RouteUpdate(name, {}, {}, _restoring(state), affinity=True))
    return tuple(updates)


def _restoring(state: RouteState) -> str:
    return f"sequence affinity restored ({'; '.join(state.affinity_drift)})"


NO_COMPARATOR = (
    "rollout.traffic.shadow needs a comparator, and none listens here: start the reconciler "
    "with --comparator-listen HOST:PORT (the address the Router's spec.comparator reaches); "
    "nothing of {name} is touched, traffic left where it is"
)


def unroutable(
    desired: DesiredState,
    changes: list[ModelChange],
    routes: Mapping[str, RouteState],
    comparing: bool = True,
) -> tuple[list[ModelChange], list[PlanProblem]]:
    """``changes`` without those of traffic rollouts that cannot run this pass: their
    router did not answer (nothing of theirs is touched, traffic stays where it is), a
    shadow phase comes first and no comparator listens (``comparing``: the reconciler was
    given --comparator-listen), or another deployment's rollout moves the same router's
    traffic (it waits its turn)."""
    kept: list[ModelChange] = []
    problems: list[PlanProblem] = []
    moving: dict[str, str] = {}  # router -> the deployment whose rollout moves it
    for change in sorted(changes, key=lambda c: (c.deployment or "", c.server)):
        deployment = desired.deployments.get(change.deployment or "")
        traffic = deployment.rollout.traffic if deployment is not None else None
        if deployment is None or traffic is None:
            kept.append(change)
            continue
        if traffic.shadow is not None and not comparing:
            # Refused before any load: the candidate would load on the new pool and the
            # rollout fail only at its first phase.
            message = NO_COMPARATOR.format(name=deployment.name)
            problems.append(PlanProblem(change.server, change.model, message))
            continue
        refusal = _sequence_refusal(desired, deployment, change, routes)
        if refusal is not None:
            problems.append(PlanProblem(change.server, change.model, refusal))
            continue
        state = routes.get(traffic.router)
        if state is None or not state.reachable:
            why = state.error if state is not None and state.error else "not observed"
            problems.append(
                PlanProblem(
                    change.server,
                    change.model,
                    f"{why}; the rollout of {deployment.name} waits, nothing touched, traffic "
                    "left where it is",
                )
            )
            continue
        owner = moving.setdefault(traffic.router, deployment.name)
        if owner != deployment.name:
            problems.append(
                PlanProblem(
                    change.server,
                    change.model,
                    f"waits: router {traffic.router} moves traffic for {owner} this pass",
                )
            )
            continue
        kept.append(change)
    order = {id(c): i for i, c in enumerate(changes)}
    return sorted(kept, key=lambda c: order[id(c)]), problems


def _sequence_refusal(
    desired: DesiredState,
    deployment: ModelDeployment,
    change: ModelChange,
    routes: Mapping[str, RouteState],
) -> str | None:
    """Why a sequence model's traffic rollout may not run: its router declares no sequence
    affinity (and the deployment does not say its clients need none), or the affinity
    drifted and is not back yet. ``change.exclusive``: the plan knows the model is a
    sequence model (its config, the repository's config.pbtxt among them)."""
    traffic = deployment.rollout.traffic
    assert traffic is not None
    if change.exclusive is None or traffic.allow_without_affinity:
        return None
    router = desired.routers.get(traffic.router)
    if router is None:
        return None
    if router.sequence_affinity is None:
        return (
            f"{deployment.name} is a sequence model (sequence_batching in its config) and "
            f"Router {router.name} ({router.location}) declares no spec.sequenceAffinity: "
            "each traffic step would send the later requests of sequences in flight to a "
            "server that never saw their START; declare it, or set "
            f"rollout.traffic.allowWithoutSequenceAffinity: true ({traffic.location}) if "
            "the clients keep each sequence on one server; nothing touched"
        )
    state = routes.get(router.name)
    if state is not None and state.affinity_drift:
        return (
            f"waits: router {router.name}'s sequence affinity is being restored "
            f"({'; '.join(state.affinity_drift)}); nothing touched, traffic left where it is"
        )
    return None


def traffic_rollout(
    desired: DesiredState,
    deployment: ModelDeployment,
    changes: list[ModelChange],
    state: RouteState,
) -> tuple[RolloutPlan, list[ModelChange]]:
    """The rollout of ``deployment``'s ``changes`` through its router, and the changes as
    they run in it (without analyze steps: the analysis runs under each phase)."""
    traffic = deployment.rollout.traffic
    assert traffic is not None
    router = desired.routers[traffic.router]
    if traffic.strategy is Strategy.CANARY:
        old, new = traffic.pools
    else:
        old = live_pool(traffic, state)
        new = next(p for p in traffic.pools if p != old)
    pool_of = {c.server: router.pool_of(desired.servers[c.server]) for c in changes}
    sequenced = any(c.exclusive is not None for c in changes)  # a sequence model's changes
    stripped = [
        replace(
            c,
            steps=tuple(s for s in c.steps if s.action is not Action.ANALYZE),
            revert=_drained_first(c) if pool_of[c.server] == new else c.revert,
        )
        for c in changes
    ]
    # A first deployment has no old versions to send traffic back to, and no client calls
    # a model that is not there yet: it loads everywhere, with no phase and no analysis.
    first = not any(c.serving for c in changes)
    below = tuple(
        sorted(
            c.server
            for c in changes
            if pool_of[c.server] == new
            and c.serving
            and c.desired
            and max(c.desired) < max(c.serving)
        )
    )
    analyses = (
        ()
        if first
        else tuple(
            _analysis(deployment, change) for change in changes if pool_of[change.server] == new
        )
    )
    new_servers = tuple(sorted(c.server for c in changes if pool_of[c.server] == new))
    old_servers = tuple(sorted(c.server for c in changes if pool_of[c.server] == old))
    stages = tuple(s for s in (new_servers, old_servers) if s)
    names = tuple(
        name
        for name, servers in ((f"{new} pool", new_servers), (f"{old} pool", old_servers))
        if servers
    )
    restore = RouteUpdate(
        router.name,
        _only(router, old),
        _none_mirrored(router),
        f"every request to {old}, nothing mirrored",
    )
    shadow = _shadow_target(desired, deployment, changes, pool_of, old, new)
    plan = TrafficPlan(
        router.name,
        traffic.strategy,
        old,
        new,
        _phases(
            router,
            traffic,
            deployment,
            (old, new),
            shadow,
            streaming=any(a.streaming for a in analyses),
            sequences=sequenced,
        )
        if analyses
        else (),
        restore,
        restore
        if traffic.strategy is Strategy.CANARY
        else RouteUpdate(router.name, _only(router, new), _none_mirrored(router), f"all to {new}"),
        below,
        old_probed_on=_old_probed_on(changes, below, old_servers),
        splits_sequences=router.sequence_affinity is None and sequenced,
    )
    rollout = RolloutPlan(
        deployment.name,
        deployment.model,
        deployment.fingerprint,
        stages,
        names,
        tuple(len(stage) for stage in stages),
        deployment.rollout.pre_step,
        deployment.rollout.post_step,
        # The new pool's servers are compared with the old pool's, still on the old versions.
        tuple(old_servers if stage is new_servers else () for stage in stages),
        traffic=plan,
        analyses=analyses,
    )
    return rollout, stripped


def _old_probed_on(
    changes: list[ModelChange], below: tuple[str, ...], old_servers: tuple[str, ...]
) -> str | None:
    """The first old-pool server still serving the highest old version of each of the new
    pool's servers in ``below``: their phases after the unload probe it there. An old pool
    server keeps its old versions until the phases end (its stage comes after them)."""
    if not below:
        return None
    serving = {c.server: c.serving for c in changes}
    wanted = {max(serving[s]) for s in below}
    return next((s for s in old_servers if wanted <= set(serving[s])), None)


def _drained_first(change: ModelChange) -> tuple[Step, ...]:
    """A sequence model's revert on a server of the new pool: after the switch back no new
    sequence starts there, and unless the new versions failed (``Step.unless_failed``) the
    sequences in flight on them end there before they go, as the change's own drain."""
    drain = next((s for s in change.steps if s.action is Action.DRAIN), None)
    new = tuple(v for v in change.desired if v not in change.serving)
    if drain is None or drain.drain is None or not new or not change.revert:
        return change.revert
    policy = drain.drain
    step = Step(
        change.server,
        change.model,
        Action.DRAIN,
        new,
        f"the sequences in flight on {', '.join(map(str, new))} end here first (no new "
        f"inference for {policy.idle:g}s; at most {policy.drain_timeout:g}s), unless the "
        "new versions failed: then they are cut",
        drain=replace(policy, drain_webhook=None),
        on_failure=drain.on_failure,
        unless_failed=True,
    )
    return (step, *change.revert)


def _shadow_target(
    desired: DesiredState,
    deployment: ModelDeployment,
    changes: list[ModelChange],
    pool_of: Mapping[str, str | None],
    old: str,
    new: str,
) -> ShadowTarget | None:
    """What the comparator compares in the shadow phase: the version the old pool serves
    (what an unversioned request reaches: the highest) against the one the new pool takes.

    Both are asked on the new pool's servers when they hold the serving version beside the
    candidate (they do: new versions load beside the old): the same machine at the same
    (client-free) load, so that latencies compare like with like, and no comparator call
    lands on a server clients use. Measured on a canary: against the stable pool, where the
    calls queue behind live requests, a candidate twice as slow read +18% at p99. Else
    (a config change: the serving version reloads with the new config there) on the old
    pool's servers. None without ``rollout.traffic.shadow``, or with nothing on one
    side to compare (a first deployment)."""
    traffic = deployment.rollout.traffic
    if traffic is None or traffic.shadow is None:
        return None
    serving = [c for c in changes if pool_of[c.server] == old and c.serving]
    candidate = [c for c in changes if pool_of[c.server] == new and c.desired]
    if not serving or not candidate:
        return None
    version = max(max(c.serving) for c in serving)
    # Not when the config changes: the serving version loads again there with the new one.
    beside = [c for c in candidate if version in c.serving and not c.reconfigured]
    primary = beside if len(beside) == len(candidate) else serving
    return ShadowTarget(
        deployment.name,
        deployment.model,
        tuple(desired.servers[c.server].grpc for c in primary),
        version,
        tuple(desired.servers[c.server].grpc for c in candidate),
        max(max(c.desired) for c in candidate),
        traffic.shadow,
        new if primary is beside else old,
        tuple(desired.servers[c.server].http for c in primary),
        tuple(desired.servers[c.server].http for c in candidate),
    )


def _phases(
    router: RouterSpec,
    traffic: TrafficSpec,
    deployment: ModelDeployment,
    pools: tuple[str, str],
    shadow: ShadowTarget | None = None,
    *,
    streaming: bool = False,
    sequences: bool = False,
) -> tuple[TrafficPhase, ...]:
    old, new = pools
    analysis = deployment.analysis
    duration = analysis.duration if analysis is not None else 0.0
    nothing = _none_mirrored(router)
    phases = []
    if shadow is not None and router.comparator is not None:
        # Copies of live requests to the comparator before the new pool takes any: the new
        # version is compared with the serving one, answer by answer; no client meets it.
        phases.append(
            TrafficPhase(
                f"shadow {share_text(shadow.spec.share)} to comparator {router.comparator}: "
                f"version {shadow.candidate_version} on {new} compared with version "
                f"{shadow.primary_version} on {shadow.primary_pool}",
                _only(router, old),
                {**nothing, router.comparator: shadow.spec.share},
                duration,
                shadow=shadow,
            )
        )
    if traffic.mirror:
        phases.append(
            TrafficPhase(
                f"mirror {share_text(traffic.mirror)} to {new}",
                _only(router, old),
                {**nothing, new: traffic.mirror},
                duration,
            )
        )
    elif not phases and analysis is not None and analysis.probes.enabled:
        # (The shadow phase, when there is one, is this phase: the probes run under it.)
        # The new pool takes no request but the probes first: a version that fails them
        # is caught before any client meets it. blueGreen judges its idle pool so for the
        # whole analysis; a canary for one interval, then by its clients' share. A streaming
        # model's time to the first response is judged by the probes only where the loads
        # compare (core.latency.uneven_load), that is here: for the whole analysis too (one
        # interval held two 0.5 s probe streams a side, and a version 300 ms late reached 50
        # client streams at the steps, bench.streaming).
        judged_here = streaming and any(c.kind == "latency" for c in analysis.checks)
        whole = traffic.strategy is Strategy.BLUE_GREEN or judged_here
        watch = duration if whole else analysis.interval
        phases.append(
            TrafficPhase(f"{new} at no traffic (probes)", _only(router, old), nothing, watch)
        )
    for index, share in enumerate(traffic.steps):
        weights = {**_only(router, old), old: WEIGHT_SCALE - share, new: share}
        last = index == len(traffic.steps) - 1
        watch = max(duration, traffic.keep_old) if last else duration
        label = "switch" if traffic.strategy is Strategy.BLUE_GREEN else "step"
        phases.append(
            TrafficPhase(
                f"{label} {index + 1} of {len(traffic.steps)}: {new} {share_text(share)}",
                weights,
                nothing,
                watch,
            )
        )
    if sequences and traffic.strategy is Strategy.CANARY and traffic.steps[-1] < WEIGHT_SCALE:
        # A sequence model's old pool takes the new versions only once the sequences in
        # flight there have ended (each of its servers' changes drains first), and they end
        # only when no new one starts there: every new sequence goes to the canary, judged
        # at the last step, until the old pool has drained and the route is set back.
        phases.append(
            TrafficPhase(
                f"drain {old}: every new sequence to {new} while those in flight on {old} end "
                "there",
                _only(router, new),
                nothing,
                0.0,
            )
        )
    return tuple(phases)


def _analysis(deployment: ModelDeployment, change: ModelChange) -> Step:
    """The analysis a phase runs on one server of the new pool: the change's own, or, for
    a server whose versions were loaded by a pass cut short (no analyze step planned), one
    made the same way over its new versions."""
    planned = next((s for s in change.steps if s.action is Action.ANALYZE), None)
    if planned is not None:
        # The router, not the load, gives the new versions their clients: the old versions
        # are not probed under load before it (``Step.old_under_load``).
        return replace(planned, old_under_load=0)
    assert deployment.analysis is not None  # validation: rollout.traffic needs an analysis
    new = tuple(v for v in change.desired if v not in change.serving) or change.desired
    old = tuple(v for v in change.serving if v not in change.desired)
    loaded = next((s.config for s in change.steps if s.action is Action.LOAD), None)
    return Step(
        change.server,
        change.model,
        Action.ANALYZE,
        new,
        f"watch {', '.join(map(str, new))} under the router's traffic",
        analysis=deployment.analysis,
        baseline=old,
        streaming=streams(loaded),
        sequence=in_sequences(loaded),
    )
