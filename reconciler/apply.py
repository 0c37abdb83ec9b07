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

import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from reconciler.adapters.credentials import basic_auth, redact
from reconciler.analysis import (
    Evaluation,
    Figures,
    RolloutVerdict,
    baseline_from,
    evaluate,
    judge,
    pooled,
)
from reconciler.errors import (
    AnalysisFailed,
    DrainTimeout,
    Interrupted,
    ReconcileError,
    ServerUnavailable,
    StepFailed,
    VerifyFailed,
)
from reconciler.faults import fault_point
from reconciler.model_config import with_versions
from reconciler.plan import Action, ModelChange, Plan, RolloutPlan, Step
from reconciler.serving import ModelInterface, ModelState, interface_difference
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

    def interface(self, model: str, version: int) -> ModelInterface: ...


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
    footprint: float | None = None  # load beside old: server memory added per new version


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


@dataclass
class _ChangeContext:
    """What one change's steps share while it runs."""

    source: FiguresSource | None = None
    interface: ModelInterface | None = None  # the old versions' inputs and outputs
    footprint: float | None = None
    # Where the analysis reads the old versions' figures: the servers a staged rollout has
    # not reached yet, when there are some; else (None) this server's own old versions.
    baseline: FiguresSource | None = None


def _verify(
    control: ModelControl, step: Step, timing: Timing, context: _ChangeContext | None = None
) -> None:
    fault_point("apply.verify")
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
    if step.shadow is not None and step.shadow_against is not None:
        _shadow(control, step, timing, context)
    if step.interface_check and context is not None and context.interface is not None:
        for version in step.smoke_versions:
            changed = interface_difference(
                context.interface, control.interface(step.model, version)
            )
            if changed:
                raise VerifyFailed(
                    f"version {version} changes the model's interface: {'; '.join(changed)} "
                    "(set spec.allowInterfaceChange: true to accept)"
                )


def _unload(control: ModelControl, step: Step, timing: Timing) -> None:
    fault_point("apply.unload")
    if step.versions:
        assert step.config is not None
        control.load(step.model, step.config)
    else:
        control.unload(step.model)
    dropped = set(step.dropped)

    def gone(state: ModelState) -> bool:
        if step.until_unavailable:
            # A library swap needs the model fully out: no version READY or UNLOADING.
            return not any(v.state in ("READY", "UNLOADING", "LOADING") for v in state.versions)
        return not (dropped & state.ready)

    # Dropped versions leave READY at once (UNLOADING while in-flight requests finish).
    _wait_for(control, step, gone, lambda _: None, timing.unload_wait, timing)


def _shadow(
    control: ModelControl, step: Step, timing: Timing, context: _ChangeContext | None
) -> None:
    """Replay the recorded requests, version-pinned, on the old version and each new one;
    compare outputs (within the tolerance) and mean latencies."""
    shadow, old = step.shadow, step.shadow_against
    assert shadow is not None and old is not None
    if not shadow.requests:
        return
    outputs = tuple(t.name for t in control.interface(step.model, old).outputs)
    for version in step.smoke_versions:
        agree, old_seconds, new_seconds = 0, 0.0, 0.0
        for inputs in shadow.requests:
            started = timing.clock()
            want = control.infer(step.model, old, inputs, outputs)
            middle = timing.clock()
            got = control.infer(step.model, version, inputs, outputs)
            ended = timing.clock()
            old_seconds += middle - started
            new_seconds += ended - middle
            if set(got) == set(want) and all(
                got[name].shape == want[name].shape
                and bool(
                    np.all(
                        np.abs(got[name].astype(np.float64) - want[name].astype(np.float64))
                        <= shadow.tolerance
                    )
                )
                if want[name].dtype != np.object_
                else got[name].tolist() == want[name].tolist()
                for name in want
            ):
                agree += 1
        share = agree / len(shadow.requests)
        if share < shadow.min_agreement:
            raise VerifyFailed(
                f"shadow replay of {len(shadow.requests)} request(s): version {version} agrees "
                f"with version {old} on {share:.1%} (at least {shadow.min_agreement:.1%} "
                f"required, tolerance {shadow.tolerance:g})"
            )
        if shadow.max_latency_increase is not None and old_seconds > 0:
            increase = new_seconds / old_seconds - 1
            if increase > shadow.max_latency_increase:
                raise VerifyFailed(
                    f"shadow replay: version {version} is {increase:.0%} slower than version "
                    f"{old} (at most {shadow.max_latency_increase:.0%})"
                )


def _post_json(url: str, payload: Mapping[str, Any], timeout: float = 10.0) -> None:
    """POST ``payload``; any answer but 2xx, or none, raises StepFailed."""
    plain_url, headers = basic_auth(url)
    request = urllib.request.Request(
        plain_url,
        json.dumps(payload).encode(),
        {"Content-Type": "application/json", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, OSError) as exc:
        raise StepFailed(f"{redact(url)} did not answer: {exc}") from exc
    if not 200 <= status < 300:
        raise StepFailed(f"{redact(url)} answered {status}")


def _drain(step: Step, timing: Timing, context: _ChangeContext) -> None:
    """Wait until the model is idle here: no pending request and no new inference for the
    idle window. Nothing is swapped on timeout: the old versions keep serving."""
    policy = step.drain
    assert policy is not None
    if policy.drain_webhook:
        _post_json(
            policy.drain_webhook,
            {"event": "drain", "server": step.server, "model": step.model,
             "versions": list(step.versions)},
        )  # fmt: skip
    if context.source is None:
        raise DrainTimeout(f"server {step.server}: draining {step.model} needs its metrics")
    deadline = timing.clock() + policy.drain_timeout
    quiet_since: float | None = None
    last: float | None = None
    while True:
        figures = context.source.figures(step.model, step.versions)
        now = timing.clock()
        idle = figures.error is None and not figures.pending and figures.inferences is not None
        if idle and figures.inferences == last:
            quiet_since = now if quiet_since is None else quiet_since
            if now - quiet_since >= policy.idle:
                return
        else:
            quiet_since = now if idle else None
        last = figures.inferences
        if now >= deadline:
            raise DrainTimeout(
                f"server {step.server}: {step.model} did not go idle within "
                f"{policy.drain_timeout:g}s (pending {figures.pending}, inferences still "
                "growing); not swapped, the old versions keep serving"
            )
        timing.sleep(min(1.0, max(timing.poll_interval, policy.idle / 10)))


def _replace_library(step: Step) -> None:
    backend = step.backend
    assert backend is not None
    if backend.command:
        env = {
            **os.environ,
            "TRITON_GITOPS_SERVER": step.server,
            "TRITON_GITOPS_MODEL": step.model,
            "TRITON_GITOPS_BACKEND": backend.name,
            "TRITON_GITOPS_REVISION": backend.revision,
        }
        try:
            done = subprocess.run(
                list(backend.command), env=env, capture_output=True, text=True, timeout=600
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise StepFailed(f"replaceLibrary command failed: {exc}") from exc
        if done.returncode != 0:
            raise StepFailed(
                f"replaceLibrary command exited {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()[-500:]}"
            )
    if backend.webhook:
        _post_json(
            backend.webhook,
            {"event": "replace-library", "server": step.server, "model": step.model,
             "backend": backend.name, "revision": backend.revision},
            timeout=600,
        )  # fmt: skip


def _analyze(
    control: ModelControl,
    step: Step,
    timing: Timing,
    source: FiguresSource | None,
    baseline_source: FiguresSource | None = None,
) -> tuple[tuple[Evaluation, ...], RolloutVerdict]:
    spec = step.analysis
    assert spec is not None
    if source is None:
        raise AnalysisFailed(
            f"server {step.server}: no metrics source for the analysis", (), RolloutVerdict.FAILED
        )
    queries = {c.name: c.query for c in spec.checks if c.query}
    old = (baseline_source or source).figures(step.model, step.baseline) if step.baseline else None
    previous = source.figures(step.model, step.versions, queries)
    baseline = baseline_from(old, previous)
    started = timing.clock()
    evaluations: list[Evaluation] = []
    unreadable = previous.error is not None
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
        unreadable = unreadable or current.error is not None
        if baseline.memory_bytes is None and current.memory_bytes is not None:
            # The first reading had no memory figure (a failed scrape, or Triton not yet
            # sampling): measure growth from the first reading that has one.
            baseline = replace(baseline, memory_bytes=current.memory_bytes)
        elapsed = timing.clock() - started
        evaluations.append(evaluate(spec, len(evaluations), elapsed, previous, current, baseline))
        previous = current
        fault_point("apply.analysis")
        verdict = judge(spec, tuple(evaluations), elapsed)
        if verdict is RolloutVerdict.PASSED:
            return tuple(evaluations), verdict
        if verdict is RolloutVerdict.INCONCLUSIVE and unreadable:
            raise AnalysisFailed(
                f"server {step.server}: analysis of {step.model} version(s) "
                f"{', '.join(map(str, step.versions))} inconclusive: metrics unavailable "
                f"({current.error or previous.error or 'a reading failed'}); the old versions "
                "serve again, not held: the next pass analyses again",
                tuple(evaluations),
                RolloutVerdict.METRICS_UNAVAILABLE,
            )
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


def _load(control: ModelControl, step: Step, context: _ChangeContext) -> None:
    assert step.config is not None
    source = context.source
    before = source.figures(step.model, ()) if source is not None else None
    fault_point("apply.load.requested")
    control.load(step.model, step.config)
    fault_point("apply.load.accepted")
    if source is not None and before is not None and before.memory_bytes is not None:
        # What loading beside the old cost the server, per new version: the footprint the
        # next headroom check uses when the manifest declares none.
        after = source.figures(step.model, ())
        if after.memory_bytes is not None and len(step.versions) > 0:
            context.footprint = max(0.0, after.memory_bytes - before.memory_bytes)


def execute_step(
    control: ModelControl,
    step: Step,
    timing: Timing,
    source: FiguresSource | None = None,
    context: _ChangeContext | None = None,
) -> tuple[tuple[Evaluation, ...], RolloutVerdict | None]:
    """Carry out one step; raise a ReconcileError subclass when it fails.

    Returns the evaluations and verdict of an analyze step, nothing for the others.
    """
    context = context or _ChangeContext(source)
    if step.action is Action.LOAD:
        _load(control, step, context)
    elif step.action is Action.VERIFY:
        _verify(control, step, timing, context)
    elif step.action is Action.ANALYZE:
        return _analyze(control, step, timing, context.source, context.baseline)
    elif step.action is Action.DRAIN:
        _drain(step, timing, context)
    elif step.action is Action.REPLACE_LIBRARY:
        _replace_library(step)
    else:
        _unload(control, step, timing)
    return (), None


Progress = Callable[[StepResult], None]
# Called as a staged rollout starts each stage: the servers whose stages passed, and the
# servers this stage is about to touch with the versions they served before.
StagedProgress = Callable[[RolloutPlan, tuple[str, ...], Mapping[str, tuple[int, ...]]], None]


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


def apply(
    plan: Plan,
    controls: Mapping[str, ModelControl],
    *,
    max_parallel: int = 8,
    timing: Timing | None = None,
    progress: Progress = _ignore,
    metrics: Mapping[str, FiguresSource] | None = None,
    staged_progress: StagedProgress | None = None,
) -> ApplyResult:
    """Execute every change of ``plan``; servers concurrently, each server's changes in order.

    ``progress`` is called with each step's result as it finishes (from worker threads).
    """
    timing = timing or Timing()
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
            if timing.stopping() or (results and _server_lost(results[-1])):
                results.append(ChangeResult(change, Outcome.SKIPPED, ()))
                continue
            source = (metrics or {}).get(server)
            if change.exclusive:
                with locks[change.exclusive]:
                    results.append(apply_change(controls[server], change, timing, progress, source))
            else:
                results.append(apply_change(controls[server], change, timing, progress, source))
        return results

    with ThreadPoolExecutor(max_workers=max(1, max_parallel)) as pool:
        per_server = list(pool.map(run_server, sorted(by_server)))
    results = [r for server_results in per_server for r in server_results]
    for rollout in plan.rollouts:
        results.extend(
            _staged(
                rollout,
                staged[rollout.deployment],
                controls,
                timing,
                progress,
                metrics,
                staged_progress or _ignore_stage,
            )
        )
    order = {(c.server, c.model): i for i, c in enumerate(plan.changes)}
    results.sort(key=lambda r: order[(r.change.server, r.change.model)])
    return ApplyResult(plan.revision, tuple(results))


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
