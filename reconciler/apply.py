"""Apply: execute a Plan through the server adapters, and nothing else.

Servers are handled concurrently (bounded); the changes of one server, and the steps of one
change, strictly in order. When a load, verify or analysis step fails, the change's revert
steps run (the old versions never stopped serving, so this only drops what was added) and the
other models and servers carry on. Apply never re-decides what to do: that is the plan's job.

An analyze step reads figures through a ``FiguresSource`` every interval and hands them to the
pure ``analysis`` module; the first verdict that fails the rollout ends the step at once, so
the revert follows the failing evaluation without waiting for the rest of the duration.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from reconciler.analysis import (
    Evaluation,
    Figures,
    RolloutVerdict,
    baseline_from,
    evaluate,
    judge,
)
from reconciler.errors import (
    AnalysisFailed,
    Interrupted,
    ReconcileError,
    ServerUnavailable,
    VerifyFailed,
)
from reconciler.plan import Action, ModelChange, Plan, Step
from reconciler.serving import ModelState
from reconciler.smoke import mismatches
from reconciler.spec.model import Tensor


class ModelControl(Protocol):
    """What apply needs from one Triton server (``adapters/triton.py`` is the real one)."""

    def load(self, model: str, config: Mapping[str, Any]) -> None: ...

    def unload(self, model: str) -> None: ...

    def model_state(self, model: str) -> ModelState: ...

    def infer(
        self, model: str, version: int, inputs: tuple[Tensor, ...], outputs: tuple[str, ...]
    ) -> dict[str, npt.NDArray[np.generic]]: ...


class FiguresSource(Protocol):
    """Where an analyze step reads metrics (``adapters/metrics.py`` has the real ones)."""

    def figures(
        self, model: str, versions: tuple[int, ...], queries: Mapping[str, str] = ...
    ) -> Figures: ...


class Outcome(StrEnum):
    CONVERGED = "converged"
    REVERTED = "reverted"  # a step failed; the model serves what it served before
    FAILED = "failed"  # a step failed and the model could not be put back (see errors)
    SKIPPED = "skipped"  # not attempted: its server became unreachable, or shutdown began
    INTERRUPTED = "interrupted"  # shutdown during its analysis: put back, not held


@dataclass(frozen=True)
class StepResult:
    step: Step
    ok: bool
    seconds: float
    error: str | None = None
    unreachable: bool = False  # the step failed because the server did not answer
    reverting: bool = False  # the step belongs to a change's revert
    ended_at: float = 0.0  # the injected clock when the step ended
    evaluations: tuple[Evaluation, ...] = ()  # analyze: every evaluation made
    verdict: RolloutVerdict | None = None  # analyze: how it ended


@dataclass(frozen=True)
class ChangeResult:
    change: ModelChange
    outcome: Outcome
    steps: tuple[StepResult, ...]
    revert: tuple[StepResult, ...] = ()

    @property
    def error(self) -> str | None:
        for result in (*self.steps, *self.revert):
            if result.error:
                return result.error
        return None

    @property
    def analysis(self) -> StepResult | None:
        return next((r for r in self.steps if r.step.action is Action.ANALYZE), None)

    @property
    def rollback_seconds(self) -> float | None:
        """From the failing evaluation until the old versions alone were loaded again."""
        analysis = self.analysis
        if analysis is None or analysis.ok or not self.revert or not self.revert[0].ok:
            return None
        return self.revert[0].ended_at - analysis.ended_at


@dataclass(frozen=True)
class ApplyResult:
    revision: str
    changes: tuple[ChangeResult, ...]

    @property
    def ok(self) -> bool:
        return all(c.outcome is Outcome.CONVERGED for c in self.changes)


def _never() -> bool:
    return False


@dataclass(frozen=True)
class Timing:
    """Injected clock and sleep, so waiting logic is testable without waiting; and
    ``stopping``, which turns true when the process is asked to shut down."""

    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    poll_interval: float = 0.05
    unload_wait: float = 30.0
    stopping: Callable[[], bool] = _never


def _wait_for(
    control: ModelControl,
    step: Step,
    done: Callable[[ModelState], bool],
    failed: Callable[[ModelState], str | None],
    timeout: float,
    timing: Timing,
) -> ModelState:
    deadline = timing.clock() + timeout
    while True:
        state = control.model_state(step.model)
        if done(state):
            return state
        why = failed(state)
        if why:
            raise VerifyFailed(why)
        if timing.clock() >= deadline:
            raise VerifyFailed(f"timed out after {timeout:g}s")
        timing.sleep(timing.poll_interval)


def _verify(control: ModelControl, step: Step, timing: Timing) -> None:
    wanted = set(step.versions)

    def not_coming(state: ModelState) -> str | None:
        # A version that is neither READY nor LOADING will not become READY by waiting.
        gone = [
            v
            for v in sorted(wanted - state.ready)
            if not any(s.version == v and s.state == "LOADING" for s in state.versions)
        ]
        if gone:
            return "; ".join(f"version {v} is not READY ({state.reason(v)})" for v in gone)
        return None

    _wait_for(control, step, lambda s: wanted <= s.ready, not_coming, step.timeout, timing)
    for case in step.smoke:
        outputs = tuple(e.name for e in case.expect)
        for version in step.smoke_versions:
            answer = control.infer(step.model, version, case.inputs, outputs)
            wrong = mismatches(case, answer)
            if wrong:
                raise VerifyFailed(f"smoke {case.name} on version {version}: {'; '.join(wrong)}")


def _unload(control: ModelControl, step: Step, timing: Timing) -> None:
    if step.versions:
        assert step.config is not None
        control.load(step.model, step.config)
    else:
        control.unload(step.model)
    dropped = set(step.dropped)

    def gone(state: ModelState) -> bool:
        return not (dropped & state.ready)

    # Dropped versions leave READY at once (UNLOADING while in-flight requests finish).
    _wait_for(control, step, gone, lambda _: None, timing.unload_wait, timing)


def _analyze(
    control: ModelControl, step: Step, timing: Timing, source: FiguresSource | None
) -> tuple[tuple[Evaluation, ...], RolloutVerdict]:
    spec = step.analysis
    assert spec is not None
    if source is None:
        raise AnalysisFailed(
            f"server {step.server}: no metrics source for the analysis", (), RolloutVerdict.FAILED
        )
    queries = {c.name: c.query for c in spec.checks if c.query}
    old = source.figures(step.model, step.baseline) if step.baseline else None
    previous = source.figures(step.model, step.versions, queries)
    baseline = baseline_from(old, previous)
    started = timing.clock()
    evaluations: list[Evaluation] = []
    while True:
        # Ticks are measured from the start, so slow scrapes do not stretch the analysis.
        next_tick = started + spec.interval * (len(evaluations) + 1)
        timing.sleep(max(0.0, next_tick - timing.clock()))
        if timing.stopping():
            raise Interrupted(
                f"server {step.server}: analysis of {step.model} interrupted by shutdown after "
                f"{len(evaluations)} evaluation(s); the old versions serve again",
                tuple(evaluations),
                "interrupted",
            )
        current = source.figures(step.model, step.versions, queries)
        if baseline.memory_bytes is None and current.memory_bytes is not None:
            # The first reading had no memory figure (a failed scrape, or Triton not yet
            # sampling): measure growth from the first reading that has one.
            baseline = replace(baseline, memory_bytes=current.memory_bytes)
        elapsed = timing.clock() - started
        evaluations.append(evaluate(spec, len(evaluations), elapsed, previous, current, baseline))
        previous = current
        verdict = judge(spec, tuple(evaluations), elapsed)
        if verdict is RolloutVerdict.PASSED:
            return tuple(evaluations), verdict
        if verdict is not RolloutVerdict.RUNNING:
            last = evaluations[-1]
            why = (
                "; ".join(str(r) for r in last.failed)
                if verdict is RolloutVerdict.FAILED
                else "no evaluation counted in "
                f"{spec.duration:g}s (last: {'; '.join(str(r) for r in last.results)})"
            )
            raise AnalysisFailed(
                f"server {step.server}: analysis of {step.model} version(s) "
                f"{', '.join(map(str, step.versions))} {verdict} after "
                f"{len(evaluations)} evaluation(s): {why}",
                tuple(evaluations),
                verdict,
            )


def execute_step(
    control: ModelControl, step: Step, timing: Timing, source: FiguresSource | None = None
) -> tuple[tuple[Evaluation, ...], RolloutVerdict | None]:
    """Carry out one step; raise a ReconcileError subclass when it fails.

    Returns the evaluations and verdict of an analyze step, nothing for the others.
    """
    if step.action is Action.LOAD:
        assert step.config is not None
        control.load(step.model, step.config)
    elif step.action is Action.VERIFY:
        _verify(control, step, timing)
    elif step.action is Action.ANALYZE:
        return _analyze(control, step, timing, source)
    else:
        _unload(control, step, timing)
    return (), None


Progress = Callable[[StepResult], None]


def _ignore(_: StepResult) -> None:
    pass


def _run(
    control: ModelControl,
    steps: tuple[Step, ...],
    timing: Timing,
    progress: Progress,
    source: FiguresSource | None = None,
    reverting: bool = False,
) -> list[StepResult]:
    results: list[StepResult] = []
    for step in steps:
        started = timing.clock()
        try:
            evaluations, verdict = execute_step(control, step, timing, source)
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
    results = _run(control, change.steps, timing, progress, source)
    if all(r.ok for r in results):
        return ChangeResult(change, Outcome.CONVERGED, tuple(results))
    failed = results[-1]
    if failed.step.action is Action.UNLOAD or failed.unreachable:
        # New versions are verified and serving (or the server is gone): nothing to put back;
        # the next pass retries what is left.
        return ChangeResult(change, Outcome.FAILED, tuple(results))
    reverted = _run(control, change.revert, timing, progress, reverting=True)
    if not all(r.ok for r in reverted):
        outcome = Outcome.FAILED
    elif failed.verdict == "interrupted":
        outcome = Outcome.INTERRUPTED
    else:
        outcome = Outcome.REVERTED
    return ChangeResult(change, outcome, tuple(results), tuple(reverted))


def apply(
    plan: Plan,
    controls: Mapping[str, ModelControl],
    *,
    max_parallel: int = 8,
    timing: Timing | None = None,
    progress: Progress = _ignore,
    metrics: Mapping[str, FiguresSource] | None = None,
) -> ApplyResult:
    """Execute every change of ``plan``; servers concurrently, each server's changes in order.

    ``progress`` is called with each step's result as it finishes (from worker threads).
    """
    timing = timing or Timing()
    by_server: dict[str, list[ModelChange]] = {}
    for change in plan.changes:
        by_server.setdefault(change.server, []).append(change)

    def run_server(server: str) -> list[ChangeResult]:
        results: list[ChangeResult] = []
        for change in by_server[server]:
            # Shutdown: finish the change in progress, start no other.
            if timing.stopping() or (results and _server_lost(results[-1])):
                results.append(ChangeResult(change, Outcome.SKIPPED, ()))
                continue
            source = (metrics or {}).get(server)
            results.append(apply_change(controls[server], change, timing, progress, source))
        return results

    with ThreadPoolExecutor(max_workers=max(1, max_parallel)) as pool:
        per_server = list(pool.map(run_server, sorted(by_server)))
    return ApplyResult(plan.revision, tuple(r for results in per_server for r in results))


def _server_lost(result: ChangeResult) -> bool:
    return result.outcome is Outcome.SKIPPED or any(
        r.unreachable for r in (*result.steps, *result.revert)
    )
