"""Post-swap analysis: metric figures in, verdicts out. Pure: no HTTP, no clock.

After a swap, the new versions are watched for ``duration``; every ``interval`` the metric
adapter (``adapters/metrics.py``, scraping Triton directly or querying Prometheus) hands over
cumulative ``Figures``, and ``evaluate`` turns the difference between two of them into an
``Evaluation``: one ``CheckResult`` per check with its value, threshold and verdict. ``judge``
turns the evaluations so far into a ``RolloutVerdict``.

Verdicts are explicit: NaN, a missing series, a counter that went backwards or no baseline
give ``no-data`` (never a crash, never a silent pass); a window with no requests gives
``no-traffic``, which the deployment's ``noTraffic`` policy turns into a pass, a failure or an
evaluation that does not count (``wait``). A rollout passes only when its time is up, at least
one evaluation counted, and no more than ``failureLimit`` evaluations failed; it fails as soon
as one evaluation too many fails; with nothing counted at the end it is ``inconclusive``,
which the reconciler treats as a failure (the old versions serve again).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from reconciler.model.analysis import (
    AnalysisSpec,
    Baseline,
    Check,
    CheckResult,
    Evaluation,
    Figures,
    NoTraffic,
    RolloutVerdict,
    Verdict,
)


def pooled(readings: Sequence[Figures]) -> Figures:
    """Several servers' figures for the same versions as one: counters summed over the
    servers that could be read (a server that could not be read is left out; all unread is
    the first error). Memory and queries are per server, so none."""
    read = [f for f in readings if f.error is None]
    if not read:
        return Figures(error=readings[0].error if readings else "no server to read")

    def total(values: Sequence[float | None]) -> float | None:
        known = [v for v in values if v is not None and math.isfinite(v)]
        return sum(known) if known else None

    return Figures(
        success=total([f.success for f in read]),
        failure=total([f.failure for f in read]),
        duration_us=total([f.duration_us for f in read]),
        pending=total([f.pending for f in read]),
        inferences=total([f.inferences for f in read]),
    )


def baseline_from(old: Figures | None, at_start: Figures) -> Baseline:
    """The old versions' cumulative mean latency, and the memory as analysis begins.

    ``old`` is None when no old versions served (a first deployment).
    """
    if old is None:
        return Baseline(None, _finite(at_start.memory_bytes), has_old=False)
    return Baseline(_ratio(old.duration_us, old.success), _finite(at_start.memory_bytes))


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    numerator, denominator = _finite(numerator), _finite(denominator)
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def _delta(before: float | None, after: float | None) -> float | None:
    before, after = _finite(before), _finite(after)
    if before is None or after is None or after < before:  # absent, or counters were reset
        return None
    return after - before


def _success_rate(check: Check, success: float | None, failure: float | None) -> CheckResult:
    threshold = f">= {check.min:g}"
    if success is None:
        return CheckResult(check.name, Verdict.NO_DATA, None, threshold, "no success counter")
    if failure is None:
        # evaluate() already counts a series absent before and after as zero failures; None
        # here is a counter that vanished, went backwards or is not a number.
        return CheckResult(check.name, Verdict.NO_DATA, None, threshold, "no failure counter")
    total = success + failure
    if total == 0:
        return CheckResult(check.name, Verdict.NO_TRAFFIC, None, threshold, "no requests")
    rate = success / total
    verdict = Verdict.PASS if check.min is None or rate >= check.min else Verdict.FAIL
    return CheckResult(
        check.name, verdict, rate, threshold, f"{int(failure)} of {int(total)} requests failed"
    )


def _latency(
    check: Check, duration: float | None, success: float | None, baseline: Baseline
) -> CheckResult:
    threshold = f"increase <= {check.max_increase:g}"
    if not baseline.has_old:
        return CheckResult(check.name, Verdict.SKIPPED, None, threshold, "no old versions")
    if success is not None and success == 0:
        return CheckResult(check.name, Verdict.NO_TRAFFIC, None, threshold, "no requests")
    mean = _ratio(duration, success)
    if mean is None:
        return CheckResult(check.name, Verdict.NO_DATA, None, threshold, "no latency figures")
    if baseline.mean_latency_us is None:
        return CheckResult(
            check.name, Verdict.NO_DATA, None, threshold, "no baseline from the old versions"
        )
    if baseline.mean_latency_us <= 0:
        # Counters that say the old versions answered in 0 us give no ratio to judge by.
        return CheckResult(
            check.name, Verdict.NO_DATA, None, threshold, "the old versions' latency reads 0us"
        )
    increase = mean / baseline.mean_latency_us - 1.0
    limit = check.max_increase if check.max_increase is not None else math.inf
    return CheckResult(
        check.name,
        Verdict.PASS if increase <= limit else Verdict.FAIL,
        increase,
        threshold,
        f"mean {mean:.0f}us vs {baseline.mean_latency_us:.0f}us before",
    )


def _memory(check: Check, now: float | None, baseline: Baseline) -> CheckResult:
    threshold = f"growth <= {check.max_increase_bytes:g} bytes"
    now = _finite(now)
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
    value = _finite(value)
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
) -> Evaluation:
    """Judge the new versions over the window between two figures."""
    success = _delta(previous.success, current.success)
    # Before the first failure Triton has no failure series: absent on both sides is zero.
    failure = (
        0.0
        if previous.failure is None and current.failure is None
        else _delta(previous.failure or 0.0, current.failure)
    )
    duration = _delta(previous.duration_us, current.duration_us)
    results: list[CheckResult] = []
    for check in spec.checks:
        if current.error or previous.error:
            why = current.error or previous.error or ""
            results.append(CheckResult(check.name, Verdict.NO_DATA, None, _bound(check), why))
            continue
        if check.kind == "successRate":
            results.append(_success_rate(check, success, failure))
        elif check.kind == "latency":
            results.append(_latency(check, duration, success, baseline))
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
    return Evaluation(index, at, tuple(results), verdict)


def judge(
    spec: AnalysisSpec, evaluations: tuple[Evaluation, ...], elapsed: float
) -> RolloutVerdict:
    """The rollout's verdict after ``evaluations``, ``elapsed`` seconds into the analysis."""
    failures = sum(e.verdict is Verdict.FAIL for e in evaluations)
    if failures > spec.failure_limit:
        return RolloutVerdict.FAILED
    if elapsed < spec.duration:
        return RolloutVerdict.RUNNING
    if any(e.verdict is Verdict.PASS for e in evaluations):
        return RolloutVerdict.PASSED
    return RolloutVerdict.INCONCLUSIVE


def concluded(
    spec: AnalysisSpec, evaluations: tuple[Evaluation, ...], elapsed: float, unreadable: bool
) -> RolloutVerdict:
    """``judge``'s verdict, with an inconclusive end during which a metrics reading failed
    (``unreadable``) told apart as METRICS_UNAVAILABLE: nothing is known against the new
    versions then, so they are put back but not held."""
    verdict = judge(spec, evaluations, elapsed)
    if verdict is RolloutVerdict.INCONCLUSIVE and unreadable:
        return RolloutVerdict.METRICS_UNAVAILABLE
    return verdict
