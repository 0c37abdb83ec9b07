"""What the rollout kinds that run across servers share (``engine/staged.py``,
``engine/traffic.py``): their typed inputs (``Rollout``), the stages in order with their step
webhooks, every touched server taken back when one fails, and each server's finish once all
passed. Everything run here is planned (``RolloutPlan``); this module only observes which of
it applies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Protocol

from reconciler.core.readings import pooled
from reconciler.engine.change import (
    blame_elsewhere,
    failed_step,
    no_stage_progress,
    prepare_analysis,
    put_back,
    read_interface,
    run_steps,
)
from reconciler.engine.context import ChangeContext, Timing
from reconciler.model.analysis import Figures
from reconciler.model.errors import ReconcileError, ShutdownBetweenStages, StepFailed
from reconciler.model.plan import Action, ModelChange, RolloutPlan, Step
from reconciler.model.results import (
    ChangeResult,
    FailureKind,
    Outcome,
    Progress,
    StagedProgress,
    StepResult,
)
from reconciler.ports import Comparator, FiguresSource, ModelControl, StepHooks, TrafficRouter


def finishing_index(change: ModelChange, early: bool = False) -> int:
    """Where the trailing unload of old versions starts: it waits for the whole rollout,
    unless it ran ``early`` (a traffic rollout's new pool whose new versions are below the
    old: see ``TrafficPlan.drop_old_first``), and nothing is left to finish."""
    index = len(change.steps)
    if early:
        return index
    while (
        index > 0
        and change.steps[index - 1].action is Action.UNLOAD
        and change.steps[index - 1].versions
    ):
        index -= 1
    return index


@dataclass(frozen=True)
class PooledFigures:
    """The figures of several servers read as one: the baseline of a staged rollout's step
    (see ``pooled``)."""

    sources: tuple[FiguresSource, ...]

    def figures(
        self, model: str, versions: tuple[int, ...], queries: Mapping[str, str] = {}
    ) -> Figures:
        return pooled(tuple(s.figures(model, versions, queries) for s in self.sources))


@dataclass(frozen=True)
class Rollout:
    """One ModelDeployment's rollout across its servers, as apply hands it to its kind: the
    typed inputs every kind runs with (a staged rollout, a traffic rollout)."""

    plan: RolloutPlan
    changes: Mapping[str, ModelChange]  # server -> its change
    controls: Mapping[str, ModelControl]
    timing: Timing
    progress: Progress
    metrics: Mapping[str, FiguresSource]
    hooks: StepHooks
    staged_progress: StagedProgress = no_stage_progress
    router: TrafficRouter | None = None  # a traffic rollout's: RolloutPlan.traffic.router
    comparator: Comparator | None = None  # where a shadow phase's mirrored copies go
    # Servers whose old versions went before the finish (a traffic rollout adds them).
    early: set[str] = field(default_factory=set)


class RolloutKind(Protocol):
    """How one kind of rollout runs (``engine/staged.py``, ``engine/traffic.py``): every
    server's ChangeResult, put back together when it fails. Which kind runs a rollout is
    decided once, by ``engine.apply.kind_of``."""

    def __call__(self, rollout: Rollout, /) -> list[ChangeResult]: ...


def through_stages(
    run: Rollout,
    contexts: dict[str, ChangeContext],
    done: dict[str, list[StepResult]],
    after_forward: Callable[[int], StepResult | None] | None = None,
) -> StepResult | None:
    """Every stage in order: its preStep webhook, its servers' forward steps, then
    ``after_forward(index)`` if given (a traffic rollout's route phases), then its postStep
    webhook; the first failure (a shutdown among them), or None when all passed."""
    rollout = run.plan
    for index, stage in enumerate(rollout.stages):
        failure = shutdown_failure(
            run.timing, _hook_step(rollout, stage, rollout.stage_names[index])
        )
        if failure is None:
            failure = _call_hook(run, index, "preStep")
        if failure is not None:
            return failure
        # Recorded before the stage's servers are touched: if the reconciler stops now, the
        # next pass knows which servers may hold new versions beside old ones, and which of
        # them had passed their stage.
        started = {server: run.changes[server].serving for server in stage}
        run.staged_progress(rollout, tuple(sorted(done)), started)
        failure = _run_stage(run, index, contexts, done)
        if failure is None and after_forward is not None:
            failure = after_forward(index)
        if failure is None:
            failure = _call_hook(run, index, "postStep")
        if failure is not None:
            return failure
    return None


def _run_stage(
    run: Rollout,
    index: int,
    contexts: dict[str, ChangeContext],
    done: dict[str, list[StepResult]],
) -> StepResult | None:
    """Run one stage's forward steps on its servers; the first failure, if any."""
    stage = run.plan.stages[index]
    # The step's servers are compared with the servers the plan chose as this stage's
    # baseline (production servers still on the old versions), as a canary with its baseline.
    pool = tuple(
        source
        for server in (run.plan.baselines[index] if run.plan.baselines else ())
        if (source := run.metrics.get(server)) is not None
    )
    for server in stage:
        context = contexts.setdefault(
            server, ChangeContext(run.metrics.get(server), hooks=run.hooks)
        )
        context.baseline = PooledFigures(pool) if pool else None

    def forward(server: str) -> list[StepResult]:
        change, control = run.changes[server], run.controls[server]
        unread = read_interface(control, change, contexts[server])
        if unread is not None:
            return [unread]
        prepare_analysis(control, change, contexts[server], run.timing, control)
        forward_steps = change.steps[: finishing_index(change)]
        return run_steps(control, forward_steps, run.timing, run.progress, contexts[server])

    failure: StepResult | None = None
    with ThreadPoolExecutor(max_workers=max(1, run.plan.max_parallel[index])) as workers:
        for server, results in zip(stage, workers.map(forward, stage), strict=True):
            if results and not results[-1].ok:
                if results[-1].step.action in (Action.VERIFY, Action.ANALYZE):
                    results[-1] = blame_elsewhere(run.controls[server], run.plan.model, results[-1])
                failure = failure or results[-1]
            done[server] = results
    return failure


def shutdown_failure(timing: Timing, step: Step) -> StepResult | None:
    """The failure that ends a rollout before ``step`` once shutdown has begun (what it
    means is its error's, ``ShutdownBetweenStages``); None while it has not."""
    if not timing.stopping():
        return None
    now = timing.clock()
    stopped = ShutdownBetweenStages(f"shutdown began before {step.reason}")
    return failed_step(step, stopped, now, now, reverting=False)


# What stops a rollout without waiting for the sequences in flight on the new versions to
# end (``Step.unless_failed``): they failed (their analysis, an operator's abort), or the
# process is shutting down. Their drain then reads what it cuts (``model.results.Cut``).
CUT = frozenset({FailureKind.AGAINST_VERSIONS, FailureKind.INTERRUPTED})


def take_back(
    run: Rollout, failure: StepResult, done: Mapping[str, list[StepResult]]
) -> list[ChangeResult]:
    """Every server touched so far goes back; the others were never touched."""
    rollout = run.plan
    cause = StepResult(
        Step("", rollout.model, Action.ROLLOUT, (), "the rollout failed"),
        False,
        0.0,
        f"rollout of {rollout.deployment} stopped ({failure.step.server}): {failure.error}",
        # Every server taken back says what stopped the rollout, as that failure's error
        # said (``failed_step``): held only for a failure against the versions.
        failure=failure.failure,
    )
    outcome: list[ChangeResult] = []
    for server, change in sorted(run.changes.items()):
        mine = replace(cause, step=replace(cause.step, server=server))
        if server not in done:
            outcome.append(ChangeResult(change, Outcome.SKIPPED, (mine,)))
            continue
        steps = list(done[server])
        if all(r.ok for r in steps):
            steps.append(mine)
        # A revert's drain reads the model's counters; nothing else in a revert needs them.
        drains = any(s.action is Action.DRAIN for s in change.revert)
        again = ChangeContext(
            hooks=run.hooks,
            source=run.metrics.get(server) if drains else None,
            cutting=failure.failure in CUT,
        )
        reverted = run_steps(
            run.controls[server], change.revert, run.timing, run.progress, again, True
        )
        result = put_back(failure.failure, reverted)
        outcome.append(ChangeResult(change, result, tuple(steps), tuple(reverted)))
    return outcome


def finish(
    run: Rollout, server: str, forward: list[StepResult], context: ChangeContext
) -> ChangeResult:
    """The end of a passed rollout on one server: the planned finish (the old versions'
    unload), or the finish planned for a server that restarted since its stage passed."""
    change = run.changes[server]
    control = run.controls[server]
    if change.restarted_finish and _lost_every_version(control, change.model):
        finish = change.restarted_finish
    else:
        finish = change.steps[finishing_index(change, server in run.early) :]
    finished = run_steps(control, finish, run.timing, run.progress, context)
    every = (*forward, *finished)
    ok = all(r.ok for r in every)
    return ChangeResult(change, Outcome.CONVERGED if ok else Outcome.FAILED, every)


def _lost_every_version(control: ModelControl, model: str) -> bool:
    """The server lists no version of the model at all: it restarted (EXPLICIT mode starts
    empty). False when it does not answer: the planned finish then fails as a lost server
    (not held, the next pass rolls out there)."""
    try:
        return not control.model_state(model).versions
    except ReconcileError:
        return False


def _hook_step(rollout: RolloutPlan, stage: tuple[str, ...], what: str) -> Step:
    return Step(stage[0], rollout.model, Action.ROLLOUT, (), what)


def _call_hook(run: Rollout, index: int, which: str) -> StepResult | None:
    """Call a step webhook; a StepResult describing the refusal, or None when it agreed."""
    rollout = run.plan
    url = rollout.pre_step if which == "preStep" else rollout.post_step
    if url is None:
        return None
    stage = rollout.stages[index]
    change = run.changes[stage[0]]
    try:
        run.hooks.call_webhook(
            url,
            {
                "deployment": rollout.deployment,
                "model": rollout.model,
                "stage": rollout.stage_names[index],
                "servers": list(stage),
                "from_versions": list(change.serving),
                "to_versions": list(change.desired),
                "hook": which,
            },
        )
    except StepFailed as exc:
        step = _hook_step(rollout, stage, f"{rollout.stage_names[index]} webhook")
        return StepResult(step, False, 0.0, f"step webhook refused: {exc}", failure=exc.failure)
    return None
