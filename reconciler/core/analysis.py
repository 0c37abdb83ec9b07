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
from dataclasses import replace
from statistics import NormalDist, median

from reconciler.core.readings import delta, finite, ratio, routed_since
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
# Requests the new versions must answer in a window for their mean latency to be judged
# (fewer: the probes judge it, new against old, or it waits).
LATENCY_MIN_REQUESTS = 20
# Requests the old versions must answer over an evaluation's time for their mean over that
# time to be the latency baseline (fewer: their mean before the swap).
SAME_TIME_MIN_REQUESTS = 20
# Probes each side, new and old, before new versions that see only pinned requests are
# judged slower or not by them.
PINNED_LATENCY_MIN_PROBES = 5
# A latency increase on the counters that a second evaluation measures again waits for the
# probes (while the duration lasts) only up to this many times the bound: a canary's server
# at a small share read a good version +52% to +67% against the busy stable pool (an idle
# Python stub woken per request, bench.false_verdicts runs 1, 2 and 4), while a version
# three times slower reads +200% and clients wait on it meanwhile.
UNCONFIRMED_WAIT_MAX = 2.0


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


def same_time_latency(
    start: Figures | None, now: Figures | None, at_least: float = SAME_TIME_MIN_REQUESTS
) -> float | None:
    """The old versions' mean latency (us) between two readings of them, when at least
    ``at_least`` requests were answered in between: a baseline taken in the conditions the
    new versions are judged in (a busy machine slows both). None otherwise."""
    if start is None or now is None or start.error or now.error:
        return None
    success = delta(start.success, now.success)
    if success is None or success < at_least:
        return None
    return ratio(delta(start.duration_us, now.duration_us), success)


def _latency(
    check: Check,
    duration: float | None,
    success: float | None,
    baseline: Baseline,
    probes: ProbeFigures | None = None,
    pending: bool = False,
    probes_due: bool = False,
) -> CheckResult:
    """The new versions' mean latency against the old versions': over the same time when
    the old ones served enough requests meanwhile (``Baseline.same_time_latency_us``), else
    their mean before the swap. An increase beyond the bound must be confirmed by the probes
    when there are enough of them (``probes``: new and old versions on the same server,
    probed interleaved at the same pace, so both meet the same machine): a busy host slows
    every version, and a lightly loaded server answers a fast model slower than a busy one
    (a canary at 10% against the stable pool: +52% for a good version, measured); a verdict
    must be about the version. While the analysis's duration lasts (``probes_due``) probes on
    their way are waited for even when the evaluation before measured the increase too
    (``pending``): two readings of the counters share the same idle-versus-busy bias (a good
    canary at 10%: +67%, then +53%, false_verdicts run 4). After it, or beyond
    UNCONFIRMED_WAIT_MAX times the bound, a second unconfirmed increase in a row fails."""
    threshold = f"increase <= {check.max_increase:g}"
    if not baseline.has_old:
        return CheckResult(check.name, Verdict.SKIPPED, None, threshold, "no old versions")
    if success is not None and success == 0:
        return CheckResult(check.name, Verdict.NO_TRAFFIC, None, threshold, "no requests")
    mean = ratio(duration, success)
    if mean is None:
        return CheckResult(check.name, Verdict.NO_DATA, None, threshold, "no latency figures")
    if success is not None and success < LATENCY_MIN_REQUESTS:
        # A handful of requests, probes among them, on an instance that takes no client
        # traffic yet (a canary at no traffic, a small share) is no mean to hold against
        # warm client traffic: its first answers are cold. The probes, sent to the new and
        # the old versions interleaved, judge it when they are enough; else it waits.
        if probes is not None and _probe_medians(probes) is not None:
            return _pinned_latency(
                check,
                probes,
                f"only {success:.0f} request(s) on the counters: judged by the probes",
                pending,
                probes_due,
            )
        return CheckResult(
            check.name,
            Verdict.SKIPPED,
            None,
            threshold,
            f"too few requests yet ({success:.0f}; {LATENCY_MIN_REQUESTS} needed, or "
            f"{PINNED_LATENCY_MIN_PROBES} probes each of new and old)",
        )
    same_time = baseline.same_time_latency_us
    reference = same_time if same_time is not None else baseline.mean_latency_us
    if reference is None:
        return CheckResult(
            check.name, Verdict.NO_DATA, None, threshold, "no baseline from the old versions"
        )
    if reference <= 0:
        # Counters that say the old versions answered in 0 us give no ratio to judge by.
        return CheckResult(
            check.name, Verdict.NO_DATA, None, threshold, "the old versions' latency reads 0us"
        )
    increase = mean / reference - 1.0
    limit = check.max_increase if check.max_increase is not None else math.inf
    when = "meanwhile" if same_time is not None else "before"
    detail = f"mean {mean:.0f}us vs {reference:.0f}us {when}"
    if increase <= limit:
        return CheckResult(check.name, Verdict.PASS, increase, threshold, detail)
    if probes is None:
        return CheckResult(check.name, Verdict.FAIL, increase, threshold, detail)
    return _increase_asked_of_the_probes(
        CheckResult(check.name, Verdict.FAIL, increase, threshold, detail),
        limit,
        probes,
        pending,
        probes_due,
    )


def _increase_asked_of_the_probes(
    failed: CheckResult,
    limit: float,
    probes: ProbeFigures,
    pending: bool,
    probes_due: bool,
) -> CheckResult:
    """An increase beyond the bound on the counters (``failed``), as the probes judge it:
    refuted (a pass with the probes' figure), confirmed, on its way (skipped, with the
    counters' figure, while the duration lasts or when it is the first), or a failure."""
    increase, detail = failed.value, failed.detail
    assert increase is not None
    probed = _probed_increase(probes)
    if probed is not None and probed <= limit:
        return replace(
            failed,
            verdict=Verdict.PASS,
            value=probed,
            detail=f"{detail} (+{increase:.0%}), not confirmed by the probes: new and old "
            f"probed at the same time differ by {probed:+.0%} (a busy machine, not the version)",
        )
    if probed is not None:
        detail += f"; the probes agree: {probed:+.0%} against the old version meanwhile"
    elif probes.sent > 0 and (
        not pending or (probes_due and increase <= UNCONFIRMED_WAIT_MAX * limit)
    ):
        # The probes are on their way but too few yet to confirm or refute: the counters
        # alone do not revert (a canary's first second at 10%: +66% for a good version,
        # measured); a later evaluation has more probes, or, once the duration is over (or
        # for an increase far beyond what an idle server reads), the next one confirms it by
        # itself (a model slow enough that its probes come seconds apart).
        return replace(
            failed,
            verdict=Verdict.SKIPPED,
            detail=f"{detail} (+{increase:.0%}), to be confirmed by the probes ({probes.sent} "
            f"new, {probes.old_sent} old; {PINNED_LATENCY_MIN_PROBES} each needed)",
        )
    elif pending:
        detail += "; the evaluation before measured it too"
    return replace(failed, detail=detail)


def _probed_increase(probes: ProbeFigures) -> float | None:
    """The new versions' median probe latency over the old version's, probed interleaved;
    None with fewer than PINNED_LATENCY_MIN_PROBES each side (``_probe_medians``)."""
    medians = _probe_medians(probes)
    return None if medians is None or medians[1] <= 0 else medians[0] / medians[1] - 1.0


def _probe_medians(probes: ProbeFigures) -> tuple[float, float] | None:
    """The median probe latency of the new versions and of the old one, in seconds; None
    with fewer than PINNED_LATENCY_MIN_PROBES each side. Medians, not means: a handful of
    probes, one of them stalled by the scheduler, is no mean (on a 2-core host with both
    cores held by a busy loop, probes of a 1.5 ms model had a 90th percentile of 5 ms, so
    one such probe among 5 to the old version moved its mean by half and a good version
    read +50% to +152%: bench.false_verdicts); a slower version is slower on most requests,
    which moves the median as much as the mean (the counters, where clients reach the new
    versions, keep judging the mean)."""
    if min(len(probes.latencies), len(probes.old_latencies)) < PINNED_LATENCY_MIN_PROBES:
        return None
    return median(probes.latencies), median(probes.old_latencies)


def _pinned_latency(
    check: Check,
    probes: ProbeFigures,
    why: str = "the new versions see only pinned requests",
    pending: bool = False,
    probes_due: bool = False,
) -> CheckResult:
    """The new versions against the old, both by the probes: for new versions that see only
    version-pinned requests (lower than the old, which keep the unversioned traffic), whose
    counters would compare an idle instance with a busy one. An increase beyond the bound
    waits while the analysis's duration lasts (``probes_due``), and fails when it is over and
    the evaluation before measured one too (``pending``): the new versions take few or no
    clients' requests, so waiting costs little, and a reading of a few probes of an instance
    woken for them is the noisiest the analysis takes (good versions read +47% and +51%
    against a +50% bound after 2 s, with a CPU burner: bench.false_verdicts runs 3 and 5);
    the medians over the whole duration judge on the most probes. An increase beyond
    UNCONFIRMED_WAIT_MAX times the bound is no idle instance's: the second reading fails it
    (a version so slow that it answers only a few of its clients' requests is judged here)."""
    threshold = f"increase <= {check.max_increase:g}"
    medians = _probe_medians(probes)
    if medians is None:
        # One slow wake-up among a handful of probes is not a slower version: wait for more.
        return CheckResult(
            check.name, Verdict.SKIPPED, None, threshold,
            f"too few probes yet ({probes.sent} new, {probes.old_sent} old; "
            f"{PINNED_LATENCY_MIN_PROBES} each needed)",
        )  # fmt: skip
    new, old = medians
    if old <= 0:
        return CheckResult(
            check.name, Verdict.NO_DATA, None, threshold, "the old version's probes read 0ms"
        )
    increase = new / old - 1.0
    limit = check.max_increase if check.max_increase is not None else math.inf
    detail = f"probes: median {new * 1e3:.2f}ms vs {old * 1e3:.2f}ms on the old version ({why})"
    if increase <= limit:
        return CheckResult(check.name, Verdict.PASS, increase, threshold, detail)
    waits = probes_due and increase <= UNCONFIRMED_WAIT_MAX * limit
    if pending and not waits:
        return CheckResult(
            check.name, Verdict.FAIL, increase, threshold,
            f"{detail}; the evaluation before measured it too",
        )  # fmt: skip
    when = "at the end of the analysis's duration" if waits else "by the next evaluation"
    return CheckResult(
        check.name, Verdict.SKIPPED, increase, threshold,
        f"{detail} (+{increase:.0%}), to be confirmed {when}",
    )  # fmt: skip


def _memory(check: Check, now: float | None, baseline: Baseline) -> CheckResult:
    threshold = f"growth <= {check.max_increase_bytes:g} bytes"
    now = finite(now)
    if now is None or baseline.memory_bytes is None:
        return CheckResult(check.name, Verdict.NO_DATA, None, threshold, "no memory figures")
    growth = now - baseline.memory_bytes
    limit = check.max_increase_bytes if check.max_increase_bytes is not None else math.inf
    verdict = Verdict.PASS if growth <= limit else Verdict.FAIL
    return CheckResult(check.name, verdict, growth, threshold)


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
    latency_probes: ProbeFigures | None = None,
    latency_pending: bool = False,
) -> Evaluation:
    """Judge the new versions over the window between two figures (and the probes sent in
    it). ``counted``: False for an evaluation within ``initialDelay``. ``latency_from``: where
    the latency window starts when not at ``previous``: the engine passes the analysis's
    start, so latency is the mean since then (failures count from READY and per window; a
    fresh version's cold first requests, the first probes among them, are not its steady
    latency, and one noisy second is not a slower version). ``pinned``: the probes so far,
    when the new versions see only version-pinned requests: latency is judged by them.
    ``latency_probes``: the probes since the first volley, which must confirm a latency
    increase measured on the counters; ``latency_pending``:
    the evaluation before measured an increase the probes could not confirm yet (a second
    one in a row fails the check; on the counters, only once ``at`` is past the duration)."""
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
        elif check.kind == "latency" and pinned is not None:
            results.append(
                _pinned_latency(
                    check, pinned, pending=latency_pending, probes_due=at < spec.duration
                )
            )
        elif check.kind == "latency":
            results.append(
                _latency(
                    check,
                    *latency_window,
                    baseline,
                    latency_probes,
                    latency_pending,
                    probes_due=at < spec.duration,
                )
            )
        elif check.kind == "memory":
            results.append(_memory(check, current.memory_bytes, baseline))
        else:
            results.append(_query(check, current.queries.get(check.name)))
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
    if not any(e.verdict is Verdict.PASS for e in counted):
        return RolloutVerdict.INCONCLUSIVE
    if latency_unconfirmed(spec, counted[-1]) and elapsed < spec.duration * (
        1 + EVIDENCE_EXTENSION
    ):
        # The last evaluation measured a latency increase beyond the bound that waits for
        # confirmation: the next one confirms it (a failure) or not, never the clock.
        return RolloutVerdict.RUNNING
    if evidence is not None and evidence < spec.min_evidence:
        # Every evaluation passed but too few requests reached the new versions: a slow
        # model's probes, or a quiet hour's clients, may need longer. Watched on, evaluation
        # by evaluation, for at most another ``duration`` (EVIDENCE_EXTENSION).
        if elapsed < spec.duration * (1 + EVIDENCE_EXTENSION):
            return RolloutVerdict.RUNNING
        return RolloutVerdict.INCONCLUSIVE
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


def latency_unconfirmed(spec: AnalysisSpec, evaluation: Evaluation) -> bool:
    """Whether ``evaluation`` measured a latency increase beyond the bound that the probes
    could not confirm or refute yet (``_latency`` waited: skipped, with the increase as its
    value); the next evaluation is told so."""
    latency = {c.name for c in spec.checks if c.kind == "latency"}
    return any(
        r.check in latency and r.verdict is Verdict.SKIPPED and r.value is not None
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
