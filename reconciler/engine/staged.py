"""Staged rollouts: one stage of servers at a time, each stage analysed against the servers
the plan names as its baseline, step webhooks between stages. Called by ``engine/apply.py``.

Everything this module runs is planned: the stages, each stage's baseline servers
(``RolloutPlan.baselines``), and the finish of a server found restarted after its stage
passed (``ModelChange.restarted_finish``). It only observes which of them applies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from reconciler.core.analysis import pooled
from reconciler.engine.change import (
    _blame_restart,
    _failed,
    _prepare_analysis,
    _put_back,
    _read_interface,
    _run,
)
from reconciler.engine.steps import Timing, _ChangeContext
from reconciler.model.analysis import Figures
from reconciler.model.errors import ReconcileError, ShutdownBetweenStages, StepFailed
from reconciler.model.plan import Action, ModelChange, RolloutPlan, Step
from reconciler.model.results import (
    ChangeResult,
    Outcome,
    Progress,
    StagedProgress,
    StepResult,
)
from reconciler.ports import FiguresSource, ModelControl, StepHooks


def _finishing(change: ModelChange, early: bool = False) -> int:
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
class _Rollout:
    """What every stage of one staged rollout runs with."""

    plan: RolloutPlan
    changes: Mapping[str, ModelChange]  # server -> its change
    controls: Mapping[str, ModelControl]
    timing: Timing
    progress: Progress
    metrics: Mapping[str, FiguresSource]
    hooks: StepHooks
    # Servers whose old versions went before the finish (a traffic rollout adds them).
    early: set[str] = field(default_factory=set)


def _staged(
    rollout: RolloutPlan,
    changes: Mapping[str, ModelChange],
    controls: Mapping[str, ModelControl],
    timing: Timing,
    progress: Progress,
    metrics: Mapping[str, FiguresSource] | None,
    staged_progress: StagedProgress,
    hooks: StepHooks,
) -> list[ChangeResult]:
    """Run one ModelDeployment's change stage by stage (preview, then each step): a stage's
    servers swap (at most max_parallel at once), verify and analyse; any failure, or a step
    webhook that says no, puts back every server touched so far. Old versions go only after
    the last stage passed."""
    run = _Rollout(rollout, changes, controls, timing, progress, metrics or {}, hooks)
    done: dict[str, list[StepResult]] = {}
    contexts: dict[str, _ChangeContext] = {}
    failure = _through_stages(run, staged_progress, contexts, done)
    if failure is not None:
        return _take_back(run, failure, done)
    return [_finish(run, server, done[server], contexts[server]) for server in sorted(changes)]


def _through_stages(
    run: _Rollout,
    staged_progress: StagedProgress,
    contexts: dict[str, _ChangeContext],
    done: dict[str, list[StepResult]],
    after_forward: Callable[[int], StepResult | None] | None = None,
) -> StepResult | None:
    """Every stage in order: its preStep webhook, its servers' forward steps, then
    ``after_forward(index)`` if given (a traffic rollout's route phases), then its postStep
    webhook; the first failure (a shutdown among them), or None when all passed."""
    rollout = run.plan
    for index, stage in enumerate(rollout.stages):
        failure = _shutdown(run.timing, _hook_step(rollout, stage, rollout.stage_names[index]))
        if failure is None:
            failure = _call_hook(run, index, "preStep")
        if failure is not None:
            return failure
        # Recorded before the stage's servers are touched: if the reconciler stops now, the
        # next pass knows which servers may hold new versions beside old ones, and which of
        # them had passed their stage.
        started = {server: run.changes[server].serving for server in stage}
        staged_progress(rollout, tuple(sorted(done)), started)
        failure = _run_stage(run, index, contexts, done)
        if failure is None and after_forward is not None:
            failure = after_forward(index)
        if failure is None:
            failure = _call_hook(run, index, "postStep")
        if failure is not None:
            return failure
    return None


def _run_stage(
    run: _Rollout,
    index: int,
    contexts: dict[str, _ChangeContext],
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
            server, _ChangeContext(run.metrics.get(server), hooks=run.hooks)
        )
        context.baseline = PooledFigures(pool) if pool else None

    def forward(server: str) -> list[StepResult]:
        change = run.changes[server]
        unread = _read_interface(run.controls[server], change, contexts[server])
        if unread is not None:
            return [unread]
        _prepare_analysis(run.controls[server], change, contexts[server], run.timing)
        forward_steps = change.steps[: _finishing(change)]
        return _run(run.controls[server], forward_steps, run.timing, run.progress, contexts[server])

    failure: StepResult | None = None
    with ThreadPoolExecutor(max_workers=max(1, run.plan.max_parallel[index])) as workers:
        for server, results in zip(stage, workers.map(forward, stage), strict=True):
            if results and not results[-1].ok:
                if results[-1].step.action in (Action.VERIFY, Action.ANALYZE):
                    results[-1] = _blame_restart(run.controls[server], run.plan.model, results[-1])
                failure = failure or results[-1]
            done[server] = results
    return failure


def _shutdown(timing: Timing, step: Step) -> StepResult | None:
    """The failure that ends a rollout before ``step`` once shutdown has begun (what it
    means is its error's, ``ShutdownBetweenStages``); None while it has not."""
    if not timing.stopping():
        return None
    now = timing.clock()
    stopped = ShutdownBetweenStages(f"shutdown began before {step.reason}")
    return _failed(step, stopped, now, now, reverting=False)


def _take_back(
    run: _Rollout, failure: StepResult, done: Mapping[str, list[StepResult]]
) -> list[ChangeResult]:
    """Every server touched so far goes back; the others were never touched."""
    rollout = run.plan
    cause = StepResult(
        Step("", rollout.model, Action.ROLLOUT, (), "the rollout failed"),
        False,
        0.0,
        f"rollout of {rollout.deployment} stopped ({failure.step.server}): {failure.error}",
        # Every server taken back says what stopped the rollout, as that failure's error
        # said (``_failed``): held only for a failure against the versions.
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
        again = _ChangeContext(hooks=run.hooks)
        reverted = _run(run.controls[server], change.revert, run.timing, run.progress, again, True)
        result = _put_back(failure.failure, reverted)
        outcome.append(ChangeResult(change, result, tuple(steps), tuple(reverted)))
    return outcome


def _finish(
    run: _Rollout, server: str, forward: list[StepResult], context: _ChangeContext
) -> ChangeResult:
    """The end of a passed rollout on one server: the planned finish (the old versions'
    unload), or the finish planned for a server that restarted since its stage passed."""
    change = run.changes[server]
    control = run.controls[server]
    if change.restarted_finish and _lost_every_version(control, change.model):
        finish = change.restarted_finish
    else:
        finish = change.steps[_finishing(change, server in run.early) :]
    finished = _run(control, finish, run.timing, run.progress, context)
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


def _call_hook(run: _Rollout, index: int, which: str) -> StepResult | None:
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


def _server_lost(result: ChangeResult) -> bool:
    return result.outcome is Outcome.SKIPPED or any(
        r.unreachable for r in (*result.steps, *result.revert)
    )
