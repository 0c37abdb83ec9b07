"""What one analysis has seen and concluded so far (``Judgement``): where its readings
start, the baseline, the evidence that reached the new versions, its evaluations (each judged
by ``core.analysis``), the early abort, and the error it ends with. The analyze step
(``engine/analyze.py``) keeps the clock: when to read, probe and look at the operator's
orders; this module is told what was read and probed, and judges it.

The probes are exchanges with the versions (one response or a stream): the figures they
bring are judged alike, and which of them judges latency alone, and why, is
``core.latency.judged_by_probes``'s to say.
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
from reconciler.core.latency import (
    PINNED,
    STREAMED,
    judged_by_probes,
    same_time_latency,
    uneven_load,
)
from reconciler.core.readings import baseline_from, routed_since, since_ready
from reconciler.core.shadow import shadow_checks, short_message, short_of_requests
from reconciler.engine.context import Timing
from reconciler.model.analysis import (
    AnalysisSpec,
    CheckResult,
    Evaluation,
    Figures,
    ProbeFigures,
    RolloutVerdict,
    Verdict,
)
from reconciler.model.errors import AnalysisFailed, MetricsUnavailable
from reconciler.model.plan import Step
from reconciler.ports import FiguresSource, ShadowComparison


class Judgement:
    """One analysis's readings and evaluations so far, and its verdict."""

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
        # Why the probes alone judge the new versions' latency, or None (the counters do).
        self.probes_judge = judged_by_probes(
            has_old=bool(step.baseline),
            streaming=step.streaming,
            probes_only=probes_only,
            below_old=bool(step.baseline) and max(step.versions) < max(step.baseline),
        )
        # The probes after the first volley: its probe of a fresh version is cold.
        self.probes_after_volley = ProbeFigures()
        self._probes_at_last = ProbeFigures()  # the probe count at the last evaluation
        self.shadow: ShadowComparison | None = None  # a shadow phase's comparison

    @property
    def pinned_only(self) -> bool:
        """Whether the probes alone judge the new versions' latency."""
        return self.probes_judge is not None

    def begin(
        self, at_start: Figures, origin: Figures, old: Figures | None, old_source: FiguresSource
    ) -> None:
        """Where the analysis's readings start: the reading as it began (``at_start``), the
        one counting starts from (``origin``: READY), and the old versions' (``old``, read
        from ``old_source``)."""
        self.unreadable = at_start.error is not None
        self.origin = origin
        self.baseline = baseline_from(old, at_start)
        self.old_source, self.old_start = old_source, old
        # Prometheus may have no series of a brand-new version yet: then from READY.
        has_series = at_start.duration_us is not None and at_start.success is not None
        self.latency_from = at_start if at_start.error is None and has_series else origin
        # Prometheus has no series of versions READY a moment ago until its next scrape:
        # evaluations before the first one shows up are not fresh (``fresh``).
        self.awaiting_series = at_start.error is None and at_start.success is None

    def _since_ready(self, current: Figures | None) -> tuple[float, float] | None:
        if self.origin is None or current is None:
            return None
        return since_ready(self.origin, current)

    def saw(self, current: Figures | None, probes: ProbeFigures | None) -> None:
        """Count the evidence in a reading of the counters and the probes so far."""
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
        raise analysis_failed(self.step, RolloutVerdict.FAILED, tuple(self.evaluations), None)

    def evaluate(
        self, previous: Figures, current: Figures, probes: ProbeFigures | None, elapsed: float
    ) -> Figures:
        """Judge the window from ``previous`` to ``current`` (and the probes so far), and
        say where the next window starts: here, unless this reading was not fresh."""
        spec = self.spec
        fresh = self.fresh(current)
        # The window starts at a reading with no series of the new versions (counting could
        # not start at READY, and the source had not scraped them when the analysis began:
        # Prometheus just restarted, under load): the first reading that shows them starts
        # the count, shown, not counted. Else that first window had no data and, with
        # inconclusiveLimit 0, ended a good version inconclusive (a clean-clone CI run).
        first_sighting = (
            fresh
            and previous.error is None
            and previous.success is None
            and current.success is not None
        )
        if first_sighting and (self.origin is None or self.origin.success is None):
            self.origin = current  # the evidence and the early abort count from here too
        self.unreadable = (
            self.unreadable or current.error is not None or current.scrape_failed is not None
        )
        if self.baseline.memory_bytes is None and current.memory_bytes is not None:
            # The first reading had no memory figure (a failed scrape, or Triton not yet
            # sampling): measure growth from the first reading that has one.
            self.baseline = replace(self.baseline, memory_bytes=current.memory_bytes)
        window = probes.since(self._probes_at_last) if probes else None
        self._probes_at_last = probes or ProbeFigures()
        self.saw(current, probes)
        settled = probes.since(self.probes_after_volley) if probes is not None else None
        old_now = self._old_now()
        self.evaluations.append(
            evaluate(
                spec,
                len(self.evaluations),
                elapsed,
                previous,
                current,
                replace(
                    self.baseline,
                    same_time_latency_us=(
                        same_time_latency(self.old_start, old_now) if old_now else None
                    ),
                ),
                window,
                counted=elapsed >= spec.initial_delay and fresh and not first_sighting,
                # Latency over everything since the analysis began, not the window:
                # one noisy second on a busy host is not a slower version.
                latency_from=self.latency_from,
                pinned=settled if self.pinned_only else None,
                pinned_why=self.probes_judge or PINNED,
                uneven=self._uneven(current, old_now),
                latency_probes=settled,
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
        if first_sighting and (self.latency_from is None or self.latency_from.success is None):
            self.latency_from = current  # latency too counts from the first sighting
        return current if fresh else previous

    def verdict(
        self, elapsed: float, current: Figures, probes: ProbeFigures | None
    ) -> RolloutVerdict:
        """PASSED, or RUNNING while the analysis goes on; else the error it ends with."""
        # A first deployment has nothing to go back to: judged by its evaluations alone.
        evidence = self.evidence + self.evidence_before if self.replaces else None
        verdict = concluded(self.spec, tuple(self.evaluations), elapsed, self.unreadable, evidence)
        if verdict is RolloutVerdict.PASSED and self.shadow is not None:
            verdict = self._compared_enough(elapsed) or verdict
        if verdict in (RolloutVerdict.PASSED, RolloutVerdict.RUNNING):
            return verdict
        raise analysis_failed(
            self.step,
            verdict,
            tuple(self.evaluations),
            current.error,
            evidence,
            self.evidence_before,
            probes,
        )

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

    def _old_now(self) -> Figures | None:
        """The old versions' counters now, for a latency check's baseline over the same time
        (``same_time_latency``) and the load they carried meanwhile (``_uneven``)."""
        if self.old_source is None or self.old_start is None or not self.step.baseline:
            return None
        if not any(c.kind == "latency" for c in self.spec.checks):
            return None
        return self.old_source.figures(self.step.model, self.step.baseline)

    def _uneven(self, current: Figures, old_now: Figures | None) -> str | None:
        """Why a streaming model's probes of new and old do not compare since the analysis
        began (``core.latency.uneven_load``): the new versions carry the clients' streams,
        the old ones beside them do not (after a blue-green switch, a canary's server at a
        large share, in place under load). Unary probes are not held behind a client's
        request for long: the counters judge such versions."""
        if self.probes_judge != STREAMED or old_now is None or self.old_start is None:
            return None
        start = self.latency_from or self.origin
        new = since_ready(start, current) if start is not None else None
        old = since_ready(self.old_start, old_now)
        return uneven_load(sum(new) if new else None, sum(old) if old else None)


def analysis_failed(
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
