"""One step at a time: load, verify (readiness, smoke cases, interface,
shadow), drain, analyze, unload, library replacement. ``EXECUTORS`` maps each planned Action to
the function that carries it out; ``execute_step`` dispatches through it. Called by
``engine/change.py`` and ``engine/staged.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from reconciler.core.analysis import (
    baseline_from,
    concluded,
    early_abort,
    evaluate,
    latency_unconfirmed,
    probe_capacity,
    routed_since,
    same_time_latency,
    since_ready,
)
from reconciler.core.probes import synthesized, wrong
from reconciler.core.smoke import mismatches
from reconciler.engine.probes import Prober
from reconciler.faults import fault_point
from reconciler.model.analysis import (
    AnalysisSpec,
    CheckResult,
    Evaluation,
    Figures,
    ProbeFigures,
    RolloutVerdict,
    Verdict,
)
from reconciler.model.errors import (
    Aborted,
    AnalysisFailed,
    DrainTimeout,
    Interrupted,
    MetricsUnavailable,
    ReconcileError,
    StepFailed,
    UnloadFailed,
    VerifyFailed,
)
from reconciler.model.history import OperatorOrder, OrderKind
from reconciler.model.plan import Action, Step
from reconciler.model.results import FailureKind
from reconciler.model.serving import ModelInterface, ModelState, interface_difference
from reconciler.ports import FiguresSource, ModelControl, StepEvents, StepHooks

# The steps that move a rollout forward (an abort stops them; a revert's steps are not).
FORWARD = frozenset({Action.LOAD, Action.VERIFY, Action.ANALYZE, Action.REPLACE_LIBRARY})


class NoEvents:
    """Nobody watches the steps as they run (a test, the gate)."""

    def started(self, step: Step, reverting: bool) -> None:
        pass

    def evaluated(self, step: Step, evaluation: Evaluation, seconds_left: float) -> None:
        pass


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
    # The operator's orders (``engine/orders.py``): for a step, and the wall-clock time its
    # analysis began (None between steps), the abort or promote it obeys now. None: no
    # orders are read (a gate, a test).
    orders: Callable[[Step, float | None], OperatorOrder | None] | None = None
    wall: Callable[[], float] = time.time
    events: StepEvents = field(default_factory=lambda: NoEvents())  # steps begun, evaluations


def aborted(step: Step, order: OperatorOrder, evaluations: tuple[Evaluation, ...] = ()) -> Aborted:
    """The error a step ends with when an operator aborted its rollout."""
    why = f": {order.reason}" if order.reason else ""
    return Aborted(
        f"server {step.server}: rollout of {step.model} aborted by {order.by} at {order.at}"
        f"{why}; the old versions serve again and the spec is held (retry, undo or a new "
        "commit lifts it)",
        evaluations,
    )


def obey_abort(step: Step, timing: Timing) -> None:
    """Raise ``Aborted`` if an operator aborted ``step``'s rollout (between steps, while
    waiting)."""
    if timing.orders is None:
        return
    order = timing.orders(step, None)
    if order is not None and order.kind is OrderKind.ABORT:
        raise aborted(step, order)


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


class NoStepHooks:
    """The hooks of an executor that was given none: a step that needs a webhook or a
    replaceLibrary command fails, saying so (a plan without them never calls these)."""

    def call_webhook(self, url: str, payload: Mapping[str, Any]) -> None:
        raise StepFailed(f"no step hooks were given to apply: cannot call the {url} webhook")

    def replace_library(self, step: Step) -> None:
        raise StepFailed(
            f"no step hooks were given to apply: cannot replace {step.model}'s library"
        )


@dataclass
class _ChangeContext:
    """What one change's steps share while it runs."""

    source: FiguresSource | None = None
    interface: ModelInterface | None = None  # the old versions' inputs and outputs
    footprint: float | None = None
    # Where the analysis reads the old versions' figures: the servers the plan names as the
    # stage's baseline (RolloutPlan.baselines), when there are some; else (None) this
    # server's own old versions.
    baseline: FiguresSource | None = None
    hooks: StepHooks = field(default_factory=NoStepHooks)  # webhooks, replaceLibrary
    # The analysis's: the new versions' counters read before they loaded (their requests
    # count from READY), and the probes, prepared before the load too.
    counted_from: Figures | None = None
    prober: Prober | None = None
    replaces: bool = True  # the change replaces serving versions (False: a first deployment)
    # A traffic rollout's phases watch the same new versions one after another: what reached
    # them in the earlier phases counts towards minEvidence (``evidence_before``), which only
    # the last phase judges (``judge_evidence``); an earlier phase is judged by its
    # evaluations alone. A probe-only phase of one interval cannot gather minEvidence from a
    # slow model on its own (after a 100 ms probe the next waits 1.9 s at maxShare 0.05).
    evidence_before: float = 0.0
    judge_evidence: bool = True
    evidence: float = 0.0  # set by the analysis: the requests or probes that reached them
    # The new versions take no client request (a traffic phase at no traffic): like new
    # versions below the old, their latency is judged by the probes, new against old.
    probes_only: bool = False


# What a step's executor returns: an analyze step's evaluations and verdict, else nothing.
StepDone = tuple[tuple[Evaluation, ...], RolloutVerdict | None]
_NOTHING: StepDone = ((), None)


def _verify(control: ModelControl, step: Step, timing: Timing, context: _ChangeContext) -> StepDone:
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
        outputs = tuple(e.name for e in case.expect)
        for version in step.smoke_versions:
            answer = control.infer(step.model, version, case.inputs, outputs)
            wrong = mismatches(case, answer)
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
    return _NOTHING


VERIFY_PROBE_TRIES = 3  # a synthesized request that fails this many times in a row fails verify
VERIFY_PROBE_TIMEOUT = 5.0


def _probe_synthesized(
    control: ModelControl, step: Step, old: int, context: _ChangeContext
) -> None:
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
    try:
        answer = control.infer(
            step.model, old, request.inputs, request.outputs, VERIFY_PROBE_TIMEOUT
        )
    except VerifyFailed:
        return
    if wrong(request, answer) is not None:
        return
    for version in step.smoke_versions:
        why = None
        for _ in range(VERIFY_PROBE_TRIES):
            try:
                why = wrong(
                    request,
                    control.infer(
                        step.model, version, request.inputs, request.outputs,
                        VERIFY_PROBE_TIMEOUT,
                    ),
                )  # fmt: skip
            except VerifyFailed as exc:
                why = str(exc)
            if why is None:
                break
        if why is not None:
            raise VerifyFailed(
                f"a request synthesized from the model's inputs, which version {old} answers, "
                f"fails on version {version} {VERIFY_PROBE_TRIES} times in a row: {why}"
            )


def _unload(control: ModelControl, step: Step, timing: Timing, context: _ChangeContext) -> StepDone:
    fault_point("apply.unload")
    try:
        _drop(control, step, timing)
    except ReconcileError as exc:
        if exc.failure is FailureKind.AGAINST_VERSIONS:
            # A refused unload, or versions that did not go in time, say nothing against the
            # versions: an unload failure (the next pass retries), with the same message.
            raise UnloadFailed(str(exc)) from exc
        raise
    return _NOTHING


def _drop(control: ModelControl, step: Step, timing: Timing) -> None:
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


def _shadow(control: ModelControl, step: Step, timing: Timing) -> None:
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


def _drain(control: ModelControl, step: Step, timing: Timing, context: _ChangeContext) -> StepDone:
    """Wait until the model is idle here: no pending request and no new inference for the
    idle window. Nothing is swapped on timeout: the old versions keep serving."""
    policy = step.drain
    assert policy is not None
    if policy.drain_webhook:
        context.hooks.call_webhook(
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
                return _NOTHING
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


def _analyze(
    control: ModelControl, step: Step, timing: Timing, context: _ChangeContext
) -> StepDone:
    """Watch the new versions for the analysis's duration: an evaluation every interval
    (Triton's counters and the probes over the window), and between evaluations the probes
    and, every ``earlyAbort.every``, the counters, so that a version clients see failing is
    caught at once rather than at the end of the interval."""
    source, baseline_source = context.source, context.baseline
    spec = step.analysis
    assert spec is not None
    if source is None:
        raise AnalysisFailed(
            f"server {step.server}: no metrics source for the analysis", (), RolloutVerdict.FAILED
        )
    prober = context.prober
    # Killed here, the new versions are loaded and verified and their analysis has begun.
    fault_point("apply.analysis")
    started = timing.clock()
    watch = _Watch(
        step,
        spec,
        source,
        timing,
        started,
        context.replaces and context.judge_evidence,
        context.evidence_before,
        context.probes_only,
    )
    try:
        obeyed = watch.obey()  # a ``promote --full`` given earlier: this one is skipped too
        if obeyed is not None:
            return obeyed
        if prober is not None:
            # Latency judged by the probes alone: each timed after a wake-up probe.
            prober.warm = watch.pinned_only and any(c.kind == "latency" for c in spec.checks)
            prober.volley(spec.early_abort.consecutive_probe_failures)
            watch.check_abort(None, prober.figures)
            watch.probes_after_volley = prober.figures
        queries = {c.name: c.query for c in spec.checks if c.query}
        at_start = source.figures(step.model, step.versions, queries)
        watch.unreadable = at_start.error is not None
        # Counting starts at READY: from the reading taken before the new versions loaded,
        # when there is one (brand-new versions); else from now.
        origin = context.counted_from if context.counted_from is not None else at_start
        watch.origin = origin
        if spec.early_abort.every > 0:  # else the counters are judged at evaluations only
            # Before the baseline's read: every read is a scrape, and clients are failing.
            watch.check_abort(at_start, prober.figures if prober else None)
        old = (
            (baseline_source or source).figures(step.model, step.baseline)
            if step.baseline
            else None
        )
        watch.baseline = baseline_from(old, at_start)
        watch.old_source, watch.old_start = baseline_source or source, old
        # Prometheus may have no series of a brand-new version yet: then from READY.
        has_series = at_start.duration_us is not None and at_start.success is not None
        watch.latency_from = at_start if at_start.error is None and has_series else origin
        # Prometheus has no series of versions READY a moment ago until its next scrape:
        # evaluations before the first one shows up are not fresh (``_Watch.fresh``).
        watch.awaiting_series = at_start.error is None and at_start.success is None
        return watch.run(origin, queries, prober)
    finally:
        context.evidence = watch.evidence
        if prober is not None:
            prober.close()


FIRST_POLL_GAP = 0.01  # seconds; doubled after each read, up to earlyAbort.every
# Seconds between two looks at the operator's orders during an analysis (each look is cheap:
# ``engine/orders.py`` reads the store at most every ORDERS_EVERY).
ORDERS_GAP = 0.1


class _Watch:
    """One analysis as it runs: its evaluations so far, and the early abort."""

    def __init__(
        self,
        step: Step,
        spec: AnalysisSpec,
        source: FiguresSource,
        timing: Timing,
        started: float,
        replaces: bool,
        evidence_before: float = 0.0,
        probes_only: bool = False,
    ) -> None:
        self.step, self.spec, self.source, self.timing = step, spec, source, timing
        self.started = started
        self.evaluations: list[Evaluation] = []
        self.unreadable = False
        self.origin: Figures | None = None
        self.baseline = baseline_from(None, Figures())
        self.evidence = 0.0  # this analysis's own
        self.evidence_before = evidence_before  # the rollout's earlier phases'
        self.replaces = replaces  # versions served before, and judged here: minEvidence applies
        # Where the old versions are read again at each evaluation, and their reading as the
        # analysis began: their latency over the same time is the baseline when they served
        # enough requests meanwhile (the old pool of a staged or traffic rollout).
        self.old_source: FiguresSource | None = None
        self.old_start: Figures | None = None
        self.awaiting_series = False  # no reading has shown the new versions' series yet
        self.latency_from: Figures | None = None  # where every evaluation's latency starts
        # New versions below the old ones: unversioned requests keep reaching the old, so
        # the new see only pinned ones (the probes), and their latency is judged by those.
        # So do new versions the router sends no client request yet (``probes_only``).
        self.pinned_only = bool(step.baseline) and (
            probes_only or max(step.versions) < max(step.baseline)
        )
        # The counters are read soon after the analysis starts, then less often, up to
        # earlyAbort.every: when counting could not start at READY (a config change, an old
        # instance of the version still unloading), the first reading has no request of the
        # new versions, and a failing one should not wait the whole ``every``.
        self.poll_gap = FIRST_POLL_GAP
        # The probes after the first volley: its probe of a fresh version is cold.
        self.probes_after_volley = ProbeFigures()
        self._probes_at_last = ProbeFigures()  # the probe count at the last evaluation
        self.started_wall = timing.wall()  # what the operator's orders are compared with

    def obey(self) -> StepDone | None:
        """What an operator's order makes of the analysis now: an abort fails it, a promote
        passes it with the evaluations made so far; None: it goes on."""
        if self.timing.orders is None:
            return None
        order = self.timing.orders(self.step, self.started_wall)
        if order is None:
            return None
        if order.kind is OrderKind.ABORT:
            raise aborted(self.step, order, tuple(self.evaluations))
        return tuple(self.evaluations), RolloutVerdict.PROMOTED

    def _since_ready(self, current: Figures | None) -> tuple[float, float] | None:
        if self.origin is None or current is None:
            return None
        return since_ready(self.origin, current)

    def _evidence(self, current: Figures | None, probes: ProbeFigures | None) -> None:
        counted = self._since_ready(current)
        routed = routed_since(self.origin, current)
        self.evidence = max(
            self.evidence,
            sum(counted) if counted else 0.0,
            sum(routed) if routed else 0.0,
            float(probes.sent) if probes else 0.0,
        )

    def check_abort(self, current: Figures | None, probes: ProbeFigures | None) -> None:
        """Fail now if the early abort says so (``current``: the counters just read)."""
        routed = routed_since(self.origin, current)
        reason = early_abort(self.spec, self._since_ready(current), probes, routed)
        if reason is not None:
            self._abort(reason, probes)

    def _abort(self, reason: CheckResult, probes: ProbeFigures | None) -> None:
        window = probes.since(self._probes_at_last) if probes else None
        evaluation = Evaluation(
            len(self.evaluations),
            self.timing.clock() - self.started,
            (reason,),
            reason.verdict,
            probes=window,
            aborted=True,
        )
        self.evaluations.append(evaluation)
        raise _analysis_failed(self.step, RolloutVerdict.FAILED, tuple(self.evaluations), None)

    def run(self, previous: Figures, queries: dict[str, str], prober: Prober | None) -> StepDone:
        spec, step, timing = self.spec, self.step, self.timing
        every = spec.early_abort.every
        order_gap = ORDERS_GAP if timing.orders is not None else None
        while True:
            # Ticks are measured from the start, so slow scrapes do not stretch the analysis.
            next_tick = self.started + spec.interval * (len(self.evaluations) + 1)
            next_poll = timing.clock() + min(every, self.poll_gap) if every > 0 else next_tick
            next_order = timing.clock() if order_gap is not None else None
            while True:
                now = timing.clock()
                if now >= next_tick:
                    break
                if timing.stopping():
                    self._interrupted()
                if order_gap is not None and next_order is not None and now >= next_order:
                    obeyed = self.obey()
                    if obeyed is not None:
                        return obeyed
                    next_order = now + order_gap
                    continue
                due = prober.due() if prober is not None else None
                if prober is not None and due is not None and due <= now:
                    prober.round()
                    self.check_abort(None, prober.figures)
                    continue
                if now >= next_poll:
                    polled = self.source.figures(step.model, step.versions)
                    self._evidence(polled, prober.figures if prober else None)
                    self.check_abort(polled, prober.figures if prober else None)
                    self.poll_gap = min(every, self.poll_gap * 2)
                    next_poll = timing.clock() + self.poll_gap
                    continue
                wake = min(t for t in (next_tick, next_poll, due, next_order) if t is not None)
                timing.sleep(max(0.0, wake - now))
            if timing.stopping():
                self._interrupted()
            current = self.source.figures(step.model, step.versions, queries)
            fresh = self.fresh(current)
            self.unreadable = (
                self.unreadable or current.error is not None or current.scrape_failed is not None
            )
            if self.baseline.memory_bytes is None and current.memory_bytes is not None:
                # The first reading had no memory figure (a failed scrape, or Triton not yet
                # sampling): measure growth from the first reading that has one.
                self.baseline = replace(self.baseline, memory_bytes=current.memory_bytes)
            elapsed = timing.clock() - self.started
            probes = prober.figures if prober is not None else None
            window = probes.since(self._probes_at_last) if probes else None
            self._probes_at_last = probes or ProbeFigures()
            self._evidence(current, probes)
            self.evaluations.append(
                evaluate(
                    spec,
                    len(self.evaluations),
                    elapsed,
                    previous,
                    current,
                    replace(self.baseline, same_time_latency_us=self._old_meanwhile()),
                    window,
                    counted=elapsed >= spec.initial_delay and fresh,
                    # Latency over everything since the analysis began, not the window:
                    # one noisy second on a busy host is not a slower version.
                    latency_from=self.latency_from,
                    pinned=(
                        probes.since(self.probes_after_volley)
                        if self.pinned_only and probes is not None
                        else None
                    ),
                    latency_probes=(
                        probes.since(self.probes_after_volley) if probes is not None else None
                    ),
                    latency_pending=bool(self.evaluations)
                    and latency_unconfirmed(spec, self.evaluations[-1]),
                )
            )
            if fresh:  # else the next window starts where this one did
                previous = current
            timing.events.evaluated(step, self.evaluations[-1], max(0.0, spec.duration - elapsed))
            # A first deployment has nothing to go back to: judged by its evaluations alone.
            evidence = self.evidence + self.evidence_before if self.replaces else None
            verdict = concluded(spec, tuple(self.evaluations), elapsed, self.unreadable, evidence)
            if verdict is RolloutVerdict.PASSED:
                return tuple(self.evaluations), verdict
            if verdict is not RolloutVerdict.RUNNING:
                raise _analysis_failed(
                    step,
                    verdict,
                    tuple(self.evaluations),
                    current.error,
                    evidence,
                    self.evidence_before,
                    prober.figures if prober is not None else None,
                )
            self.check_abort(current, probes)

    def fresh(self, current: Figures) -> bool:
        """Whether ``current`` shows the new versions as they are now. Not before the source's
        first scrape of versions READY a moment ago, nor after a failed scrape (Prometheus
        hides every series of the server until one succeeds): such an evaluation is shown,
        not counted, and the next window starts where it did. A series missing otherwise is
        no-data as ever; one that never shows up leaves the analysis inconclusive."""
        self.awaiting_series = self.awaiting_series and current.success is None
        return not self.awaiting_series and current.scrape_failed is None

    def _old_meanwhile(self) -> float | None:
        """The old versions' mean latency since the analysis began, if they served enough
        requests meanwhile to be the baseline (``same_time_latency``)."""
        if self.old_source is None or self.old_start is None or not self.step.baseline:
            return None
        if not any(c.kind == "latency" for c in self.spec.checks):
            return None
        now = self.old_source.figures(self.step.model, self.step.baseline)
        return same_time_latency(self.old_start, now)

    def _interrupted(self) -> None:
        step = self.step
        raise Interrupted(
            f"server {step.server}: analysis of {step.model} interrupted by shutdown after "
            f"{len(self.evaluations)} evaluation(s); the old versions serve again",
            tuple(self.evaluations),
        )


def _analysis_failed(
    step: Step,
    verdict: RolloutVerdict,
    evaluations: tuple[Evaluation, ...],
    error: str | None,
    evidence: float | None = None,
    evidence_before: float = 0.0,
    probes: ProbeFigures | None = None,
) -> AnalysisFailed:
    """The error an analysis ends with; ``error`` is the last reading's, if it failed;
    ``evidence``: the requests or probes that reached the new versions (``evidence_before``
    of them in a traffic rollout's earlier phases); ``probes``: this analysis's."""
    spec = step.analysis
    assert spec is not None
    versions = ", ".join(map(str, step.versions))
    if verdict is RolloutVerdict.METRICS_UNAVAILABLE:
        return MetricsUnavailable(
            f"server {step.server}: analysis of {step.model} version(s) {versions} "
            f"inconclusive: metrics unavailable ({error or 'a reading failed'}); the old "
            "versions serve again, not held: the next pass analyses again",
            evaluations,
            verdict,
        )
    last = evaluations[-1]
    no_data = sum(e.counted and e.verdict is Verdict.NO_DATA for e in evaluations)
    if verdict is RolloutVerdict.FAILED:
        why = "; ".join(str(r) for r in last.failed)
    elif no_data > spec.inconclusive_limit:
        why = (
            f"{no_data} evaluation(s) without data (inconclusiveLimit {spec.inconclusive_limit};"
            f" last: {'; '.join(str(r) for r in last.results)})"
        )
    elif (
        evidence is not None
        and evidence < spec.min_evidence
        and any(e.counted and e.verdict is Verdict.PASS for e in evaluations)
    ):
        earlier = f", {evidence_before:.0f} in earlier phases" if evidence_before else ""
        why = (
            f"only {evidence:.0f} request(s) or probe(s) reached the new versions "
            f"({evidence - evidence_before:.0f} in this analysis's {last.at:g}s{earlier}; "
            f"minEvidence {spec.min_evidence}){probe_capacity(spec, probes)}"
        )
    else:
        why = (
            f"no evaluation counted in {spec.duration:g}s "
            f"(last: {'; '.join(str(r) for r in last.results)})"
        )
    return AnalysisFailed(
        f"server {step.server}: analysis of {step.model} version(s) {versions} {verdict} "
        f"after {len(evaluations)} evaluation(s): {why}",
        evaluations,
        verdict,
    )


def _load(control: ModelControl, step: Step, timing: Timing, context: _ChangeContext) -> StepDone:
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
    return _NOTHING


def _replace_library(
    control: ModelControl, step: Step, timing: Timing, context: _ChangeContext
) -> StepDone:
    context.hooks.replace_library(step)
    fault_point("apply.library.replaced")  # old versions out, new library in, nothing loaded
    return _NOTHING


Executor = Callable[[ModelControl, Step, Timing, _ChangeContext], StepDone]

# Every Action a plan holds, and what carries it out. ROLLOUT is never planned (results only).
EXECUTORS: Mapping[Action, Executor] = {
    Action.DRAIN: _drain,
    Action.UNLOAD: _unload,
    Action.REPLACE_LIBRARY: _replace_library,
    Action.LOAD: _load,
    Action.VERIFY: _verify,
    Action.ANALYZE: _analyze,
}


def execute_step(
    control: ModelControl, step: Step, timing: Timing, context: _ChangeContext
) -> StepDone:
    """Carry out one step; raise a ReconcileError subclass when it fails.

    Returns the evaluations and verdict of an analyze step, nothing for the others.
    """
    return EXECUTORS[step.action](control, step, timing, context)
