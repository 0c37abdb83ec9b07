"""One step at a time: load, verify (readiness, smoke cases, interface,
shadow), drain, analyze, unload, library replacement. ``EXECUTORS`` maps each planned Action to
the function that carries it out; ``execute_step`` dispatches through it. Called by
``engine/change.py`` (the rollout kinds run their steps through it); the analyze step is
``engine/analyze.py``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from functools import partial

from reconciler.core.comparison import (
    compared,
    deviations_of,
    interleaved,
    judged,
    unjudgeable,
)
from reconciler.core.exchange import Reply, answer_of
from reconciler.core.probes import limits, synthesized, wrong
from reconciler.core.readings import footprint, free_memory, room_in_all
from reconciler.core.smoke import reply_mismatches
from reconciler.engine.analyze import analyze_step
from reconciler.engine.context import NOTHING, ChangeContext, StepDone, Timing, obey_abort
from reconciler.engine.exchange import ask
from reconciler.faults import fault_point
from reconciler.model.errors import (
    DrainTimeout,
    ReconcileError,
    UnloadFailed,
    VerifyFailed,
)
from reconciler.model.plan import Action, Step
from reconciler.model.results import Cut, Draining, FailureKind
from reconciler.model.serving import ModelState, interface_difference, version_cost
from reconciler.model.shadow import Tolerance
from reconciler.model.spec import StreamExpectation, Tensor
from reconciler.ports import FiguresSource, ModelControl


def _wait_for(
    control: ModelControl,
    step: Step,
    done: Callable[[ModelState], bool],
    failed: Callable[[ModelState], str | None],
    timeout: float,
    timing: Timing,
    abortable: bool = False,  # a forward step: an operator's abort ends the wait
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
        if abortable:
            obey_abort(step, timing)
        timing.sleep(timing.poll_interval)


def _verify(control: ModelControl, step: Step, timing: Timing, context: ChangeContext) -> StepDone:
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

    _wait_for(control, step, lambda s: wanted <= s.ready, not_coming, step.timeout, timing, True)
    for case in step.smoke:
        # A streaming model's stream is judged reassembled (core/exchange.py): its outputs
        # from every response, in order; and by the case's ``stream``, response by response.
        outputs = () if step.streaming else tuple(e.name for e in case.expect)
        deadline, cap = limits(case, None)
        for version in step.smoke_versions:
            reply = ask(
                control,
                step.model,
                version,
                case.inputs,
                outputs,
                exchange=step.exchange,
                timeout=deadline,
                max_responses=cap,
            )
            wrong = reply_mismatches(case, reply)
            if wrong:
                raise VerifyFailed(f"smoke {case.name} on version {version}: {'; '.join(wrong)}")
    if step.shadow is not None and step.shadow_against is not None:
        _shadow(control, step, timing)
    if step.probe_against is not None:
        _probe_synthesized(control, step, step.probe_against, context)
    if step.interface_check and context.interface is not None:
        for version in step.smoke_versions:
            changed = interface_difference(
                context.interface, control.interface(step.model, version)
            )
            if changed:
                raise VerifyFailed(
                    f"version {version} changes the model's interface: {'; '.join(changed)} "
                    "(set spec.allowInterfaceChange: true to accept)"
                )
    return NOTHING


VERIFY_PROBE_TRIES = 3  # a synthesized request that fails this many times in a row fails verify

VERIFY_PROBE_TIMEOUT = 5.0


def _probe_synthesized(control: ModelControl, step: Step, old: int, context: ChangeContext) -> None:
    """One request made of zeros from the old version's inputs: if the old version answers
    it, every new version must too (an error response, which Triton counts a success, or a
    missing output fails verify). One the old version fails says nothing: skipped."""
    interface = context.interface
    if interface is None:
        try:
            interface = control.interface(step.model, old)
        except VerifyFailed:
            return  # unreadable: nothing to synthesize from (the interface check says so)
    request = synthesized(interface)
    if request is None:
        return
    asked = partial(
        ask,
        control,
        step.model,
        inputs=request.inputs,
        outputs=request.outputs,
        exchange=step.exchange,
        timeout=VERIFY_PROBE_TIMEOUT,
    )
    try:
        if wrong(request, asked(old)) is not None:
            return
    except VerifyFailed:
        return
    shape = "stream" if step.streaming else "request"
    for version in step.smoke_versions:
        why = None
        for _ in range(VERIFY_PROBE_TRIES):
            try:
                why = wrong(request, asked(version))
            except VerifyFailed as exc:
                why = str(exc)
            if why is None:
                break
        if why is not None:
            raise VerifyFailed(
                f"a {shape} synthesized from the model's inputs, which version {old} answers, "
                f"fails on version {version} {VERIFY_PROBE_TRIES} times in a row: {why}"
            )


def _unload(control: ModelControl, step: Step, timing: Timing, context: ChangeContext) -> StepDone:
    fault_point("apply.unload")
    try:
        context.stream_wait = _drop(control, step, timing)
        if step.needs_free is not None and context.source is not None:
            _wait_for_room(context.source, step, timing)
    except ReconcileError as exc:
        if exc.failure is FailureKind.AGAINST_VERSIONS:
            # A refused unload, or versions that did not go in time, say nothing against the
            # versions: an unload failure (the next pass retries), with the same message.
            raise UnloadFailed(str(exc)) from exc
        raise
    return NOTHING


def _wait_for_room(source: FiguresSource, step: Step, timing: Timing) -> None:
    """Gone from the index is not memory given back: a stub may take longer to exit, and
    Triton samples its memory figure every couple of seconds. Wait until the figure shows
    ``step.needs_free`` free (on the fullest GPU, where the server reports devices); a
    server that reports no figure is taken at the index's word.
    Not in time: the unload failed (the revert loads the old versions back; no hold)."""
    deadline = timing.clock() + timing.unload_wait
    assert step.needs_free is not None
    while True:
        figures = source.figures(step.model, ())
        free = free_memory(figures)
        if free is None:
            return
        if free >= step.needs_free:
            return
        if step.needs_free > room_in_all(figures):
            # More than the server (its fullest device) has in all: no unload makes room,
            # and waiting would only fail the swap. The load decides, as before the wait.
            return
        if timing.clock() >= deadline:
            raise UnloadFailed(
                f"server {step.server}: {step.model} is gone from the index, but the memory "
                f"figure shows {free / 2**20:.0f} MiB free after {timing.unload_wait:g}s, "
                f"{step.needs_free / 2**20:.0f} MiB needed: not loading into memory still held"
            )
        timing.sleep(timing.poll_interval)


def _drop(control: ModelControl, step: Step, timing: Timing) -> float | None:
    """Unload, and wait until the dropped versions are gone from READY; for a streaming
    model, the seconds it then waited for their streams in flight (None: no such wait)."""
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
    if step.streaming and dropped:
        return _drain_streams(control, step, timing)
    return None


def _drain_streams(control: ModelControl, step: Step, timing: Timing) -> float:
    """Wait for the streams in flight on the dropped versions to end there: Triton keeps a
    version UNLOADING until its last stream sends its final flag, and has no deadline of its
    own (server#7626: some backends never send it). Up to ``step.timeout``; past it the
    unload fails naming the versions (the new ones serve on; the service's unload-stuck
    alert follows a version that never goes), and their memory is not counted free.
    Returns the seconds it waited."""
    dropped = set(step.dropped)
    began = timing.clock()

    def unloading(state: ModelState) -> list[int]:
        return sorted(
            v.version for v in state.versions if v.version in dropped and v.state == "UNLOADING"
        )

    try:
        _wait_for(control, step, lambda s: not unloading(s), lambda _: None, step.timeout, timing)
        return timing.clock() - began
    except VerifyFailed as exc:
        still = ", ".join(map(str, unloading(control.model_state(step.model))))
        raise UnloadFailed(
            f"server {step.server}: {step.model} version(s) {still or 'dropped'} still UNLOADING "
            f"after {step.timeout:g}s: streams in flight on them have not sent their final "
            "flag; their memory is held until they do"
        ) from exc


def _shadow(control: ModelControl, step: Step, timing: Timing) -> None:
    """Replay the recorded requests, version-pinned: per request the old version twice
    (primary and secondary: the noise it makes by itself) and each new one, in an order
    shuffled per request; judged by ``core.comparison`` (the new version's disagreement
    beyond the noise, p95 latency of the interleaved calls)."""
    shadow, old = step.shadow, step.shadow_against
    assert shadow is not None and old is not None
    if not shadow.requests:
        return
    outputs = tuple(t.name for t in control.interface(step.model, old).outputs)
    tolerance = Tolerance(shadow.tolerance, shadow.relative_tolerance, shadow.top_k)
    for version in step.smoke_versions:
        # Seeded by what is compared: a replay of the same versions asks in the same order.
        order = random.Random(f"{step.server}/{step.model}/{old}/{version}")
        deviations, primary_s, candidate_s = [], [], []
        pinned = {"primary": old, "secondary": old, "candidate": version}
        for inputs in shadow.requests:
            call = partial(_pinned_call, control, step, pinned, inputs, outputs, timing.clock)
            replies, _ = interleaved(order, call, timing.clock)
            # An exchange's latency: a unary call's time, a stream's to its first response.
            primary_s.append(replies["primary"].first_seconds or 0.0)
            candidate_s.append(replies["candidate"].first_seconds or 0.0)
            answers = {role: answer_of(reply) for role, reply in replies.items()}
            deviations.append(deviations_of(answers, tolerance))
        comparison = compared(deviations, tuple(primary_s), tuple(candidate_s), step.streaming)
        failed = judged(
            comparison, shadow.min_agreement, shadow.max_latency_increase, tolerance=tolerance
        ) or unjudgeable(comparison, tolerance)
        if failed is not None:
            raise VerifyFailed(
                f"shadow replay of {len(shadow.requests)} request(s): version {version} "
                f"against version {old}: {failed}"
            )


def _pinned_call(
    control: ModelControl,
    step: Step,
    pinned: dict[str, int],
    inputs: tuple[Tensor, ...],
    outputs: tuple[str, ...],
    clock: Callable[[], float],
    role: str,
) -> Reply:
    """One role's exchange of a replayed request (a unary call, or a stream for a model
    that streams, to its final flag, within the schema's stream deadline): the version
    ``pinned`` gives that role."""
    return ask(
        control,
        step.model,
        pinned[role],
        inputs,
        outputs,
        exchange=step.exchange,
        timeout=StreamExpectation().deadline if step.streaming else None,
        clock=clock,
    )


DRAIN_TOLD_EVERY = 1.0  # seconds between a drain's readings told to the live view


def _drain(control: ModelControl, step: Step, timing: Timing, context: ChangeContext) -> StepDone:
    """Wait until the model is idle here: no pending request and no new inference for the
    idle window. Nothing is swapped on timeout: the old versions keep serving. A revert's
    drain (``Step.unless_failed``) ends at its timeout without failing: the revert goes on."""
    policy = step.drain
    assert policy is not None
    if policy.drain_webhook:
        context.hooks.call_webhook(
            policy.drain_webhook,
            {"event": "drain", "server": step.server, "model": step.model,
             "versions": list(step.versions)},
        )  # fmt: skip
    if step.unless_failed and (context.cutting or context.source is None):
        context.cut = _cut(step, timing, context.source)
        return NOTHING
    if context.source is None:
        raise DrainTimeout(f"server {step.server}: draining {step.model} needs its metrics")
    deadline = timing.clock() + policy.drain_timeout
    quiet_since: float | None = None
    last: float | None = None
    read_at: float | None = None
    said: float | None = None  # when the live view was last told
    while True:
        figures = context.source.figures(step.model, step.versions)
        now = timing.clock()
        if step.unless_failed and figures.error is not None:
            context.cut = Cut(None, 0.0)  # unreadable (the server lost, say): no waiting
            return NOTHING
        idle = figures.error is None and not figures.pending and figures.inferences is not None
        if idle and figures.inferences == last:
            quiet_since = now if quiet_since is None else quiet_since
            if now - quiet_since >= policy.idle:
                return NOTHING
        else:
            quiet_since = now if idle else None
        # What still reaches the model stands for its open sequences (``Draining``).
        rate = (
            (figures.inferences - last) / (now - read_at)
            if figures.inferences is not None and last is not None and read_at is not None
            and now > read_at
            else None
        )  # fmt: skip
        quiet = now - quiet_since if quiet_since is not None else 0.0
        if said is None or now - said >= DRAIN_TOLD_EVERY:
            left = max(0.0, deadline - now)
            timing.events.draining(step, Draining(rate, figures.pending, quiet, policy.idle, left))
            said = now
        if step.unless_failed and (now >= deadline or timing.stopping()):
            # A revert's drain never stops the revert: past its time (or at a shutdown)
            # what is still in flight is cut, and the old versions go back.
            read = now - read_at if rate is not None and read_at is not None else 0.0
            context.cut = Cut(rate, read)
            return NOTHING
        last, read_at = figures.inferences, now
        if now >= deadline:
            raise DrainTimeout(
                f"server {step.server}: {step.model} did not go idle within "
                f"{policy.drain_timeout:g}s (pending {figures.pending}, inferences still "
                "growing); not swapped, the old versions keep serving"
            )
        timing.sleep(min(1.0, max(timing.poll_interval, policy.idle / 10)))


CUT_READING = 1.0  # seconds a switch back reads what it cuts before it goes on


def _cut(step: Step, timing: Timing, source: FiguresSource | None) -> Cut:
    """What a switch back cuts of the sequences in flight on the new versions: the requests
    that still reach them over CUT_READING after the route sent every new sequence back
    (``Cut``). Not read at a shutdown, nor without the model's metrics."""
    if source is None or timing.stopping():
        return Cut(None, 0.0)
    first, began = source.figures(step.model, step.versions), timing.clock()
    timing.sleep(CUT_READING)
    last, ended = source.figures(step.model, step.versions), timing.clock()
    if first.inferences is None or last.inferences is None or ended <= began:
        return Cut(None, 0.0)
    return Cut(max(0.0, last.inferences - first.inferences) / (ended - began), ended - began)


def _load(control: ModelControl, step: Step, timing: Timing, context: ChangeContext) -> StepDone:
    assert step.config is not None
    source = context.source
    before = source.figures(step.model, ()) if source is not None else None
    fault_point("apply.load.requested")
    control.load(step.model, step.config)
    fault_point("apply.load.accepted")
    # What each version holds as Triton's statistics say, where its backend reports it (per
    # device: ONNX Runtime, TensorRT); preferred to the memory figures' growth, which
    # another process moves too (footprints_from chooses).
    context.version_costs = {
        version: float(held)
        for version, usage in control.memory_usage(step.model).items()
        if version in step.versions and (held := version_cost(usage)) is not None
    }
    if source is not None and before is not None and before.memory_bytes is not None:
        # What loading beside the old cost the server (the most on any one GPU): the
        # footprint the next headroom check uses when the manifest declares none.
        cost = footprint(before, source.figures(step.model, ()))
        if cost is not None and len(step.versions) > 0:
            context.footprint = cost
    return NOTHING


def _replace_library(
    control: ModelControl, step: Step, timing: Timing, context: ChangeContext
) -> StepDone:
    context.hooks.replace_library(step)
    fault_point("apply.library.replaced")  # old versions out, new library in, nothing loaded
    return NOTHING


Executor = Callable[[ModelControl, Step, Timing, ChangeContext], StepDone]

# Every Action a plan holds, and what carries it out. ROLLOUT is never planned (results only).
EXECUTORS: Mapping[Action, Executor] = {
    Action.DRAIN: _drain,
    Action.UNLOAD: _unload,
    Action.REPLACE_LIBRARY: _replace_library,
    Action.LOAD: _load,
    Action.VERIFY: _verify,
    Action.ANALYZE: analyze_step,
}


def execute_step(
    control: ModelControl, step: Step, timing: Timing, context: ChangeContext
) -> StepDone:
    """Carry out one step; raise a ReconcileError subclass when it fails.

    Returns the evaluations and verdict of an analyze step, nothing for the others.
    """
    return EXECUTORS[step.action](control, step, timing, context)
