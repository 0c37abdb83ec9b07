"""Traffic rollouts: the new pool's servers take the new versions while the router sends
them nothing, then each planned phase sets the route (a mirror share, a canary share, the
blue-green switch) and the analysis watches the new pool under it, reading the router's own
statistics for that pool beside Triton's counters and the probes; then the old pool's
servers take the new versions and the route is set to its final form. Any failure sets
the route back to the old pool in one router update, before anything else is put back.
A phase fails when the router that took its route is not the one answering any more
(``RouterIdentity``). Called by ``engine/apply.py``; everything it runs is planned
(``RolloutPlan.traffic``).
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial

from reconciler.core.plan.traffic import routes_as
from reconciler.engine.change import prepare_analysis, run_steps
from reconciler.engine.context import ChangeContext, Timing
from reconciler.engine.stages import (
    PooledFigures,
    Rollout,
    finish,
    finishing_index,
    shutdown_failure,
    take_back,
    through_stages,
)
from reconciler.model.analysis import Figures
from reconciler.model.errors import RouterRestarted, RouterUnavailable
from reconciler.model.plan import Action, Step
from reconciler.model.results import (
    ChangeResult,
    FailureKind,
    StepResult,
)
from reconciler.model.traffic import TrafficPhase, TrafficPlan
from reconciler.ports import FiguresSource, ModelControl, ShadowComparison, TrafficRouter


class RouterIdentity:
    """Which router took a phase's route (the identity ``TrafficRouter.route`` returned),
    checked at every reading of the phase's analyses (``RoutedFigures``) and once more
    before the phase passes. Why by identity: a restarted Envoy comes back at its
    bootstrap's weights with its statistics started again, which reading the route back
    tells only when the phase set other weights (not so a canary's phase at no traffic),
    and reading the statistics only when a read falls within the restart (0.12 s); else
    the analysis judged a share the router no longer routed by, without the router's
    statistics (a counter that went backwards reads as no reading) and passed."""

    def __init__(self, router: TrafficRouter, name: str, phase: str) -> None:
        self.router, self.name, self.phase = router, name, phase
        # Set by ``took`` once the phase's route is set, before its analyses start, and
        # only read after. Until then (the readings taken before the route changes), and
        # for a router with no identity: nothing to check.
        self.taken: str | None = None

    def took(self, identity: str | None) -> None:
        self.taken = identity

    def check(self) -> None:
        """RouterRestarted when the router answering is not the one that took the route;
        RouterUnavailable when none answers."""
        if self.taken is None:
            return
        now = self.router.identity()
        if now != self.taken:
            raise RouterRestarted(
                f"router {self.name} restarted since the route of {self.phase} was set (or "
                f"another writer routed since; its identity was {self.taken!r}, now "
                f"{now!r}): the analysis did not watch the share it was set for"
            )


@dataclass(frozen=True)
class RoutedFigures:
    """A server's figures with the router's statistics for its pool beside them: what the
    pool's clients saw. RouterUnavailable when the router does not answer, RouterRestarted
    when it is not the one that took the phase's route (checked after the statistics are
    read, so that they are the taking router's)."""

    source: FiguresSource
    pool: str
    identity: RouterIdentity  # its router is the one read

    def figures(
        self, model: str, versions: tuple[int, ...], queries: Mapping[str, str] = {}
    ) -> Figures:
        figures = self.source.figures(model, versions, queries)
        routed = self.identity.router.figures((self.pool,))
        self.identity.check()
        return replace(figures, routed=routed[self.pool]) if routed else figures


def _route_step(plan: TrafficPlan, server: str, model: str, what: str) -> Step:
    return Step(
        server, model, Action.ROUTE, (), f"router {plan.router}: {what}", router=plan.router
    )


def set_route(
    router: TrafficRouter,
    weights: Mapping[str, int],
    mirror: Mapping[str, int],
    step: Step,
    timing: Timing,
    reverting: bool = False,
    identity: RouterIdentity | None = None,
) -> StepResult:
    """Set the route; ``identity`` (a phase's) told which router took it."""
    started = timing.clock()
    try:
        taken = router.route(weights, mirror)
    except RouterUnavailable as exc:
        ended = timing.clock()
        return StepResult(
            step, False, ended - started, str(exc), exc.failure, reverting, ended_at=ended
        )
    ended = timing.clock()
    if identity is not None:
        identity.took(taken)
    if step.router is not None:
        timing.events.routed(step.router, weights, mirror)
    return StepResult(step, True, ended - started, reverting=reverting, ended_at=ended)


def run_traffic(run: Rollout) -> list[ChangeResult]:
    """Run one ModelDeployment's traffic rollout (see the module's docstring)."""
    rollout, plan, router = run.plan, run.plan.traffic, run.router
    assert plan is not None and router is not None  # kind_of chose this kind for them
    done: dict[str, list[StepResult]] = {}
    contexts: dict[str, ChangeContext] = {}
    first = rollout.stages[0][0] if rollout.stages else ""
    model = rollout.model
    timing = run.timing
    # The route at rest first: a rollout cut short may have left the new pool with traffic.
    failure: StepResult | None = _checked(
        set_route(
            router,
            plan.restore.weights,
            plan.restore.mirror,
            _route_step(plan, first, model, plan.restore.reason),
            timing,
        )
    )
    if failure is None:

        def phases_after(index: int) -> StepResult | None:
            # The route's phases run once the new pool's servers hold the new versions.
            if index == 0 and rollout.stage_names[0] == f"{plan.new_pool} pool":
                return _phases(run, plan, router, done)
            return None

        failure = through_stages(run, contexts, done, phases_after)
    if failure is None:
        final = set_route(
            router,
            plan.final.weights,
            plan.final.mirror,
            _route_step(plan, first, model, plan.final.reason),
            timing,
        )
        for server, results in done.items():
            results.append(_on(final, server))
        failure = _checked(final)
    if failure is None:
        return [
            finish(run, server, done[server], contexts[server]) for server in sorted(run.changes)
        ]
    return _switch_back(run, plan, router, failure, done)


def _on(result: StepResult, server: str) -> StepResult:
    """A router step's result as one server's step (each touched server shows it)."""
    return replace(result, step=replace(result.step, server=server))


def _checked(result: StepResult) -> StepResult | None:
    return None if result.ok else result


def _switch_back(
    run: Rollout,
    plan: TrafficPlan,
    router: TrafficRouter,
    failure: StepResult,
    done: Mapping[str, list[StepResult]],
) -> list[ChangeResult]:
    """Every request back to the old pool in one router update, then every server touched
    put back as a staged rollout does; the switch back is the first step of each revert."""
    back = set_route(
        router,
        plan.restore.weights,
        plan.restore.mirror,
        _route_step(
            plan, failure.step.server, run.plan.model, f"switch back: {plan.restore.reason}"
        ),
        run.timing,
        reverting=True,
    )
    run.progress(back)
    outcome = take_back(run, failure, done)
    return [
        replace(
            result, revert=(replace(back, step=replace(back.step, server=server)), *result.revert)
        )
        if (server := result.change.server) in done
        else result
        for result in outcome
    ]


def _phases(
    run: Rollout, plan: TrafficPlan, router: TrafficRouter, done: dict[str, list[StepResult]]
) -> StepResult | None:
    """Each phase: set the route, then the new pool's analyses under it, concurrently; then
    check the router still routes as set. The first failure, if any."""
    analyses = run.plan.analyses
    # minEvidence is the rollout's: counted over every phase, judged in the last watched one.
    last = max((i for i, p in enumerate(plan.phases) if p.watch > 0), default=-1)
    evidence = {step.server: 0.0 for step in analyses}
    for index, phase in enumerate(plan.phases):
        if plan.drop_old_first and (
            phase.weights.get(plan.new_pool) or phase.mirror.get(plan.new_pool)
        ):
            failure = _drop_old(run, plan, done)
            if failure is not None:
                return failure
        stopped = shutdown_failure(
            run.timing, _route_step(plan, analyses[0].server, run.plan.model, phase.name)
        )
        if stopped is not None:
            return stopped
        # Everything the analyses need is read before the route changes (the counters'
        # origin, the probes' requests tried on the old version): from the moment the new
        # pool takes its share, the first probes are out within milliseconds.
        identity = RouterIdentity(router, plan.router, phase.name)
        prepared = [
            _prepare(run, plan, identity, phase, step, evidence[step.server], index == last)
            for step in analyses
        ]
        shadow: ShadowComparison | None = None
        if phase.shadow is not None:
            shadow, failure = _comparison(run, plan, phase, analyses[0])
            if failure is not None:
                _close_probers(prepared)
                for step in analyses:
                    done[step.server].append(_on(failure, step.server))
                return failure
            for _, context in prepared:
                context.shadow = shadow
        try:
            failure = _watched_phase(run, plan, identity, phase, prepared, evidence, done)
        finally:
            if shadow is not None:
                shadow.end()
        if failure is not None:
            return failure
    return None


def _comparison(
    run: Rollout, plan: TrafficPlan, phase: TrafficPhase, step: Step
) -> tuple[ShadowComparison | None, StepResult | None]:
    """The comparator's session for a shadow phase, begun before the router mirrors to it;
    else the failure that stops the rollout (no comparator, or it cannot listen)."""
    assert phase.shadow is not None
    what = _route_step(plan, step.server, step.model, f"{phase.name}: the comparator")
    if run.comparator is None:
        why = (
            "no comparator runs here: rollout.traffic.shadow needs the reconciler started "
            "with --comparator-listen HOST:PORT (the address Router spec.comparator reaches)"
        )
        return None, StepResult(what, False, 0.0, why, FailureKind.METRICS_UNAVAILABLE)
    try:
        return run.comparator.begin(phase.shadow), None
    except RuntimeError as exc:  # nothing known against the versions: put back, not held
        return None, StepResult(what, False, 0.0, str(exc), FailureKind.METRICS_UNAVAILABLE)


def _watched_phase(
    run: Rollout,
    plan: TrafficPlan,
    identity: RouterIdentity,
    phase: TrafficPhase,
    prepared: list[tuple[Step, ChangeContext]],
    evidence: dict[str, float],
    done: dict[str, list[StepResult]],
) -> StepResult | None:
    """One phase once prepared: the route set, the analyses under it, the router's
    identity checked and the route read back."""
    analyses = run.plan.analyses
    routed = set_route(
        identity.router,
        phase.weights,
        phase.mirror,
        _route_step(plan, analyses[0].server, run.plan.model, phase.name),
        run.timing,
        identity=identity,
    )
    for step in analyses:
        done[step.server].append(_on(routed, step.server))
    run.progress(routed)
    if not routed.ok or phase.watch <= 0:
        _close_probers(prepared)
        return None if routed.ok else routed
    with ThreadPoolExecutor(max_workers=max(1, len(analyses))) as workers:
        watched = list(workers.map(partial(_analyse, run), prepared))
    for step, context in prepared:
        evidence[step.server] += context.evidence
    failure = None
    for step, results in zip(analyses, watched, strict=True):
        done[step.server].extend(results)
        if results and not results[-1].ok:
            failure = failure or results[-1]
    if failure is not None:
        return failure
    drift = _drifted(identity, plan, phase, analyses[0])
    if drift is not None:
        for step in analyses:
            done[step.server].append(_on(drift, step.server))
        return drift
    return None


def _close_probers(prepared: list[tuple[Step, ChangeContext]]) -> None:
    """The probes prepared for analyses that will not run."""
    for _, context in prepared:
        if context.prober is not None:
            context.prober.close()


def _drop_old(
    run: Rollout, plan: TrafficPlan, done: dict[str, list[StepResult]]
) -> StepResult | None:
    """The old versions' unload on the new pool's servers that need it before the pool
    takes any request (``TrafficPlan.drop_old_first``); once: their finish is then done."""
    for server in sorted(set(plan.drop_old_first) - run.early):
        change = run.changes[server]
        finish = change.steps[finishing_index(change) :]
        results = run_steps(run.controls[server], finish, run.timing, run.progress, ChangeContext())
        done[server].extend(results)
        if results and not results[-1].ok:
            return results[-1]
        run.early.add(server)
    return None


def _prepare(
    run: Rollout,
    plan: TrafficPlan,
    identity: RouterIdentity,
    phase: TrafficPhase,
    step: Step,
    evidence_before: float,
    judge_evidence: bool,
) -> tuple[Step, ChangeContext]:
    """One new-pool server's analysis under ``phase``, ready to run: for the phase's time,
    its figures carrying the router's statistics for the new pool, its baseline the old
    pool's servers, its counters' origin read and its probes prepared; the evidence of the
    earlier phases carried in, minEvidence judged only in the last (``judge_evidence``)."""
    server = step.server
    source = run.metrics.get(server)
    old = run.plan.baselines[0] if run.plan.baselines else ()
    pool = tuple(m for s in old if (m := run.metrics.get(s)) is not None)
    context = ChangeContext(
        RoutedFigures(source, plan.new_pool, identity) if source is not None else None,
        baseline=PooledFigures(pool) if pool else None,
        hooks=run.hooks,
        evidence_before=evidence_before,
        judge_evidence=judge_evidence,
        # No client request reaches the new pool in this phase: only the probes.
        # (The comparator's calls are pinned, as the probes are.)
        probes_only=not phase.weights.get(plan.new_pool) and not phase.mirror.get(plan.new_pool),
    )
    assert step.analysis is not None
    watched = replace(
        step,
        reason=f"{phase.name}: {step.reason}" + _left_here(plan, server in run.early, step),
        analysis=replace(step.analysis, duration=phase.watch),
    )
    change = replace(run.changes[server], steps=(watched,))
    prepare_analysis(run.controls[server], change, context, run.timing, _old_at(run, plan, server))
    return watched, context


def _old_at(run: Rollout, plan: TrafficPlan, server: str) -> ModelControl | None:
    """Where ``server``'s analysis probes the old versions: there, until the rollout
    unloaded them there (``TrafficPlan.drop_old_first``); then on the old pool's server the
    plan names, which keeps them until the phases end."""
    if server not in run.early:
        return run.controls[server]
    return run.controls.get(plan.old_probed_on) if plan.old_probed_on is not None else None


def _left_here(plan: TrafficPlan, gone: bool, step: Step) -> str:
    """What the planned reason cannot say once the old versions left the server (``gone``)."""
    if not gone or not step.baseline:
        return ""
    old, where = ", ".join(map(str, step.baseline)), plan.old_probed_on
    return f" (since then {old} unloaded here; " + (
        f"its probes compare with {old} on {where})" if where else "no old version to probe)"
    )


def _analyse(run: Rollout, prepared: tuple[Step, ChangeContext]) -> list[StepResult]:
    step, context = prepared
    return run_steps(run.controls[step.server], (step,), run.timing, run.progress, context)


def _drifted(
    identity: RouterIdentity, plan: TrafficPlan, phase: TrafficPhase, step: Step
) -> StepResult | None:
    """A failure when the router that took the phase's route is not the one answering (the
    last reading of the analyses may have come before a restart), or no longer routes as
    the phase set it (changed by hand): what the analysis watched is not what was set, so
    nothing is known against the versions."""
    what = _route_step(plan, step.server, step.model, f"{phase.name}: read back")
    try:
        identity.check()
    except RouterUnavailable as exc:
        return StepResult(what, False, 0.0, str(exc), exc.failure)
    state = identity.router.observe()
    if not state.reachable:
        return StepResult(what, False, 0.0, state.error, FailureKind.SERVER_LOST)
    if not routes_as(state, phase.weights, phase.mirror):
        return StepResult(
            what,
            False,
            0.0,
            f"router {plan.router} no longer routes as set ({state}; restarted or changed "
            "by hand?): the analysis did not watch the share it was set for",
            FailureKind.SERVER_LOST,
        )
    return None
