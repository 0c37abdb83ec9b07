"""analysis: figures in, verdicts out. Every check kind at its bounds, every way to get no data,
the noTraffic policy, and judge's rollout verdicts; then one invariant under Hypothesis."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.core.analysis import (
    evaluate,
    judge,
    probe_capacity,
    unconfirmed,
)
from reconciler.core.latency import same_time_latency
from reconciler.core.readings import baseline_from, pooled
from reconciler.model.analysis import (
    AnalysisSpec,
    Baseline,
    Check,
    CheckResult,
    Evaluation,
    Figures,
    NoTraffic,
    ProbeFigures,
    ProbeSpec,
    RolloutVerdict,
    Verdict,
)
from tests.core.fakes import timed_probes

SUCCESS_RATE = Check("success-rate", "successRate", min=0.99)
LATENCY = Check("latency", "latency", max_increase=0.5)
MEMORY = Check("memory", "memory", max_increase_bytes=1000)
KPI = Check("kpi", "promql", min=10, max=20, query="sum(rate(kpi_total[1m]))")
ALL_CHECKS = (SUCCESS_RATE, LATENCY, MEMORY, KPI)

# The old versions answered in 100us on average; the server used 10 000 bytes at the start.
BASELINE = Baseline(mean_latency_us=100.0, memory_bytes=10_000.0)
START = Figures(success=1000.0, failure=10.0, duration_us=50_000.0, memory_bytes=10_000.0)


def spec(
    *checks: Check,
    no_traffic: NoTraffic = NoTraffic.WAIT,
    failure_limit: int = 0,
    duration: float = 60.0,
) -> AnalysisSpec:
    return AnalysisSpec(5.0, duration, failure_limit, no_traffic, checks or ALL_CHECKS)


def window(
    successes: float = 100.0,
    failures: float = 0.0,
    mean_us: float = 100.0,
    memory_growth: float = 0.0,
    kpi: float | None = 15.0,
) -> Figures:
    """The reading one interval after START, with these requests in between."""
    assert START.success is not None and START.failure is not None
    assert START.duration_us is not None and START.memory_bytes is not None
    return Figures(
        success=START.success + successes,
        failure=START.failure + failures,
        duration_us=START.duration_us + successes * mean_us,
        memory_bytes=START.memory_bytes + memory_growth,
        queries={"kpi": kpi},
    )


def check_result(
    check: Check,
    current: Figures,
    previous: Figures = START,
    baseline: Baseline = BASELINE,
    no_traffic: NoTraffic = NoTraffic.WAIT,
) -> CheckResult:
    (result,) = evaluate(
        spec(check, no_traffic=no_traffic), 0, 5.0, previous, current, baseline
    ).results
    return result


# -- each check kind at its threshold --------------------------------------------------------


@pytest.mark.parametrize(
    ("successes", "failures", "verdict", "rate"),
    [
        (100, 0, Verdict.PASS, 1.0),
        (99, 1, Verdict.PASS, 0.99),  # exactly the minimum passes
        (98, 2, Verdict.FAIL, 0.98),
        (0, 5, Verdict.FAIL, 0.0),  # every request failed
    ],
)
def test_success_rate_is_judged_over_the_window(
    successes: int, failures: int, verdict: Verdict, rate: float
) -> None:
    result = check_result(SUCCESS_RATE, window(successes, failures))

    assert result.verdict is verdict
    assert result.value == pytest.approx(rate)
    assert result.threshold == ">= 0.99"
    # Counted over the window, not over the cumulative counters (1000 ok, 10 failed before).
    assert result.detail == f"triton: {failures} of {successes + failures} requests failed"


def test_a_check_result_renders_value_threshold_verdict_and_detail() -> None:
    result = check_result(SUCCESS_RATE, window(98, 2))

    assert str(result) == "success-rate=0.98 (>= 0.99): fail, triton: 2 of 100 requests failed"
    assert (
        str(CheckResult("kpi", Verdict.NO_DATA, None, "any value"))
        == "kpi=n/a (any value): no-data"
    )


@pytest.mark.parametrize(
    ("mean_us", "verdict", "increase"),
    [
        (100.0, Verdict.PASS, 0.0),
        (150.0, Verdict.PASS, 0.5),  # exactly the allowed increase passes
        (151.0, Verdict.FAIL, 0.51),
        (50.0, Verdict.PASS, -0.5),  # faster is fine
    ],
)
def test_latency_compares_the_windows_mean_with_the_old_versions(
    mean_us: float, verdict: Verdict, increase: float
) -> None:
    result = check_result(LATENCY, window(mean_us=mean_us))

    assert result.verdict is verdict
    assert result.value == pytest.approx(increase)
    assert result.threshold == "increase <= 0.5"
    assert result.detail == f"mean {mean_us:.0f}us vs 100us before"


def latency_with_probes(
    mean_us: float, probes: ProbeFigures, baseline: Baseline = BASELINE
) -> CheckResult:
    (result,) = evaluate(
        spec(LATENCY), 0, 5.0, START, window(mean_us=mean_us), baseline, latency_probes=probes
    ).results
    return result


def test_latency_is_judged_against_the_old_versions_meanwhile_when_they_served() -> None:
    # A busy machine: the new version's 280us against 100us before the swap is +180%, but the
    # old pool answered in 250us over the same time: +12%, a pass.
    busy = replace(BASELINE, same_time_latency_us=250.0)
    result = check_result(LATENCY, window(mean_us=280.0), baseline=busy)
    assert (result.verdict, result.detail) == (Verdict.PASS, "mean 280us vs 250us meanwhile")
    assert result.value == pytest.approx(0.12)
    # A slower version is slower than the old meanwhile too.
    slow = check_result(LATENCY, window(mean_us=800.0), baseline=busy)
    assert slow.verdict is Verdict.FAIL and slow.value == pytest.approx(2.2)


def test_a_latency_increase_against_before_the_swap_must_be_confirmed_by_the_probes() -> None:
    # +200% on the counters against before the swap, while new and old probed at the same
    # time answer alike: the machine got busy, not the version.
    alike = timed_probes([0.003] * 40, [0.003] * 10)
    result = latency_with_probes(300.0, alike)
    assert result.verdict is Verdict.PASS, result
    assert "not confirmed by the probes" in result.detail and "+200%" in result.detail
    # A version three times slower is slower in the probes too: confirmed, failed.
    slower = timed_probes([0.009] * 40, [0.003] * 10)
    failed = latency_with_probes(300.0, slower)
    assert failed.verdict is Verdict.FAIL and failed.value == pytest.approx(2.0)
    assert "the probes agree: +200%" in failed.detail
    # Too few old probes yet to compare with: the check waits for them.
    few = timed_probes([0.003] * 40, [0.003] * 4)
    waiting = latency_with_probes(300.0, few)
    assert waiting.verdict is Verdict.SKIPPED, waiting
    assert "to be confirmed by the probes (40 new, 4 old; 5 each needed)" in waiting.detail
    # While the duration lasts, a second evaluation in a row on the counters still waits for
    # the probes on their way: both readings share the idle-versus-busy bias of a canary's
    # server at a small share (a good canary: +67%, then +53%; false_verdicts run 4).
    (still,) = evaluate(
        spec(LATENCY), 1, 10.0, START, window(mean_us=167.0), BASELINE,
        latency_probes=few, latency_pending=True,
    ).results  # fmt: skip
    assert still.verdict is Verdict.SKIPPED, still
    assert "to be confirmed by the probes" in still.detail
    # Not for an increase far beyond what an idle server reads (+200% against +50%): clients
    # wait on it meanwhile, and the second reading fails it.
    (far,) = evaluate(
        spec(LATENCY), 1, 10.0, START, window(mean_us=300.0), BASELINE,
        latency_probes=few, latency_pending=True,
    ).results  # fmt: skip
    assert far.verdict is Verdict.FAIL and "the evaluation before measured it too" in far.detail
    # Past the duration, a second evaluation in a row measuring it confirms it by itself: a
    # model slow enough that its probes come seconds apart (100x slower: 1 probe in 8 s) is
    # still caught, one evaluation after the duration.
    (again,) = evaluate(
        spec(LATENCY), 13, 65.0, START, window(mean_us=300.0), BASELINE,
        latency_probes=few, latency_pending=True,
    ).results  # fmt: skip
    assert again.verdict is Verdict.FAIL and "the evaluation before measured it too" in again.detail
    assert unconfirmed(spec(LATENCY), Evaluation(0, 5.0, (waiting,), Verdict.PASS))
    assert not unconfirmed(spec(LATENCY), Evaluation(1, 10.0, (again,), Verdict.FAIL))
    # No probe sent at all (probes on, none could be made): the counters alone decide.
    assert latency_with_probes(300.0, ProbeFigures()).verdict is Verdict.FAIL
    # Against the old pool meanwhile too: a canary's server at a small share answers a fast
    # model slower than the busy stable pool; the probes on the canary compare like with like.
    meanwhile = replace(BASELINE, same_time_latency_us=100.0)
    assert latency_with_probes(300.0, alike, meanwhile).verdict is Verdict.PASS
    assert latency_with_probes(300.0, slower, meanwhile).verdict is Verdict.FAIL


def test_the_old_versions_latency_meanwhile_needs_enough_requests() -> None:
    later = replace(START, success=START.success + 20, duration_us=START.duration_us + 20 * 300)
    assert same_time_latency(START, later) == pytest.approx(300.0)
    fewer = replace(START, success=START.success + 19, duration_us=START.duration_us + 19 * 300)
    assert same_time_latency(START, fewer) is None
    assert same_time_latency(None, later) is None
    assert same_time_latency(START, replace(later, error="refused")) is None


def test_probe_capacity_says_when_probes_alone_cannot_reach_min_evidence() -> None:
    analysis = replace(spec(SUCCESS_RATE, duration=10.0), min_evidence=10)
    slow = ProbeFigures(sent=6, seconds=6 * 0.1)
    text = probe_capacity(analysis, slow)
    assert "a probe took 100ms" in text and "reach about 5 in 10s" in text, text
    assert probe_capacity(analysis, ProbeFigures(sent=6, seconds=6 * 0.001)) == ""
    assert probe_capacity(analysis, None) == ""
    off = replace(analysis, probes=ProbeSpec(enabled=False))
    assert probe_capacity(off, slow) == ""


@pytest.mark.parametrize(
    ("growth", "verdict"),
    [(0.0, Verdict.PASS), (1000.0, Verdict.PASS), (1001.0, Verdict.FAIL), (-4000.0, Verdict.PASS)],
)
def test_memory_growth_is_measured_from_the_start_of_the_analysis(
    growth: float, verdict: Verdict
) -> None:
    # The previous reading does not matter: growth is against the baseline taken at the start.
    previous = replace(START, memory_bytes=50_000.0)

    result = check_result(MEMORY, window(memory_growth=growth), previous=previous)

    assert (result.verdict, result.value) == (verdict, growth)
    assert result.threshold == "growth <= 1000 bytes"


@pytest.mark.parametrize(
    ("check", "value", "verdict"),
    [
        (KPI, 10.0, Verdict.PASS),  # both bounds are inclusive
        (KPI, 20.0, Verdict.PASS),
        (KPI, 9.99, Verdict.FAIL),
        (KPI, 20.01, Verdict.FAIL),
        (replace(KPI, max=None), 1e9, Verdict.PASS),
        (replace(KPI, max=None), 9.0, Verdict.FAIL),
        (replace(KPI, min=None), -5.0, Verdict.PASS),
        (replace(KPI, min=None), 21.0, Verdict.FAIL),
    ],
)
def test_a_promql_check_holds_its_value_within_min_and_max(
    check: Check, value: float, verdict: Verdict
) -> None:
    result = check_result(check, window(kpi=value))

    assert (result.verdict, result.value) == (verdict, value)


@pytest.mark.parametrize(
    ("check", "threshold"),
    [
        (KPI, ">= 10 and <= 20"),
        (replace(KPI, max=None), ">= 10"),
        (replace(KPI, min=None), "<= 20"),
        (replace(KPI, min=None, max=None), "any value"),
    ],
)
def test_a_promql_checks_threshold_names_its_bounds(check: Check, threshold: str) -> None:
    assert check_result(check, window()).threshold == threshold


# -- no data: never a crash, never a pass ----------------------------------------------------

NAN, INF = math.nan, math.inf


@pytest.mark.parametrize(
    ("check", "current", "baseline", "detail"),
    [
        (SUCCESS_RATE, replace(window(), success=NAN), BASELINE, "no success counter"),
        (SUCCESS_RATE, replace(window(), success=INF), BASELINE, "no success counter"),
        (SUCCESS_RATE, replace(window(), success=None), BASELINE, "no success counter"),
        (SUCCESS_RATE, replace(window(), success=500.0), BASELINE, "no success counter"),
        (LATENCY, replace(window(), duration_us=NAN), BASELINE, "no latency figures"),
        (LATENCY, replace(window(), duration_us=None), BASELINE, "no latency figures"),
        (LATENCY, replace(window(), duration_us=1.0), BASELINE, "no latency figures"),
        (LATENCY, replace(window(), success=-INF), BASELINE, "no latency figures"),
        (
            LATENCY,
            window(),
            Baseline(None, 10_000.0),
            "no baseline from the old versions",
        ),
        (LATENCY, window(), Baseline(0.0, 10_000.0), "the old versions' latency reads 0us"),
        (MEMORY, replace(window(), memory_bytes=NAN), BASELINE, "no memory figures"),
        (MEMORY, replace(window(), memory_bytes=INF), BASELINE, "no memory figures"),
        (MEMORY, replace(window(), memory_bytes=None), BASELINE, "no memory figures"),
        (MEMORY, window(), Baseline(100.0, None), "no memory figures"),
        (KPI, window(kpi=NAN), BASELINE, "query gave no number"),
        (KPI, window(kpi=-INF), BASELINE, "query gave no number"),
        (KPI, window(kpi=None), BASELINE, "query gave no number"),
        (KPI, replace(window(), queries={}), BASELINE, "query gave no number"),
    ],
    ids=[
        "success-nan",
        "success-inf",
        "success-absent",
        "success-went-backwards",
        "duration-nan",
        "duration-absent",
        "duration-went-backwards",
        "success-minus-inf",
        "no-latency-baseline",
        "zero-latency-baseline",
        "memory-nan",
        "memory-inf",
        "memory-absent",
        "no-memory-baseline",
        "query-nan",
        "query-minus-inf",
        "query-none",
        "query-missing",
    ],
)
def test_figures_that_are_not_numbers_give_no_data(
    check: Check, current: Figures, baseline: Baseline, detail: str
) -> None:
    evaluation = evaluate(spec(check), 0, 5.0, START, current, baseline)

    (result,) = evaluation.results
    assert (result.verdict, result.value, result.detail) == (Verdict.NO_DATA, None, detail)
    assert evaluation.verdict is Verdict.NO_DATA


def test_a_nan_previous_reading_gives_no_data_too() -> None:
    previous = Figures(success=NAN, failure=NAN, duration_us=NAN, memory_bytes=NAN)

    evaluation = evaluate(spec(SUCCESS_RATE, LATENCY), 0, 5.0, previous, window(), BASELINE)

    assert [r.verdict for r in evaluation.results] == [Verdict.NO_DATA, Verdict.NO_DATA]


@pytest.mark.parametrize(
    "failure",
    [NAN, INF, 3.0, None],
    ids=["nan", "inf", "went-backwards", "vanished"],
)
def test_a_failure_counter_that_cannot_be_read_gives_no_data(failure: float | None) -> None:
    # START counted 10 failures; the new reading has no usable failure figure.
    current = replace(window(99, 1), failure=failure)

    result = check_result(SUCCESS_RATE, current)

    assert result.verdict is Verdict.NO_DATA


def test_the_failure_series_absent_on_both_sides_counts_as_zero_failures() -> None:
    # Triton exports nv_inference_request_failure only once a request has failed.
    previous = replace(START, failure=None)
    current = replace(window(50), failure=None)

    result = check_result(SUCCESS_RATE, current, previous=previous)

    assert (result.verdict, result.value) == (Verdict.PASS, 1.0)
    assert result.detail == "triton: 0 of 50 requests failed"


def test_a_failure_series_that_appears_counts_every_failure_in_it() -> None:
    previous = replace(START, failure=None)
    current = replace(window(97), failure=3.0)

    result = check_result(SUCCESS_RATE, current, previous=previous)

    assert result.verdict is Verdict.FAIL
    assert result.value == pytest.approx(0.97)
    assert result.detail == "triton: 3 of 100 requests failed"


@pytest.mark.parametrize("side", ["current", "previous", "both"])
def test_figures_with_an_error_give_no_data_for_every_check(side: str) -> None:
    broken = "server s1: metrics at http://s1:8002/metrics: connection refused"
    current = replace(window(), error=broken) if side in ("current", "both") else window()
    previous = replace(START, error=broken) if side in ("previous", "both") else START

    evaluation = evaluate(spec(), 3, 20.0, previous, current, BASELINE)

    assert [(r.check, r.verdict, r.value, r.detail) for r in evaluation.results] == [
        (c.name, Verdict.NO_DATA, None, broken) for c in ALL_CHECKS
    ]
    assert (evaluation.verdict, evaluation.index, evaluation.at) == (Verdict.NO_DATA, 3, 20.0)


def test_an_error_wins_over_a_skipped_latency_check() -> None:
    first_deploy = Baseline(None, 10_000.0, has_old=False)
    current = replace(window(), error="scrape timed out")

    result = check_result(LATENCY, current, baseline=first_deploy)

    assert (result.verdict, result.detail) == (Verdict.NO_DATA, "scrape timed out")


# -- no traffic ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "verdict"),
    [
        (NoTraffic.WAIT, Verdict.NO_TRAFFIC),
        (NoTraffic.PASS, Verdict.PASS),
        (NoTraffic.FAIL, Verdict.FAIL),
    ],
)
def test_a_window_without_requests_counts_as_the_no_traffic_policy_says(
    policy: NoTraffic, verdict: Verdict
) -> None:
    idle = window(successes=0, failures=0)

    evaluation = evaluate(
        spec(SUCCESS_RATE, LATENCY, MEMORY, KPI, no_traffic=policy), 0, 5.0, START, idle, BASELINE
    )

    assert [(r.check, r.verdict) for r in evaluation.results] == [
        ("success-rate", Verdict.NO_TRAFFIC),
        ("latency", Verdict.NO_TRAFFIC),
        ("memory", Verdict.PASS),
        ("kpi", Verdict.PASS),
    ]
    assert evaluation.results[0].detail == "no requests"
    assert evaluation.verdict is verdict
    assert evaluation.failed == ()  # the policy judges the evaluation, not the checks


@pytest.mark.parametrize("policy", list(NoTraffic))
def test_no_traffic_never_hides_a_failing_or_unreadable_check(policy: NoTraffic) -> None:
    idle = window(successes=0)

    failing = evaluate(
        spec(SUCCESS_RATE, MEMORY, no_traffic=policy),
        0,
        5.0,
        START,
        replace(idle, memory_bytes=1e9),
        BASELINE,
    )
    unreadable = evaluate(
        spec(SUCCESS_RATE, KPI, no_traffic=policy), 0, 5.0, START, window(0, kpi=NAN), BASELINE
    )

    assert failing.verdict is Verdict.FAIL
    assert [r.check for r in failing.failed] == ["memory"]
    assert unreadable.verdict is Verdict.NO_DATA


# -- baseline and first deployments ----------------------------------------------------------


def test_the_baseline_is_the_old_versions_mean_and_the_memory_at_the_start() -> None:
    old = Figures(success=400.0, failure=3.0, duration_us=80_000.0)

    assert baseline_from(old, START) == Baseline(200.0, 10_000.0, has_old=True)
    assert baseline_from(old, replace(START, memory_bytes=NAN)) == Baseline(200.0, None)
    # Old versions that never answered a request give no baseline, not a division by zero.
    assert baseline_from(replace(old, success=0.0), START) == Baseline(None, 10_000.0)
    assert baseline_from(Figures(error="down"), START) == Baseline(None, 10_000.0)


def test_latency_is_skipped_without_old_versions_and_the_rest_still_counts() -> None:
    first_deploy = baseline_from(None, START)
    assert first_deploy == Baseline(None, 10_000.0, has_old=False)

    evaluation = evaluate(
        spec(SUCCESS_RATE, LATENCY, MEMORY), 0, 5.0, START, window(mean_us=10_000), first_deploy
    )

    assert [(r.check, r.verdict) for r in evaluation.results] == [
        ("success-rate", Verdict.PASS),
        ("latency", Verdict.SKIPPED),
        ("memory", Verdict.PASS),
    ]
    assert evaluation.results[1].detail == "no old versions"
    assert evaluation.verdict is Verdict.PASS


def test_a_failing_check_is_listed_by_the_evaluation() -> None:
    evaluation = evaluate(spec(), 0, 5.0, START, window(98, 2, mean_us=300.0), BASELINE)

    assert evaluation.verdict is Verdict.FAIL
    assert [r.check for r in evaluation.failed] == ["success-rate", "latency"]


# -- judge -----------------------------------------------------------------------------------


def ev(verdict: Verdict, index: int = 0) -> Evaluation:
    return Evaluation(index, 5.0 * (index + 1), (), verdict)


def evs(*verdicts: Verdict) -> tuple[Evaluation, ...]:
    return tuple(ev(v, i) for i, v in enumerate(verdicts))


P, F, N, W = Verdict.PASS, Verdict.FAIL, Verdict.NO_DATA, Verdict.NO_TRAFFIC


@pytest.mark.parametrize(
    ("limit", "verdicts", "elapsed", "expected"),
    [
        (0, (F,), 5.0, RolloutVerdict.FAILED),  # at once, long before the duration
        (0, (P, P, F), 15.0, RolloutVerdict.FAILED),
        (1, (F,), 5.0, RolloutVerdict.RUNNING),  # one failure tolerated
        (1, (F, P, F), 15.0, RolloutVerdict.FAILED),
        (2, (F, F, F), 15.0, RolloutVerdict.FAILED),
        (0, (F,), 60.0, RolloutVerdict.FAILED),  # failing beats passing at the end
        (0, (), 0.0, RolloutVerdict.RUNNING),
        (0, (P, P), 10.0, RolloutVerdict.RUNNING),
        (0, (P,), 59.999, RolloutVerdict.RUNNING),
        (0, (P,), 60.0, RolloutVerdict.PASSED),  # the end of the duration is inclusive
        (0, (W, P, W), 60.0, RolloutVerdict.PASSED),  # windows without traffic do not count
        # Every counted evaluation must pass: one without data is one more than
        # inconclusiveLimit (0) allows, at once (test_judge_tolerates_...).
        (0, (N, W, P), 60.0, RolloutVerdict.INCONCLUSIVE),
        (0, (P, N), 10.0, RolloutVerdict.INCONCLUSIVE),
        (1, (F, P), 60.0, RolloutVerdict.PASSED),  # within the failure limit
        (0, (N, N, N), 60.0, RolloutVerdict.INCONCLUSIVE),
        (0, (W, W, W), 60.0, RolloutVerdict.INCONCLUSIVE),
        (0, (N, W), 65.0, RolloutVerdict.INCONCLUSIVE),
        (1, (F,), 60.0, RolloutVerdict.INCONCLUSIVE),  # a tolerated failure is no pass
        (0, (), 60.0, RolloutVerdict.INCONCLUSIVE),
    ],
)
def test_judge(
    limit: int, verdicts: tuple[Verdict, ...], elapsed: float, expected: RolloutVerdict
) -> None:
    assert judge(spec(failure_limit=limit), evs(*verdicts), elapsed) is expected


@pytest.mark.parametrize(
    ("limit", "verdicts", "elapsed", "expected"),
    [
        (1, (N,), 5.0, RolloutVerdict.RUNNING),
        (1, (N, P, P), 60.0, RolloutVerdict.PASSED),
        (1, (N, N), 10.0, RolloutVerdict.INCONCLUSIVE),  # one more than the limit, at once
        (2, (N, N), 60.0, RolloutVerdict.INCONCLUSIVE),  # nothing passed
    ],
)
def test_judge_tolerates_evaluations_without_data_up_to_the_inconclusive_limit(
    limit: int, verdicts: tuple[Verdict, ...], elapsed: float, expected: RolloutVerdict
) -> None:
    tolerant = replace(spec(), inconclusive_limit=limit)
    assert judge(tolerant, evs(*verdicts), elapsed) is expected


def test_judge_passes_only_with_the_minimum_evidence() -> None:
    needs = replace(spec(), min_evidence=50)
    # Short of evidence at the end of the duration: watched on, for one duration more.
    assert judge(needs, evs(P, P), 60.0, evidence=49) is RolloutVerdict.RUNNING
    assert judge(needs, evs(P, P), 119.9, evidence=49) is RolloutVerdict.RUNNING
    assert judge(needs, evs(P, P), 120.0, evidence=49) is RolloutVerdict.INCONCLUSIVE
    assert judge(needs, evs(P, P), 60.0, evidence=50) is RolloutVerdict.PASSED
    assert judge(needs, evs(P, P), 90.0, evidence=50) is RolloutVerdict.PASSED
    assert judge(needs, evs(P), 30.0, evidence=0) is RolloutVerdict.RUNNING  # not yet the end
    assert judge(needs, evs(F), 5.0, evidence=0) is RolloutVerdict.FAILED  # failing needs none


def test_a_latency_increase_awaiting_confirmation_at_the_end_gets_one_more_evaluation() -> None:
    """An increase the last evaluation measured but could not confirm yet is decided by the
    next evaluation, never by the clock: the end of ``duration`` neither passes it unseen nor
    fails it unconfirmed (the extension bounds the wait)."""
    unconfirmed = CheckResult("latency", Verdict.SKIPPED, 1.2, "increase <= 0.5", "waits")
    waiting = replace(ev(P, 11), results=(unconfirmed,))
    confirmed = replace(ev(F, 12), results=(replace(unconfirmed, verdict=Verdict.FAIL),))
    passes = (*evs(*[P] * 11), waiting)

    assert judge(spec(), passes, 60.0) is RolloutVerdict.RUNNING
    assert judge(spec(), (*passes, confirmed), 65.0) is RolloutVerdict.FAILED
    assert judge(spec(), (*passes, ev(P, 12)), 65.0) is RolloutVerdict.PASSED
    assert judge(spec(), passes, 120.0) is RolloutVerdict.PASSED  # the extension is spent


def test_evaluations_within_the_initial_delay_are_kept_but_not_counted() -> None:
    warm = (
        replace(ev(F, 0), counted=False),
        replace(ev(N, 1), counted=False),
        ev(P, 2),
    )
    assert judge(spec(), warm, 60.0) is RolloutVerdict.PASSED
    assert judge(spec(), warm[:2], 60.0) is RolloutVerdict.INCONCLUSIVE  # nothing counted


def test_an_aborted_evaluation_fails_the_rollout_whatever_the_failure_limit() -> None:
    aborted = replace(ev(F, 0), aborted=True)
    assert judge(spec(failure_limit=5), (aborted,), 1.0) is RolloutVerdict.FAILED


def test_judge_counts_a_no_traffic_window_as_failed_under_the_fail_policy() -> None:
    strict = spec(SUCCESS_RATE, no_traffic=NoTraffic.FAIL)
    idle = evaluate(strict, 0, 5.0, START, window(0), BASELINE)

    assert judge(strict, (idle,), 5.0) is RolloutVerdict.FAILED


# -- invariant -------------------------------------------------------------------------------

numbers = st.one_of(
    st.none(),
    st.sampled_from([NAN, INF, -INF, 0.0]),
    st.floats(min_value=-1e6, max_value=1e12, allow_nan=False),
)
figures = st.builds(
    Figures,
    success=numbers,
    failure=numbers,
    duration_us=numbers,
    memory_bytes=numbers,
    queries=st.fixed_dictionaries({"kpi": numbers}),
    error=st.sampled_from([None, None, None, "connection refused"]),
)
baselines = st.builds(Baseline, numbers, numbers, st.booleans())
specs = st.builds(
    AnalysisSpec,
    interval=st.just(5.0),
    duration=st.just(60.0),
    failure_limit=st.integers(0, 2),
    no_traffic=st.sampled_from(NoTraffic),
    checks=st.lists(st.sampled_from(ALL_CHECKS), min_size=1, max_size=4, unique=True).map(tuple),
)


@settings(max_examples=400, deadline=None)
@given(specs, figures, figures, baselines)
def test_an_evaluation_with_no_data_or_a_failure_never_passes(
    analysis: AnalysisSpec, previous: Figures, current: Figures, baseline: Baseline
) -> None:
    evaluation = evaluate(analysis, 0, 5.0, previous, current, baseline)

    assert len(evaluation.results) == len(analysis.checks)
    if any(r.verdict in (Verdict.NO_DATA, Verdict.FAIL) for r in evaluation.results):
        assert evaluation.verdict is not Verdict.PASS
    if previous.error or current.error:
        assert {r.verdict for r in evaluation.results} == {Verdict.NO_DATA}


def test_pooled_figures_sum_the_servers_that_answered() -> None:
    together = pooled(
        [
            Figures(success=1.0, duration_us=10.0, memory_bytes=5.0),
            Figures(error="s2: no answer"),
            Figures(success=2.0, failure=1.0, duration_us=20.0, memory_bytes=7.0),
        ]
    )
    assert (together.success, together.failure, together.duration_us) == (3.0, 1.0, 30.0)
    assert together.memory_bytes is None and together.error is None  # memory is per server
    assert pooled([Figures(error="a"), Figures(error="b")]).error == "a"


def test_a_host_memory_growth_beyond_the_bound_fails_only_when_measured_twice_in_a_row() -> None:
    # A CPU server's memory figure is the host's: a neighbour that starts (another server, a
    # test file loading models) moves it for a while. The version is failed on it only when
    # the next evaluation measures the growth again.
    host = replace(window(memory_growth=5000.0), memory_host_wide=True)
    first = evaluate(spec(MEMORY), 0, 5.0, START, host, BASELINE)
    (waiting,) = first.results
    assert (waiting.verdict, waiting.value) == (Verdict.SKIPPED, 5000.0), waiting
    assert "every process on the host" in waiting.detail and first.verdict is Verdict.PASS
    assert unconfirmed(spec(MEMORY), first) and not unconfirmed(spec(MEMORY), first, ("latency",))
    # The neighbour went: the next reading is back within the bound, and the check passes.
    gone = replace(window(memory_growth=200.0), memory_host_wide=True)
    (passed,) = evaluate(spec(MEMORY), 1, 10.0, START, gone, BASELINE, memory_pending=True).results
    assert passed.verdict is Verdict.PASS
    # Measured again: it fails, saying which figure decided.
    (failed,) = evaluate(spec(MEMORY), 1, 10.0, START, host, BASELINE, memory_pending=True).results
    assert failed.verdict is Verdict.FAIL and "measured twice in a row" in failed.detail
    # A GPU figure is the server's devices': one reading beyond the bound fails.
    (device,) = evaluate(
        spec(MEMORY), 0, 5.0, START, window(memory_growth=5000.0), BASELINE
    ).results
    assert device.verdict is Verdict.FAIL and device.detail == "the GPU memory in use"
    # At the end of the duration, a growth awaiting confirmation keeps the analysis running.
    memory_spec = spec(MEMORY)
    assert judge(memory_spec, (first,), memory_spec.duration) is RolloutVerdict.RUNNING
