"""Post-swap analysis: metric figures in, verdicts out. Pure: no HTTP, no clock.

After a swap, the new versions are watched for ``duration``; every ``interval`` the metric
adapter (``adapters/metrics.py``, scraping Triton directly or querying Prometheus) hands over
cumulative ``Figures``, and ``evaluate`` turns the difference between two of them into an
``Evaluation``: one ``CheckResult`` per check with its value, threshold and verdict. ``judge``
turns the evaluations so far into a ``RolloutVerdict``.

The success rate is what clients see, from two sources judged side by side: Triton's own
counters (which miss a Python model's error *responses*: Triton 2.51 counts those a success,
server#7713) and the reconciler's probes (``ProbeFigures``: its own requests pinned to the new
versions, which see error responses, missing outputs and wrong outputs, but only for the
requests they send). The check's value is the lower of the two rates; each must reach ``min``.

Verdicts are explicit: NaN, a missing series, a counter that went backwards or no baseline
give ``no-data`` (never a crash, never a silent pass); a window with no requests gives
``no-traffic``, which the deployment's ``noTraffic`` policy turns into a pass, a failure or an
evaluation that does not count (``wait``). A rollout passes only when its time is up, every
counted evaluation passed but at most ``failureLimit`` failed and ``inconclusiveLimit`` had
no data, at least one passed, and at least ``minEvidence`` requests or probes reached the new
versions; it fails as soon as one evaluation too many fails, or at once on an early abort
(``early_abort``: a run of failed probes, or a success rate since READY that is below the
check's min with the configured confidence). An analysis that cannot pass is
``inconclusive``, which the reconciler treats as a failure (the old versions serve again).
Evaluations within ``initialDelay`` of READY are kept and shown but not counted.
"""

from __future__ import annotations

import math
from statistics import NormalDist

from reconciler.core.latency import (
    BETWEEN_RESPONSES,
    PINNED,
    between_responses_check,
    latency_check,
    pinned_latency_check,
)
from reconciler.core.readings import delta, finite, routed_since
from reconciler.model.analysis import (
    AnalysisSpec,
    Baseline,
    Check,
    CheckResult,
    Evaluation,
    Figures,
    NoTraffic,
    ProbeFigures,
    RolloutVerdict,
    Verdict,
)

# Fewer requests than this since READY are too few for the early abort's rate rule (a run of
# failed probes still aborts).
EARLY_ABORT_MIN_REQUESTS = 10
# An analysis whose evaluations all passed but whose evidence is short at the end of its
# duration goes on for at most this share of its duration more, until minEvidence is reached.
EVIDENCE_EXTENSION = 1.0
# What a memory check's detail says when the figure is the host's (a CPU server's).
HOST_WIDE = "the host's memory in use (nv_cpu_memory_used_bytes: every process on the host)"


def _success_rate(
    check: Check,
    counters: tuple[float, float] | str,
    probes: ProbeFigures | None,
    routed: tuple[float, float] | None = None,
) -> CheckResult:
    """Triton's counters (successes, failures; or why they cannot be read), the probes and,
    in a traffic rollout, the router's statistics for the new pool (``routed``) side by
    side: the lower rate is the value, and each source with requests must reach ``min``.
    With counters that cannot be read, failing probes or routed requests fail the check and
    passing ones leave it without data."""
    threshold = f">= {check.min:g}"
    minimum = check.min if check.min is not None else 0.0
    rates: list[float] = []
    details: list[str] = []
    if isinstance(counters, str):
        details.append(f"triton: {counters}")
    elif sum(counters) > 0:
        success, failure = counters
        rates.append(success / (success + failure))
        details.append(f"triton: {int(failure)} of {int(success + failure)} requests failed")
    if probes is not None and probes.sent > 0:
        rates.append((probes.sent - probes.failed) / probes.sent)
        details.append(f"probes: {probes.failed} of {probes.sent} failed")
    if routed is not None and sum(routed) > 0:
        rates.append(routed[0] / sum(routed))
        details.append(f"router: {int(routed[1])} of {int(sum(routed))} client requests failed")
    if not rates:
        if isinstance(counters, str):
            return CheckResult(check.name, Verdict.NO_DATA, None, threshold, counters)
        return CheckResult(check.name, Verdict.NO_TRAFFIC, None, threshold, "no requests")
    failing = any(rate < minimum for rate in rates)
    if isinstance(counters, str) and not failing:
        # Probes that pass are not enough: the counters see what the probes do not send.
        return CheckResult(check.name, Verdict.NO_DATA, min(rates), threshold, "; ".join(details))
    verdict = Verdict.FAIL if failing else Verdict.PASS
    return CheckResult(check.name, verdict, min(rates), threshold, "; ".join(details))


def _memory(check: Check, now: Figures, baseline: Baseline, pending: bool = False) -> CheckResult:
    """The server's memory growth since the analysis began (old and new versions loaded).
    A GPU figure is the server's devices'; a CPU figure is the host's
    (``nv_cpu_memory_used_bytes`` counts every process on it, a neighbour's start
    among them: 632-909 MB in 3 s when another test file started its servers), so a host
    growth beyond the bound waits for the next evaluation (``pending`` there) and fails only
    when that one measures it again: a verdict about the version, not the machine."""
    threshold = f"growth <= {check.max_increase_bytes:g} bytes"
    memory = finite(now.memory_bytes)
    if memory is None or baseline.memory_bytes is None:
        return CheckResult(check.name, Verdict.NO_DATA, None, threshold, "no memory figures")
    growth = memory - baseline.memory_bytes
    limit = check.max_increase_bytes if check.max_increase_bytes is not None else math.inf
    if growth <= limit:
        return CheckResult(check.name, Verdict.PASS, growth, threshold)
    if not now.memory_host_wide:
        return CheckResult(check.name, Verdict.FAIL, growth, threshold, "the GPU memory in use")
    if not pending:
        return CheckResult(
            check.name,
            Verdict.SKIPPED,
            growth,
            threshold,
            f"{HOST_WIDE}: the next evaluation confirms it or not",
        )
    return CheckResult(
        check.name, Verdict.FAIL, growth, threshold, f"{HOST_WIDE}, measured twice in a row"
    )


def _query(check: Check, value: float | None) -> CheckResult:
    bounds = [f">= {check.min:g}"] if check.min is not None else []
    bounds += [f"<= {check.max:g}"] if check.max is not None else []
    threshold = " and ".join(bounds) or "any value"
    value = finite(value)
    if value is None:
        return CheckResult(check.name, Verdict.NO_DATA, None, threshold, "query gave no number")
    ok = (check.min is None or value >= check.min) and (check.max is None or value <= check.max)
    return CheckResult(check.name, Verdict.PASS if ok else Verdict.FAIL, value, threshold)


def _bound(check: Check) -> str:
    return {
        "successRate": f">= {check.min}",
        "latency": f"increase <= {check.max_increase}",
        "memory": f"growth <= {check.max_increase_bytes} bytes",
    }.get(check.kind, "promql")


def evaluate(
    spec: AnalysisSpec,
    index: int,
    at: float,
    previous: Figures,
    current: Figures,
    baseline: Baseline,
    probes: ProbeFigures | None = None,
    counted: bool = True,
    latency_from: Figures | None = None,
    pinned: ProbeFigures | None = None,
    pinned_why: str = PINNED,
    uneven: str | None = None,
    latency_probes: ProbeFigures | None = None,
    latency_pending: bool = False,
    memory_pending: bool = False,
    judged_elsewhere: tuple[CheckResult, ...] = (),
) -> Evaluation:
    """Judge the new versions over the window between two figures (and the probes sent in
    it). ``counted``: False for an evaluation within ``initialDelay``. ``latency_from``: where
    the latency window starts when not at ``previous``: the engine passes the analysis's
    start, so latency is the mean since then (failures count from READY and per window; a
    fresh version's cold first requests, the first probes among them, are not its steady
    latency, and one noisy second is not a slower version). ``pinned``: the probes so far,
    when the new versions see only version-pinned requests, or stream: latency is judged by
    them (``pinned_why`` says which); ``uneven``: why those probes of new and old do not
    compare (``core.latency.uneven_load``), for the time to the first response.
    ``latency_probes``: the probes since the first volley, which must confirm a latency
    increase measured on the counters; ``latency_pending``:
    the evaluation before measured an increase the probes could not confirm yet (a second
    one in a row fails the check; on the counters, only once ``at`` is past the duration);
    ``memory_pending``: the evaluation before measured a growth of the host's memory beyond
    the bound (a second one in a row fails the check). ``judged_elsewhere``: checks judged
    from another source (a shadow phase's comparison, ``core/shadow.py``), joined as they
    are."""
    success = delta(previous.success, current.success)
    # Before the first failure Triton has no failure series: absent on both sides is zero.
    failure = (
        0.0
        if previous.failure is None and current.failure is None
        else delta(previous.failure or 0.0, current.failure)
    )
    duration = delta(previous.duration_us, current.duration_us)
    unread = current.error or current.scrape_failed or previous.error
    counters: tuple[float, float] | str = (
        unread
        if unread
        else "no success counter"
        if success is None
        # A series absent before and after is zero failures (above); None here is a counter
        # that vanished, went backwards or is not a number.
        else "no failure counter"
        if failure is None
        else (success, failure)
    )
    routed = routed_since(previous, current)
    latency_window = (duration, success)
    if latency_from is not None:
        latency_window = (
            delta(latency_from.duration_us, current.duration_us),
            delta(latency_from.success, current.success),
        )
    results: list[CheckResult] = []
    for check in spec.checks:
        if check.kind == "successRate":
            results.append(_success_rate(check, counters, probes, routed))
        elif unread:
            results.append(CheckResult(check.name, Verdict.NO_DATA, None, _bound(check), unread))
        elif check.kind == "latency" and check.of == BETWEEN_RESPONSES:
            results.append(
                between_responses_check(
                    check, pinned, baseline.has_old, latency_pending, at < spec.duration
                )
            )
        elif check.kind == "latency" and pinned is not None:
            results.append(
                pinned_latency_check(
                    check, pinned, pinned_why, latency_pending, at < spec.duration, uneven
                )
            )
        elif check.kind == "latency":
            results.append(
                latency_check(
                    check,
                    *latency_window,
                    baseline,
                    latency_probes,
                    latency_pending,
                    probes_due=at < spec.duration,
                )
            )
        elif check.kind == "memory":
            results.append(_memory(check, current, baseline, memory_pending))
        else:
            results.append(_query(check, current.queries.get(check.name)))
    results.extend(judged_elsewhere)
    verdicts = {r.verdict for r in results}
    if Verdict.FAIL in verdicts:
        verdict = Verdict.FAIL
    elif Verdict.NO_DATA in verdicts:
        verdict = Verdict.NO_DATA
    elif Verdict.NO_TRAFFIC in verdicts:
        verdict = {
            NoTraffic.PASS: Verdict.PASS,
            NoTraffic.FAIL: Verdict.FAIL,
            NoTraffic.WAIT: Verdict.NO_TRAFFIC,
        }[spec.no_traffic]
    else:
        verdict = Verdict.PASS
    return Evaluation(index, at, tuple(results), verdict, probes=probes, counted=counted)


def judge(
    spec: AnalysisSpec,
    evaluations: tuple[Evaluation, ...],
    elapsed: float,
    evidence: float | None = None,
) -> RolloutVerdict:
    """The rollout's verdict after ``evaluations``, ``elapsed`` seconds into the analysis;
    ``evidence``: the requests or probes that reached the new versions since READY (None:
    not known, not required). Short of evidence at the end of ``duration``, an analysis whose
    evaluations passed runs on (RUNNING) for up to EVIDENCE_EXTENSION of its duration more."""
    if any(e.aborted for e in evaluations):
        return RolloutVerdict.FAILED
    counted = [e for e in evaluations if e.counted]
    if sum(e.verdict is Verdict.FAIL for e in counted) > spec.failure_limit:
        return RolloutVerdict.FAILED
    if sum(e.verdict is Verdict.NO_DATA for e in counted) > spec.inconclusive_limit:
        return RolloutVerdict.INCONCLUSIVE
    if elapsed < spec.duration:
        return RolloutVerdict.RUNNING
    extended = elapsed < spec.duration * (1 + EVIDENCE_EXTENSION)
    if counted and awaiting_probes(counted[-1]) and extended:
        # A latency check judged by the probes alone has not had enough of them yet (a
        # streaming model's long generations, paced by maxShare): watched on for at most
        # another ``duration``, then passed with the check shown skipped. Ending it
        # inconclusive instead reverted every good canary of a streaming model at its
        # no-traffic phase, one interval long (bench.streaming, 20 of 20); so did ending it
        # for want of a passed evaluation when that interval's window held no counted probe
        # yet (its first volley left out, a rollback's probes each after a wake-up).
        return RolloutVerdict.RUNNING
    if not any(e.verdict is Verdict.PASS for e in counted):
        return RolloutVerdict.INCONCLUSIVE
    if unconfirmed(spec, counted[-1]) and extended:
        # The last evaluation measured a latency increase or a host memory growth beyond
        # the bound that waits for confirmation: the next one confirms it (a failure) or
        # not, never the clock.
        return RolloutVerdict.RUNNING
    if evidence is not None and evidence < spec.min_evidence:
        # Every evaluation passed but too few requests reached the new versions: a slow
        # model's probes, or a quiet hour's clients, may need longer. Watched on, evaluation
        # by evaluation, for at most another ``duration`` (EVIDENCE_EXTENSION).
        return RolloutVerdict.RUNNING if extended else RolloutVerdict.INCONCLUSIVE
    return RolloutVerdict.PASSED


def concluded(
    spec: AnalysisSpec,
    evaluations: tuple[Evaluation, ...],
    elapsed: float,
    unreadable: bool,
    evidence: float | None = None,
) -> RolloutVerdict:
    """``judge``'s verdict, with an inconclusive end during which a metrics reading failed
    (``unreadable``) told apart as METRICS_UNAVAILABLE: nothing is known against the new
    versions then, so they are put back but not held."""
    verdict = judge(spec, evaluations, elapsed, evidence)
    if verdict is RolloutVerdict.INCONCLUSIVE and unreadable:
        return RolloutVerdict.METRICS_UNAVAILABLE
    return verdict


def awaiting_probes(evaluation: Evaluation) -> tuple[CheckResult, ...]:
    """The checks of ``evaluation`` skipped until their probes are enough."""
    return tuple(r for r in evaluation.results if r.awaiting)


def unconfirmed(
    spec: AnalysisSpec, evaluation: Evaluation, kinds: tuple[str, ...] = ("latency", "memory")
) -> bool:
    """Whether ``evaluation`` measured a latency increase or a host memory growth (checks of
    ``kinds``) beyond the bound that waits for confirmation (the check was skipped, with the
    increase as its value); the next evaluation is told so."""
    waiting = {c.name for c in spec.checks if c.kind in kinds}
    return any(
        r.check in waiting and r.verdict is Verdict.SKIPPED and r.value is not None
        for r in evaluation.results
    )


def probe_capacity(spec: AnalysisSpec, probes: ProbeFigures | None) -> str:
    """What the probes alone could send in ``spec.duration`` at the pace they were kept to,
    for a message that says why too little evidence reached the new versions: a probe slot
    waits ``took / maxShare`` between probes (and at least ``1 / rate``), so a model slower
    than ``duration * maxShare / minEvidence`` cannot pass on probes alone. Empty when the
    probes tell nothing (none sent, or they were not the limit)."""
    if probes is None or probes.sent <= 0 or not spec.probes.enabled:
        return ""
    took = probes.seconds / probes.sent
    if took <= 0:
        return ""
    cycle = max(1.0 / spec.probes.rate, took / spec.probes.max_share)
    most = spec.duration * spec.probes.concurrency / cycle
    if most >= spec.min_evidence:
        return ""
    return (
        f"; a probe took {took * 1e3:.0f}ms, so at probes.maxShare {spec.probes.max_share:g} "
        f"the probes alone reach about {most:.0f} in {spec.duration:g}s: with no client "
        "traffic, raise duration or probes.maxShare, or lower minEvidence"
    )


def wilson_upper(successes: float, total: float, confidence: float) -> float:
    """The upper end of the Wilson score interval for a success rate: with ``confidence``,
    the true rate is at most this (one-sided)."""
    z = NormalDist().inv_cdf(confidence)
    p = successes / total
    centre = p + z * z / (2 * total)
    spread = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total))
    return min(1.0, (centre + spread) / (1 + z * z / total))


def early_abort(
    spec: AnalysisSpec,
    since_ready: tuple[float, float] | None,
    probes: ProbeFigures | None,
    routed: tuple[float, float] | None = None,
) -> CheckResult | None:
    """Why the analysis must fail now, before its interval is up, or None.

    ``since_ready``: Triton's (successes, failures) on the new versions since they became
    READY (None: not readable now); ``probes``: the probes so far; ``routed``: in a traffic
    rollout, the router's (OK, failed) client requests to the new pool since the phase
    began. Two rules: a run of ``consecutive_probe_failures`` failed probes; and, for each
    successRate check, a source (counters, probes or the router) with at least
    ``EARLY_ABORT_MIN_REQUESTS`` requests whose success rate is below ``min`` even at the
    upper end of its Wilson interval at the configured confidence: a version failing 40% of
    30 requests is not given the rest of the interval, while a good version's rare failure
    is (one failure in 20 keeps the bound above 0.99).
    The rate rule acts only with ``failureLimit: 0``.
    """
    rule = spec.early_abort
    # A run of failed probes aborts whatever the failureLimit: such a version fails its
    # clients now.
    if probes is not None and probes.consecutive >= rule.consecutive_probe_failures:
        detail = f"early abort: {probes.consecutive} probes in a row failed" + (
            f", last: {probes.last_error}" if probes.last_error else ""
        )
        # Reported under the success-rate check when there is one: it is what clients see.
        rate = next((c for c in spec.checks if c.kind == "successRate"), None)
        if rate is not None and rate.min is not None:
            return CheckResult(
                rate.name,
                Verdict.FAIL,
                (probes.sent - probes.failed) / probes.sent,
                f">= {rate.min:g}",
                detail,
            )
        return CheckResult(
            "probes",
            Verdict.FAIL,
            float(probes.consecutive),
            f"< {rule.consecutive_probe_failures} failed in a row",
            detail,
        )
    if rule.confidence <= 0 or spec.failure_limit > 0:
        # A deployment that tolerates failed evaluations tolerates a bad stretch: the rate
        # rule would judge an interval before it ends, so it is left to the evaluations.
        return None
    sources: list[tuple[str, float, float]] = []
    if since_ready is not None:
        sources.append(("triton", since_ready[0], since_ready[1]))
    if probes is not None:
        sources.append(("probes", float(probes.sent - probes.failed), float(probes.failed)))
    if routed is not None:
        sources.append(("router", routed[0], routed[1]))
    for check in spec.checks:
        if check.kind != "successRate" or check.min is None:
            continue
        for source, ok, failed in sources:
            total = ok + failed
            if total < EARLY_ABORT_MIN_REQUESTS or failed <= 0:
                continue
            upper = wilson_upper(ok, total, rule.confidence)
            if upper < check.min:
                return CheckResult(
                    check.name,
                    Verdict.FAIL,
                    ok / total,
                    f">= {check.min:g}",
                    f"early abort: {source}: {int(failed)} of {int(total)} requests failed "
                    f"since READY; at {rule.confidence:g} confidence the rate is at most "
                    f"{upper:.3f}",
                )
    return None
