"""One change at a time: its steps in order, its revert steps when one
fails.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from reconciler.engine.steps import Timing, _ChangeContext, execute_step
from reconciler.faults import fault_point
from reconciler.model.errors import AnalysisFailed, ReconcileError, ServerUnavailable
from reconciler.model.plan import Action, ModelChange, RolloutPlan, Step
from reconciler.model.results import ChangeResult, Outcome, Progress, StepResult
from reconciler.ports import FiguresSource, ModelControl


def _ignore_stage(_: RolloutPlan, __: tuple[str, ...], ___: Mapping[str, tuple[int, ...]]) -> None:
    pass


def _ignore(_: StepResult) -> None:
    pass


def _run(
    control: ModelControl,
    steps: tuple[Step, ...],
    timing: Timing,
    progress: Progress,
    context: _ChangeContext,
    reverting: bool = False,
) -> list[StepResult]:
    results: list[StepResult] = []
    for step in steps:
        started = timing.clock()
        try:
            evaluations, verdict = execute_step(control, step, timing, context.source, context)
        except ReconcileError as exc:
            ended = timing.clock()
            results.append(
                StepResult(
                    step,
                    False,
                    ended - started,
                    str(exc),
                    unreachable=isinstance(exc, ServerUnavailable),
                    reverting=reverting,
                    ended_at=ended,
                    evaluations=exc.evaluations if isinstance(exc, AnalysisFailed) else (),
                    verdict=exc.verdict if isinstance(exc, AnalysisFailed) else None,
                )
            )
            progress(results[-1])
            break
        ended = timing.clock()
        results.append(
            StepResult(
                step,
                True,
                ended - started,
                reverting=reverting,
                ended_at=ended,
                evaluations=evaluations,
                verdict=verdict,
                footprint=context.footprint if step.action is Action.LOAD else None,
            )
        )
        progress(results[-1])
    return results


def apply_change(
    control: ModelControl,
    change: ModelChange,
    timing: Timing,
    progress: Progress = _ignore,
    source: FiguresSource | None = None,
) -> ChangeResult:
    context = _ChangeContext(source)
    if change.interface_baseline is not None:
        try:
            context.interface = control.interface(change.model, change.interface_baseline)
        except ReconcileError as exc:
            return ChangeResult(
                change,
                Outcome.FAILED,
                (
                    StepResult(
                        change.steps[0],
                        False,
                        0.0,
                        f"reading the old interface: {exc}",
                        unreachable=isinstance(exc, ServerUnavailable),
                    ),
                ),
            )
    results = _run(control, change.steps, timing, progress, context)
    if all(r.ok for r in results):
        return ChangeResult(change, Outcome.CONVERGED, tuple(results))
    failed = results[-1]
    if failed.step.action is Action.DRAIN:
        # Nothing was touched: the old versions serve as before. Not held; retried.
        return ChangeResult(change, Outcome.FAILED, tuple(results))
    if (failed.step.action is Action.UNLOAD and not failed.step.until_unavailable) or (
        failed.unreachable
    ):
        # New versions are verified and serving (or the server is gone): nothing to put back;
        # the next pass retries what is left.
        return ChangeResult(change, Outcome.FAILED, tuple(results))
    if failed.step.action in (Action.VERIFY, Action.ANALYZE):
        results[-1] = _blame_restart(control, change.model, failed)
    fault_point("apply.revert")
    reverted = _run(control, change.revert, timing, progress, _ChangeContext(source), True)
    if not all(r.ok for r in reverted):
        outcome = Outcome.FAILED
    elif failed.verdict == "interrupted":
        outcome = Outcome.INTERRUPTED
    else:
        outcome = Outcome.REVERTED
    return ChangeResult(change, outcome, tuple(results), tuple(reverted))


def _blame_restart(control: ModelControl, model: str, failed: StepResult) -> StepResult:
    """A verify or analysis that failed because the server lost the model meanwhile: no
    version at all in its index (a version that failed or was unloaded stays listed), which
    is a restarted server (EXPLICIT mode starts empty). Marked like an unreachable server so
    the spec is not held; the revert still puts the old versions back."""
    try:
        if control.model_state(model).versions:
            return failed
    except ReconcileError:
        return replace(failed, unreachable=True)
    return replace(
        failed,
        unreachable=True,
        error=f"{failed.error}; server {failed.step.server} lost every version of {model} "
        "meanwhile (restarted?): not held, the next pass rolls out again",
    )
