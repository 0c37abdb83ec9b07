"""Staged rollouts: one stage of servers at a time, each stage analysed
against the servers still on the old versions, step webhooks between stages.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from reconciler.adapters.hooks import _post_json
from reconciler.core.analysis import pooled
from reconciler.core.triton_config import with_versions
from reconciler.engine.change import _blame_restart, _run
from reconciler.engine.steps import Timing, _ChangeContext
from reconciler.model.analysis import Figures, RolloutVerdict
from reconciler.model.errors import ReconcileError, ServerUnavailable, StepFailed
from reconciler.model.plan import Action, ModelChange, RolloutPlan, Step
from reconciler.model.results import ChangeResult, Outcome, Progress, StagedProgress, StepResult
from reconciler.ports import FiguresSource, ModelControl


def _finishing(change: ModelChange) -> int:
    """Where the trailing unload of old versions starts: it waits for the whole rollout."""
    index = len(change.steps)
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


def _staged(
    rollout: RolloutPlan,
    changes: Mapping[str, ModelChange],
    controls: Mapping[str, ModelControl],
    timing: Timing,
    progress: Progress,
    metrics: Mapping[str, FiguresSource] | None,
    staged_progress: StagedProgress,
) -> list[ChangeResult]:
    """Run one ModelDeployment's change stage by stage (preview, then each step): a stage's
    servers swap (at most max_parallel at once), verify and analyse; any failure, or a step
    webhook that says no, puts back every server touched so far. Old versions go only after
    the last stage passed."""
    done: dict[str, list[StepResult]] = {}
    contexts: dict[str, _ChangeContext] = {}
    failure: StepResult | None = None
    for index, (stage, parallel) in enumerate(
        zip(rollout.stages, rollout.max_parallel, strict=True)
    ):
        if timing.stopping():
            failure = StepResult(_hook_step(rollout, stage, "shutdown"), False, 0.0, "shutdown")
            break
        hook = _call_hook(rollout, index, stage, "preStep", changes)
        if hook is not None:
            failure = hook
            break
        # Recorded before the stage's servers are touched: if the reconciler stops now, the
        # next pass knows which servers may hold new versions beside old ones, and which of
        # them had passed their stage.
        completed = tuple(sorted(done))
        started = {server: changes[server].serving for server in stage}
        staged_progress(rollout, completed, started)

        # The step's servers are compared with the production servers still on the old
        # versions (those of later steps), as a canary with its baseline.
        untouched = tuple(
            source
            for later, name in zip(
                rollout.stages[index + 1 :], rollout.stage_names[index + 1 :], strict=True
            )
            if name not in ("preview", "resumed")
            for server in later
            if (source := (metrics or {}).get(server)) is not None
        )
        for server in stage:
            context = contexts.setdefault(server, _ChangeContext((metrics or {}).get(server)))
            context.baseline = PooledFigures(untouched) if untouched else None

        def forward(server: str) -> list[StepResult]:
            change = changes[server]
            context = contexts[server]
            if change.interface_baseline is not None:
                try:
                    context.interface = controls[server].interface(
                        change.model, change.interface_baseline
                    )
                except ReconcileError as exc:
                    return [
                        StepResult(
                            change.steps[0],
                            False,
                            0.0,
                            f"reading the old interface: {exc}",
                            unreachable=isinstance(exc, ServerUnavailable),
                        )
                    ]
            forward_steps = change.steps[: _finishing(change)]
            return _run(controls[server], forward_steps, timing, progress, context)

        with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
            for server, results in zip(stage, pool.map(forward, stage), strict=True):
                if results and not results[-1].ok:
                    if results[-1].step.action in (Action.VERIFY, Action.ANALYZE):
                        results[-1] = _blame_restart(controls[server], rollout.model, results[-1])
                    failure = failure or results[-1]
                done[server] = results
        if failure is not None:
            break
        hook = _call_hook(rollout, index, stage, "postStep", changes)
        if hook is not None:
            failure = hook
            break
    outcome: list[ChangeResult] = []
    if failure is not None:
        # Every server touched so far goes back; the others were never touched.
        where = failure.step.server
        cause = StepResult(
            Step("", rollout.model, Action.ROLLOUT, (), "the rollout failed"),
            False,
            0.0,
            f"rollout of {rollout.deployment} stopped ({where}): {failure.error}",
            # A server that went away or restarted, or metrics that could not be read, tell
            # nothing against the versions: every server taken back says so, so that no
            # hold is kept and the next pass rolls out again.
            unreachable=failure.unreachable,
            verdict=(
                failure.verdict if failure.verdict is RolloutVerdict.METRICS_UNAVAILABLE else None
            ),
        )
        for server, change in sorted(changes.items()):
            mine = replace(cause, step=replace(cause.step, server=server))
            if server not in done:
                outcome.append(ChangeResult(change, Outcome.SKIPPED, (mine,)))
                continue
            steps = list(done[server])
            if all(r.ok for r in steps):
                steps.append(mine)
            reverted = _run(
                controls[server], change.revert, timing, progress, _ChangeContext(), True
            )
            result = Outcome.REVERTED if all(r.ok for r in reverted) else Outcome.FAILED
            outcome.append(ChangeResult(change, result, tuple(steps), tuple(reverted)))
        return outcome
    for server, change in sorted(changes.items()):
        finish = _after_restart(controls[server], change) or change.steps[_finishing(change) :]
        finished = _run(controls[server], finish, timing, progress, contexts[server])
        every = (*done[server], *finished)
        ok = all(r.ok for r in every)
        outcome.append(ChangeResult(change, Outcome.CONVERGED if ok else Outcome.FAILED, every))
    return outcome


def _after_restart(control: ModelControl, change: ModelChange) -> tuple[Step, ...] | None:
    """The end of a passed rollout on a server that lost every version of the model since
    its stage passed (restarted: EXPLICIT mode starts empty): load and verify the desired
    versions again, saying why. They passed their verify and analysis on this server before
    the restart, and every later stage passed since, so they are what it must serve; the
    planned finish would load them without a word, or, with no old version to drop, leave
    the server empty. None when the server still lists the model, or does not answer (the
    planned finish then fails as unreachable: not held, the next pass rolls out there)."""
    try:
        if control.model_state(change.model).versions:
            return None
    except ReconcileError:
        return None
    config = next((s.config for s in change.steps if s.config is not None), None)
    if config is None:
        return None
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


def _hook_step(rollout: RolloutPlan, stage: tuple[str, ...], what: str) -> Step:
    return Step(stage[0], rollout.model, Action.ROLLOUT, (), what)


def _call_hook(
    rollout: RolloutPlan,
    index: int,
    stage: tuple[str, ...],
    which: str,
    changes: Mapping[str, ModelChange],
) -> StepResult | None:
    """Call a step webhook; a StepResult describing the refusal, or None when it agreed."""
    url = rollout.pre_step if which == "preStep" else rollout.post_step
    if url is None:
        return None
    change = changes[stage[0]]
    try:
        _post_json(
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
        return StepResult(step, False, 0.0, f"step webhook refused: {exc}")
    return None


def _server_lost(result: ChangeResult) -> bool:
    return result.outcome is Outcome.SKIPPED or any(
        r.unreachable for r in (*result.steps, *result.revert)
    )
