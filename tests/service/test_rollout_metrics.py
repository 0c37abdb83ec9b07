"""The rollouts in progress as metrics (service/rollout_metrics.py): the step running, the
analysis's time left, each check's last value and bound; all gone when the pass ends."""

from __future__ import annotations

from reconciler.model.analysis import (
    AnalysisSpec,
    Check,
    CheckResult,
    Evaluation,
    NoTraffic,
    Verdict,
)
from reconciler.model.plan import Action, Step
from reconciler.service.rollout_metrics import RolloutGauges
from reconciler.service.telemetry import ReconcilerMetrics

SPEC = AnalysisSpec(
    1.0, 30.0, 0, NoTraffic.WAIT,
    (Check("success-rate", "successRate", min=0.99),
     Check("latency", "latency", max_increase=0.5)),
)  # fmt: skip


def sample(metrics: ReconcilerMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_a_rollout_in_progress_shows_its_step_its_checks_and_goes_when_the_pass_ends() -> None:
    metrics = ReconcilerMetrics()
    gauges = RolloutGauges(metrics)
    where = {"server": "edge-a", "model": "echo"}
    gauges.started(Step("edge-a", "echo", Action.LOAD, (1, 2), "load"), False)
    assert sample(metrics, "triton_gitops_rollout_step", **where, step="load") == 1
    assert sample(metrics, "triton_gitops_rollout_step", **where, step="analyze") == 0

    analyze = Step("edge-a", "echo", Action.ANALYZE, (2,), "analyze", analysis=SPEC)
    gauges.started(analyze, False)
    assert sample(metrics, "triton_gitops_rollout_step", **where, step="analyze") == 1
    assert sample(metrics, "triton_gitops_analysis_seconds_left", **where) == 30.0
    bound = "triton_gitops_analysis_check_bound"
    assert sample(metrics, bound, **where, check="success-rate", bound="min") == 0.99
    assert sample(metrics, bound, **where, check="latency", bound="max_increase") == 0.5
    evaluation = Evaluation(
        0, 1.0,
        (CheckResult("success-rate", Verdict.PASS, 0.999, ">= 0.99"),
         CheckResult("latency", Verdict.NO_DATA, None, "increase <= 0.5")),
        Verdict.NO_DATA,
    )  # fmt: skip
    gauges.evaluated(analyze, evaluation, 29.0)
    value = "triton_gitops_analysis_check_value"
    assert sample(metrics, value, **where, check="success-rate", kind="successRate") == 0.999
    assert sample(metrics, value, **where, check="latency", kind="latency") is None  # no value
    # The shadow comparison's checks are no check of the spec: kind shadow.
    shadow = CheckResult("shadow", Verdict.PASS, 0.002, "disagreement beyond the noise")
    gauges.evaluated(analyze, Evaluation(1, 2.0, (shadow,), Verdict.PASS), 28.0)
    assert sample(metrics, value, **where, check="shadow", kind="shadow") == 0.002
    assert sample(metrics, "triton_gitops_analysis_seconds_left", **where) == 28.0

    gauges.started(Step("edge-a", "echo", Action.LOAD, (1,), "revert"), True)
    assert sample(metrics, "triton_gitops_rollout_step", **where, step="reverting") == 1
    assert sample(metrics, "triton_gitops_rollout_step", **where, step="load") == 0

    gauges.pass_ended()
    text = metrics.registry.get_sample_value  # every series of the pass is gone
    assert text("triton_gitops_rollout_step", {**where, "step": "reverting"}) is None
    assert sample(metrics, value, **where, check="success-rate", kind="successRate") is None
    assert sample(metrics, value, **where, check="shadow", kind="shadow") is None
    assert sample(metrics, bound, **where, check="latency", bound="max_increase") is None
    assert sample(metrics, "triton_gitops_analysis_seconds_left", **where) is None


def test_a_route_set_is_each_pools_share_and_stays_after_the_pass() -> None:
    metrics = ReconcilerMetrics()
    gauges = RolloutGauges(metrics)
    gauges.routed("edge", {"stable": 9_900, "canary": 100}, {"canary": 1_000, "comparator": 500})
    assert sample(metrics, "triton_gitops_route_mirror", router="edge", pool="comparator") == 0.05
    assert sample(metrics, "triton_gitops_route_weight", router="edge", pool="canary") == 0.01
    assert sample(metrics, "triton_gitops_route_weight", router="edge", pool="stable") == 0.99
    assert sample(metrics, "triton_gitops_route_mirror", router="edge", pool="canary") == 0.1
    assert sample(metrics, "triton_gitops_route_mirror", router="edge", pool="stable") == 0.0
    gauges.pass_ended()  # the route is where clients go now: kept
    assert sample(metrics, "triton_gitops_route_weight", router="edge", pool="canary") == 0.01
