"""Live shadow traffic judged as analysis checks (issue 31): the comparator's figures so far
(``model.shadow.ShadowFigures``) become the checks ``shadow`` (answers: the candidate's
disagreement beyond the noise) and ``shadow-latency`` (the quantile ``latencyQuantile`` of the
interleaved calls), and decide whether an analysis that is otherwise over may pass: not
before ``minRequests`` were compared; short of them, it waits up to ``maxWait`` or fails, as
``whenShort`` says. Pure: figures in, check results and verdicts out.
"""

from __future__ import annotations

from reconciler.core.comparison import discounted, divergences, judged, unjudgeable
from reconciler.model.analysis import CheckResult, RolloutVerdict, Verdict
from reconciler.model.shadow import LiveShadow, ShadowFigures, WhenShort

ANSWERS, LATENCY = "shadow", "shadow-latency"


def shadow_checks(spec: LiveShadow, figures: ShadowFigures) -> tuple[CheckResult, ...]:
    """The comparison's checks at one evaluation (cumulative since the phase began). Before
    ``minRequests`` are compared they are SKIPPED (shown, never counted either way)."""
    comparison = figures.comparison
    budget = 1.0 - spec.min_agreement
    threshold = f"disagreement beyond the noise <= {budget:.2%} of >= {spec.min_requests}"
    short = comparison.requests < spec.min_requests
    net = discounted(comparison, spec.tolerance)
    excess = net.excess
    rates = (
        f"candidate {comparison.candidate_count} of {comparison.requests}, serving version "
        f"with itself {comparison.noise_count}"
    )
    if net.learned:
        rates = (
            f"beyond the serving version's own noise: candidate {net.candidate_count} of "
            f"{net.requests}, serving version with itself {net.noise_count} ({net}); at the "
            f"declared tolerance: {rates}"
        )
    if comparison.streamed and (where := divergences(comparison)):
        rates += f"; {where}"  # generations: where they first diverged, both sides
    if short:
        answers = CheckResult(
            ANSWERS,
            Verdict.SKIPPED,
            excess if comparison.requests else None,
            threshold,
            f"waiting: {figures}; {rates}",
        )
    elif why := judged(comparison, spec.min_agreement, tolerance=spec.tolerance):
        answers = CheckResult(ANSWERS, Verdict.FAIL, excess, threshold, why)
    elif why := unjudgeable(comparison, spec.tolerance):
        # Never a pass: counted as an evaluation without data (inconclusiveLimit).
        answers = CheckResult(
            ANSWERS, Verdict.NO_DATA, excess, threshold, f"inconclusive: {why}; {rates}"
        )
    else:
        answers = CheckResult(ANSWERS, Verdict.PASS, excess, threshold, f"{rates}; {figures}")
    results = [answers]
    if spec.max_latency_increase is not None:
        results.append(_latency(spec, figures, short))
    return tuple(results)


def _latency(spec: LiveShadow, figures: ShadowFigures, short: bool) -> CheckResult:
    comparison = figures.comparison
    quantiles = comparison.latency()
    old, new = quantiles[spec.latency_quantile]
    increase = new / old - 1 if old and new is not None else None
    threshold = f"{spec.latency_quantile} increase <= {spec.max_latency_increase}"
    shown = ", ".join(
        f"{q} {_ms(p)} vs {_ms(c)}" for q, (p, c) in quantiles.items()
    )  # the candidate's against the primary's
    detail = f"candidate vs serving version, calls interleaved: {shown}"
    if short or increase is None:
        return CheckResult(LATENCY, Verdict.SKIPPED, increase, threshold, f"waiting: {detail}")
    why = judged(comparison, 0.0, spec.max_latency_increase, spec.latency_quantile)
    return CheckResult(
        LATENCY, Verdict.FAIL if why else Verdict.PASS, increase, threshold, why or detail
    )


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.2f}ms"


def short_of_requests(
    spec: LiveShadow, figures: ShadowFigures, elapsed: float, duration: float
) -> RolloutVerdict | None:
    """An analysis otherwise passed at ``elapsed`` (past ``duration``): None when the
    comparison compared enough; RUNNING while it may still wait for them; else FAILED
    (``whenShort: fail``) or INCONCLUSIVE (waited ``maxWait`` in vain), METRICS_UNAVAILABLE
    when nothing reached the comparator at all: nothing is known against the versions, so
    they are put back but not held."""
    if figures.compared >= spec.min_requests:
        return None
    if spec.when_short is WhenShort.FAIL:
        return RolloutVerdict.FAILED
    if elapsed < duration + spec.max_wait:
        return RolloutVerdict.RUNNING
    if not figures.received:
        return RolloutVerdict.METRICS_UNAVAILABLE
    return RolloutVerdict.INCONCLUSIVE


def short_message(spec: LiveShadow, figures: ShadowFigures, elapsed: float) -> str:
    """Why a shadow phase ended short, and what to look at."""
    hint = (
        "nothing was mirrored to the comparator: can the router reach it (Router "
        "spec.comparator, the comparator's --comparator-listen)?"
        if not figures.received
        else "raise shadow.share or shadow.rate, or lower shadow.minRequests"
    )
    return (
        f"the comparator compared {figures.compared} of the {spec.min_requests} mirrored "
        f"request(s) shadow.minRequests asks for in {elapsed:.0f}s ({figures}; shadow.whenShort "
        f"{spec.when_short}): {hint}"
    )
