"""The analyze step: the new versions watched against the old (or the stage's baseline) for
the analysis's duration, each evaluation judged by ``core.analysis``, an early abort on a
clear failure, an operator's abort or promote obeyed within ORDERS_GAP. One of the step
executors of ``engine/steps.py``.
"""

from __future__ import annotations

from dataclasses import replace

from reconciler.core.analysis import (
    concluded,
    early_abort,
    evaluate,
    probe_capacity,
    unconfirmed,
)
from reconciler.core.latency import PINNED, STREAMED, same_time_latency
from reconciler.core.readings import baseline_from, routed_since, since_ready
from reconciler.core.shadow import shadow_checks, short_message, short_of_requests
from reconciler.engine.context import ChangeContext, StepDone, Timing, aborted
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
    AnalysisFailed,
    Interrupted,
    MetricsUnavailable,
)
from reconciler.model.history import OrderKind
from reconciler.model.plan import Step
from reconciler.ports import FiguresSource, ModelControl, ShadowComparison


def analyze_step(
    control: ModelControl, step: Step, timing: Timing, context: ChangeContext
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
    watch.shadow = context.shadow
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
        # A streaming model's too: Triton's counters do not time its streams (a version whose
        # first response came 300 ms late read 3.4 ms against 1.2 ms on 2.51), its probes'
        # time to the first response does.
        self.pinned_only = bool(step.baseline) and (
            probes_only or step.streaming or max(step.versions) < max(step.baseline)
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
        self.shadow: ShadowComparison | None = None  # a shadow phase's comparison

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
                    pinned_why=STREAMED if step.streaming else PINNED,
                    latency_probes=(
                        probes.since(self.probes_after_volley) if probes is not None else None
                    ),
                    latency_pending=bool(self.evaluations)
                    and unconfirmed(spec, self.evaluations[-1], ("latency",)),
                    memory_pending=bool(self.evaluations)
                    and unconfirmed(spec, self.evaluations[-1], ("memory",)),
                    judged_elsewhere=(
                        shadow_checks(self.shadow.target.spec, self.shadow.figures())
                        if self.shadow is not None
                        else ()
                    ),
                )
            )
            if fresh:  # else the next window starts where this one did
                previous = current
            timing.events.evaluated(step, self.evaluations[-1], max(0.0, spec.duration - elapsed))
            # A first deployment has nothing to go back to: judged by its evaluations alone.
            evidence = self.evidence + self.evidence_before if self.replaces else None
            verdict = concluded(spec, tuple(self.evaluations), elapsed, self.unreadable, evidence)
            if verdict is RolloutVerdict.PASSED and self.shadow is not None:
                verdict = self._compared_enough(elapsed) or verdict
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

    def _compared_enough(self, elapsed: float) -> RolloutVerdict | None:
        """For a shadow phase whose analysis passed: None when the comparator compared
        enough; RUNNING while it may wait for more; else it fails as whenShort says."""
        assert self.shadow is not None
        spec, figures = self.shadow.target.spec, self.shadow.figures()
        verdict = short_of_requests(spec, figures, elapsed, self.spec.duration)
        if verdict is None or verdict is RolloutVerdict.RUNNING:
            return verdict
        step = self.step
        error = (
            MetricsUnavailable if verdict is RolloutVerdict.METRICS_UNAVAILABLE else AnalysisFailed
        )
        raise error(
            f"server {step.server}: analysis of {step.model} version(s) "
            f"{', '.join(map(str, step.versions))} {verdict} after "
            f"{len(self.evaluations)} evaluation(s): {short_message(spec, figures, elapsed)}",
            tuple(self.evaluations),
            verdict,
        )

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
