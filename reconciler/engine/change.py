"""One change at a time: its steps in order, and its revert steps when one fails and the
plan says to put the model back (``Step.on_failure``). Called by ``engine/apply.py`` and,
for the runs of steps, the rollout kinds (``engine/stages.py``, ``engine/traffic.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from reconciler.core.readings import before_ready
from reconciler.engine.context import FORWARD, ChangeContext, Timing, obey_abort
from reconciler.engine.probes import Prober
from reconciler.engine.steps import execute_step
from reconciler.faults import fault_point
from reconciler.model.errors import AnalysisFailed, ReconcileError, VerifyFailed
from reconciler.model.plan import Action, ModelChange, OnFailure, RolloutPlan, Step
from reconciler.model.results import ChangeResult, FailureKind, Outcome, Progress, StepResult
from reconciler.ports import FiguresSource, ModelControl

# A call made at once after a connection dropped can fail at once too: gRPC has not yet
# given up the dead connection, or waits out its reconnect backoff (250 ms, then up to 1 s:
# adapters/triton_channel.py). Against a real Triton behind a TCP proxy cut 60 times, 12
# and 16 first asks (two runs) failed within 3 ms, and every second ask, a quarter second
# later, answered (bench/connection_drop.py, BENCHMARKS.md).
ANSWER_AGAIN_WITHIN = 2.0
ASK_AGAIN_EVERY = 0.25


def no_stage_progress(
    _: RolloutPlan, __: tuple[str, ...], ___: Mapping[str, tuple[int, ...]]
) -> None:
    pass


def no_progress(_: StepResult) -> None:
    pass


def failed_step(
    step: Step, exc: ReconcileError, started: float, ended: float, reverting: bool
) -> StepResult:
    """The result of a step that raised ``exc``: what the failure means is decided here,
    once, from the error's class."""
    return StepResult(
        step,
        False,
        ended - started,
        str(exc),
        failure=exc.failure,
        reverting=reverting,
        ended_at=ended,
        evaluations=exc.evaluations if isinstance(exc, AnalysisFailed) else (),
        verdict=exc.verdict if isinstance(exc, AnalysisFailed) else None,
    )


def run_steps(
    control: ModelControl,
    steps: tuple[Step, ...],
    timing: Timing,
    progress: Progress,
    context: ChangeContext,
    reverting: bool = False,
) -> list[StepResult]:
    results: list[StepResult] = []
    for step in steps:
        started = timing.clock()
        try:
            if not reverting and step.action in FORWARD:
                obey_abort(step, timing)  # an operator's abort: no further step forward
            timing.events.started(step, reverting)
            evaluations, verdict = execute_step(control, step, timing, context)
        except ReconcileError as exc:
            results.append(failed_step(step, exc, started, timing.clock(), reverting))
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
                version_costs=context.version_costs if step.action is Action.LOAD else {},
                stream_wait=context.stream_wait if step.action is Action.UNLOAD else None,
                cut=context.cut if step.action is Action.DRAIN else None,
            )
        )
        progress(results[-1])
    return results


def read_interface(
    control: ModelControl, change: ModelChange, context: ChangeContext
) -> StepResult | None:
    """Read the old versions' interface, which the new ones must keep, into ``context``;
    the failed first step when it cannot be read, None when it was read or is not needed."""
    if change.interface_baseline is None:
        return None
    try:
        context.interface = control.interface(change.model, change.interface_baseline)
    except ReconcileError as exc:
        return StepResult(
            change.steps[0],
            False,
            0.0,
            f"reading the old interface: {exc}",
            failure=exc.failure,
        )
    return None


def _lingering(control: ModelControl, step: Step) -> bool:
    """Whether Triton still lists one of the versions about to load as anything but gone."""
    try:
        state = control.model_state(step.model)
    except ReconcileError:
        return True  # unknown: count from the analysis's start, as a config change does
    return any(
        v.version in step.versions and v.state in ("READY", "LOADING", "UNLOADING")
        for v in state.versions
    )


def prepare_analysis(
    control: ModelControl,
    change: ModelChange,
    context: ChangeContext,
    timing: Timing,
    old_at: ModelControl | None,
) -> None:
    """Before anything loads, what the analysis needs from the time the old versions alone
    serve: the new versions' counters (so that their requests count from READY) and the
    probes, with their synthesized requests tried on the old version. ``old_at``: the
    server the old versions are probed on (``control`` itself, unless a traffic rollout
    unloaded them here: ``TrafficPlan.old_probed_on``; None: on none)."""
    step = next((s for s in change.steps if s.action is Action.ANALYZE), None)
    if step is None or step.analysis is None:
        return
    context.replaces = bool(change.serving)
    # Brand-new versions have no counters yet. Versions already serving (a config change)
    # are reloaded, and their counters with them: those count from the start. So does a
    # version an earlier instance of which is still going (UNLOADING: its last requests may
    # still fail, and its series with them).
    brand_new = not set(step.versions) & set(change.serving)
    if context.source is not None and brand_new and not _lingering(control, step):
        before = context.source.figures(step.model, step.versions)
        if before.error is None:
            context.counted_from = before_ready(before)
    if not step.analysis.probes.enabled:
        return
    interface, unread = context.interface, None
    if interface is None and step.baseline and old_at is not None:
        try:
            interface = old_at.interface(step.model, max(step.baseline))
        except VerifyFailed as exc:
            interface, unread = None, str(exc)  # said in the probes' note
    context.prober = Prober.prepare(
        control, step, step.analysis.probes, timing.clock, interface, unread, old_at
    )
    if step.old_under_load:
        context.prober.old_under_load(step.old_under_load, timing.sleep, timing.stopping)


def apply_change(
    control: ModelControl,
    change: ModelChange,
    timing: Timing,
    progress: Progress = no_progress,
    source: FiguresSource | None = None,
    context: ChangeContext | None = None,
) -> ChangeResult:
    context = context or ChangeContext(source)
    unread = read_interface(control, change, context)
    if unread is not None:
        return ChangeResult(change, Outcome.FAILED, (unread,))
    prepare_analysis(control, change, context, timing, control)
    results = run_steps(control, change.steps, timing, progress, context)
    if all(r.ok for r in results):
        return ChangeResult(change, Outcome.CONVERGED, tuple(results))
    failed = results[-1]
    if failed.step.on_failure is OnFailure.STOP or (
        failed.failure is FailureKind.SERVER_LOST and not answers_again(control, failed, timing)
    ):
        # Planned so: nothing to put back (a drain swapped nothing; only the old versions'
        # unload is left). Or the server is gone: nothing can be put back, and the next
        # pass verifies what is loaded first (``loop.records.left_unverified``). Not held.
        return ChangeResult(change, Outcome.FAILED, tuple(results))
    if failed.step.action in (Action.VERIFY, Action.ANALYZE):
        results[-1] = blame_elsewhere(control, change.model, failed)
    fault_point("apply.revert")
    again = ChangeContext(source, hooks=context.hooks)
    reverted = run_steps(control, change.revert, timing, progress, again, True)
    return ChangeResult(change, put_back(failed.failure, reverted), tuple(results), tuple(reverted))


def put_back(failure: FailureKind | None, reverted: list[StepResult]) -> Outcome:
    """How a change that stopped with ``failure`` and ran its revert ended: FAILED when the
    revert did not go through, INTERRUPTED when a shutdown stopped it (nothing failed),
    REVERTED otherwise. One rule for a single change and every server of a staged rollout."""
    if not all(r.ok for r in reverted):
        return Outcome.FAILED
    if failure is FailureKind.INTERRUPTED:
        return Outcome.INTERRUPTED
    return Outcome.REVERTED


def answers_again(control: ModelControl, failed: StepResult, timing: Timing) -> bool:
    """A verify or analysis that lost the server on a call, on a server that answers again
    within ANSWER_AGAIN_WITHIN (a dropped connection, a quick restart): what it loaded is put
    back now, rather than left to serve unverified (to every client that names no version)
    until the next pass. Not a load cut off: Triton goes on with it, and a load to put back
    would queue behind."""
    if failed.step.action not in (Action.VERIFY, Action.ANALYZE):
        return False
    deadline = timing.clock() + ANSWER_AGAIN_WITHIN
    while True:
        try:
            control.model_state(failed.step.model)
            return True
        except ReconcileError:
            if timing.clock() >= deadline or timing.stopping():
                return False
            timing.sleep(ASK_AGAIN_EVERY)


def blame_elsewhere(control: ModelControl, model: str, failed: StepResult) -> StepResult:
    """A verify or analysis that failed because of what happened to the server meanwhile,
    not because of the versions; the revert still puts the old versions back, and the spec
    is not held:

    - no version at all in the model's index (a version that failed or was unloaded stays
      listed): a restarted server (EXPLICIT mode starts empty). Marked as a lost server.
    - a version the step needed, UNLOADING or unloaded ("unloaded", not a load error): an
      unload call this pass did not make (a hand unload). Triton unloads nothing by itself
      in EXPLICIT mode, and a version that fails says why."""
    try:
        state = control.model_state(model)
    except ReconcileError:
        return replace(failed, failure=FailureKind.SERVER_LOST)
    if not state.versions:
        return replace(
            failed,
            failure=FailureKind.SERVER_LOST,
            error=f"{failed.error}; server {failed.step.server} lost every version of {model} "
            "meanwhile (restarted?): not held, the next pass rolls out again",
        )
    taken = [v for v in failed.step.versions if v not in state.ready and state.unloaded(v)]
    if not taken:
        return failed
    return replace(
        failed,
        failure=FailureKind.UNLOADED_MEANWHILE,
        error=f"{failed.error}; version {', '.join(map(str, taken))} of {model} on "
        f"{failed.step.server} was unloaded meanwhile ({state.reason(taken[0])}), not by "
        "this pass (by hand?): not held, the next pass loads it again",
    )


def server_lost(result: ChangeResult) -> bool:
    """A change that found its server gone (skipped, or a step could not reach it): the
    server's later changes in this pass are skipped."""
    return result.outcome is Outcome.SKIPPED or any(
        r.unreachable for r in (*result.steps, *result.revert)
    )
