"""The analyze step: the new versions watched against the old (or the stage's baseline) for
the analysis's duration, each evaluation judged by ``core.analysis``, an early abort on a
clear failure, an operator's abort or promote obeyed within ORDERS_GAP. One of the step
executors of ``engine/steps.py``.

This module keeps the clock (``_Watch``): when to probe, read the counters, evaluate and
look at the operator's orders. What was read and probed is judged by the analysis's
``Judgement`` (``engine/judgement.py``).
"""

from __future__ import annotations

from reconciler.core.latency import woken_probes
from reconciler.engine.context import ChangeContext, StepDone, Timing, aborted
from reconciler.engine.judgement import Judgement
from reconciler.engine.probes import Prober
from reconciler.faults import fault_point
from reconciler.model.analysis import Figures, ProbeFigures, RolloutVerdict
from reconciler.model.errors import AnalysisFailed, Interrupted
from reconciler.model.history import OrderKind
from reconciler.model.plan import Step
from reconciler.ports import ModelControl


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
    judgement = Judgement(
        step,
        spec,
        source,
        timing,
        started,
        context.replaces and context.judge_evidence,
        context.evidence_before,
        context.probes_only,
    )
    judgement.shadow = context.shadow
    watch = _Watch(judgement, prober)
    try:
        obeyed = watch.obey()  # a ``promote --full`` given earlier: this one is skipped too
        if obeyed is not None:
            return obeyed
        if prober is not None:
            # Latency judged by the probes alone: each timed after a wake-up probe.
            prober.warm = woken_probes(
                judgement.pinned_only and any(c.kind == "latency" for c in spec.checks),
                step.streaming,
                context.probes_only,
                step.old_under_load > 0,
            )
            prober.volley(spec.early_abort.consecutive_probe_failures)
            judgement.check_abort(None, prober.figures)
            judgement.probes_after_volley = prober.figures
        queries = {c.name: c.query for c in spec.checks if c.query}
        at_start = source.figures(step.model, step.versions, queries)
        # Counting starts at READY: from the reading taken before the new versions loaded,
        # when there is one (brand-new versions); else from now.
        origin = context.counted_from if context.counted_from is not None else at_start
        judgement.origin = origin
        if spec.early_abort.every > 0:  # else the counters are judged at evaluations only
            # Before the baseline's read: every read is a scrape, and clients are failing.
            judgement.check_abort(at_start, watch.probes)
        old_source = baseline_source or source
        old = old_source.figures(step.model, step.baseline) if step.baseline else None
        judgement.begin(at_start, origin, old, old_source)
        return watch.run(origin, queries)
    finally:
        context.evidence = judgement.evidence
        if prober is not None:
            prober.close()


FIRST_POLL_GAP = 0.01  # seconds; doubled after each read, up to earlyAbort.every

# Seconds between two looks at the operator's orders during an analysis (each look is cheap:
# ``engine/orders.py`` reads the store at most every ORDERS_EVERY).
ORDERS_GAP = 0.1


class _Watch:
    """One analysis's clock: the probes' rounds, the counters' reads for the early abort,
    an evaluation every interval, the operator's orders."""

    def __init__(self, judgement: Judgement, prober: Prober | None) -> None:
        self.judgement, self.prober = judgement, prober
        self.step, self.spec, self.timing = judgement.step, judgement.spec, judgement.timing
        # The counters are read soon after the analysis starts, then less often, up to
        # earlyAbort.every: when counting could not start at READY (a config change, an old
        # instance of the version still unloading), the first reading has no request of the
        # new versions, and a failing one should not wait the whole ``every``.
        self.poll_gap = FIRST_POLL_GAP
        self.started_wall = self.timing.wall()  # what the operator's orders are compared with

    @property
    def probes(self) -> ProbeFigures | None:
        """The probes so far, if any are sent."""
        return self.prober.figures if self.prober is not None else None

    def obey(self) -> StepDone | None:
        """What an operator's order makes of the analysis now: an abort fails it, a promote
        passes it with the evaluations made so far; None: it goes on."""
        if self.timing.orders is None:
            return None
        order = self.timing.orders(self.step, self.started_wall)
        if order is None:
            return None
        evaluations = tuple(self.judgement.evaluations)
        if order.kind is OrderKind.ABORT:
            raise aborted(self.step, order, evaluations)
        return evaluations, RolloutVerdict.PROMOTED

    def run(self, previous: Figures, queries: dict[str, str]) -> StepDone:
        spec, step, timing, judgement, prober = (
            self.spec,
            self.step,
            self.timing,
            self.judgement,
            self.prober,
        )
        every = spec.early_abort.every
        order_gap = ORDERS_GAP if timing.orders is not None else None
        while True:
            # Ticks are measured from the start, so slow scrapes do not stretch the analysis.
            next_tick = judgement.started + spec.interval * (len(judgement.evaluations) + 1)
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
                    judgement.check_abort(None, prober.figures)
                    continue
                if now >= next_poll:
                    polled = judgement.source.figures(step.model, step.versions)
                    judgement.saw(polled, self.probes)
                    judgement.check_abort(polled, self.probes)
                    self.poll_gap = min(every, self.poll_gap * 2)
                    next_poll = timing.clock() + self.poll_gap
                    continue
                wake = min(t for t in (next_tick, next_poll, due, next_order) if t is not None)
                timing.sleep(max(0.0, wake - now))
            if timing.stopping():
                self._interrupted()
            current = judgement.source.figures(step.model, step.versions, queries)
            elapsed = timing.clock() - judgement.started
            probes = self.probes
            previous = judgement.evaluate(previous, current, probes, elapsed)
            timing.events.evaluated(
                step, judgement.evaluations[-1], max(0.0, spec.duration - elapsed)
            )
            if judgement.verdict(elapsed, current, probes) is RolloutVerdict.PASSED:
                return tuple(judgement.evaluations), RolloutVerdict.PASSED
            judgement.check_abort(current, probes)

    def _interrupted(self) -> None:
        step = self.step
        raise Interrupted(
            f"server {step.server}: analysis of {step.model} interrupted by shutdown after "
            f"{len(self.judgement.evaluations)} evaluation(s); the old versions serve again",
            tuple(self.judgement.evaluations),
        )
