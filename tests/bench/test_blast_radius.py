"""``bench.blast_radius``'s pure pieces, without Triton: its manifests (parsed by the
reconciler's own loader), the rule that caught a rollout, a rollout's timeline from its
ChangeResult, the calls between READY and the verdict, and the failed requests counted in a
rollout's window."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from bench.blast_radius import (
    BY_NAME,
    Analysis,
    Rollout,
    call_figures,
    caught_by,
    client_counts,
    deployment_doc,
    good_analysis,
    in_window,
    mode_analysis,
    read_change,
    rollouts_of,
)
from bench.harness.calls import Call, CallLog, between, seconds_by_label
from reconciler.core.spec.desired import load_desired_state
from reconciler.model.analysis import CheckResult, Evaluation, ProbeFigures, Verdict
from reconciler.model.plan import Action, ModelChange, Step
from reconciler.model.results import ChangeResult, Outcome, StepResult
from reconciler.model.spec import ModelDeployment
from testkit.loadgen import Sample
from testkit.manifests import server_doc


def deployment(text: str) -> ModelDeployment:
    files = {
        "servers.yaml": server_doc("edge-a", "localhost:8001", Path("/models")).encode(),
        "echo.yaml": text.encode(),
    }
    return load_desired_state(files).deployments["echo"]


def test_the_manifests_parse_and_ask_for_what_each_arm_says() -> None:
    new = deployment(deployment_doc([4], False, mode_analysis(BY_NAME["exception-40"]), 0.5))
    assert new.versions == (4,)
    assert new.config["parameters"] == {"slow_ms": {"string_value": "0.5"}}
    analysis = new.analysis
    assert analysis is not None
    assert (analysis.interval, analysis.duration) == (1.0, 10.0)
    assert analysis.probes.enabled and analysis.early_abort.confidence == 0.999
    assert [c.kind for c in analysis.checks] == ["successRate"]

    today = deployment(
        deployment_doc([4], False, mode_analysis(BY_NAME["exception-40"], True), 0.5)
    )
    assert today.analysis is not None
    assert not today.analysis.probes.enabled
    assert today.analysis.early_abort.confidence == 0 and today.analysis.early_abort.every == 0

    slow = deployment(deployment_doc([5], True, mode_analysis(BY_NAME["slow-3x"]), 0.5))
    assert slow.analysis is not None and slow.analysis.failure_limit == 0
    assert [c.kind for c in slow.analysis.checks] == ["successRate", "latency"]

    wrong = deployment(deployment_doc([3], False, mode_analysis(BY_NAME["wrong-output"]), 0.5))
    assert [e.data for c in wrong.smoke for e in c.expect] == [(2.0, 4.0, 6.0, 8.0)]

    strict = deployment(deployment_doc([1], False, good_analysis(1), 0.5))
    assert strict.analysis is not None and strict.analysis.checks[0].min == 0.999
    assert [e.data for c in strict.smoke for e in c.expect] == [(1.0, 2.0, 3.0, 4.0)]

    # The harmless field makes every commit a different spec (a held one is never retried).
    for analysis_doc in (Analysis(), None):
        a = deployment(deployment_doc([1], False, analysis_doc, 0.5))
        b = deployment(deployment_doc([1], True, analysis_doc, 0.5))
        assert a.fingerprint != b.fingerprint
        assert a.analysis == b.analysis and a.suspend == b.suspend


def result(check: str, verdict: Verdict, detail: str, threshold: str = ">= 0.95") -> CheckResult:
    return CheckResult(check, verdict, 0.5, threshold, detail)


def test_the_rule_that_caught_a_rollout() -> None:
    def aborted(detail: str) -> Evaluation:
        return Evaluation(
            0, 0.02, (result("success-rate", Verdict.FAIL, detail),), Verdict.FAIL, aborted=True
        )

    assert caught_by("converged", None, None, None) == "not detected"
    assert caught_by("reverted", "verify", "smoke times-2 on version 3: ...", None) == (
        "verify: smoke case"
    )
    assert (
        caught_by(
            "reverted", "analyze", "x", aborted("early abort: 3 probes in a row failed, last: ...")
        )
        == "early abort: probes in a row"
    )
    assert (
        caught_by(
            "reverted",
            "analyze",
            "x",
            aborted("early abort: triton: 6 of 14 requests failed since READY"),
        )
        == "early abort: counters' rate"
    )
    assert (
        caught_by(
            "reverted",
            "analyze",
            "x",
            aborted("early abort: probes: 1 of 10 requests failed since READY"),
        )
        == "early abort: probes' rate"
    )
    by_evaluation = Evaluation(
        0,
        1.0,
        (
            result(
                "success-rate",
                Verdict.FAIL,
                "triton: 0 of 900 requests failed; probes: 1 of 20 failed",
                ">= 0.999",
            ),
            result("latency", Verdict.FAIL, "mean 3594us vs 926us before", "increase <= 1"),
        ),
        Verdict.FAIL,
    )
    assert caught_by("reverted", "analyze", "x", by_evaluation) == (
        "evaluation 1: success-rate (probes); latency"
    )
    no_data = Evaluation(
        1, 2.0, (result("latency", Verdict.NO_DATA, "no latency figures"),), Verdict.NO_DATA
    )
    assert caught_by("reverted", "analyze", "x", no_data) == "analysis no-data (evaluation 2)"


def step(action: Action, versions: tuple[int, ...] = (1, 4)) -> Step:
    return Step("edge-a", "echo", action, versions, "test")


def test_a_rollouts_timeline_from_its_change_result() -> None:
    probes = ProbeFigures(sent=3, failed=3, old_sent=1)
    evaluation = Evaluation(
        0,
        0.03,
        (result("success-rate", Verdict.FAIL, "early abort: 3 probes in a row failed"),),
        Verdict.FAIL,
        probes,
        aborted=True,
    )
    change = ChangeResult(
        ModelChange("edge-a", "echo", "echo", (1,), (4,), ()),
        Outcome.REVERTED,
        (
            StepResult(step(Action.LOAD), True, 1.5, ended_at=101.5),
            StepResult(step(Action.VERIFY), True, 0.002, ended_at=101.502),
            StepResult(
                step(Action.ANALYZE),
                False,
                0.03,
                "analysis failed",
                ended_at=101.532,
                evaluations=(evaluation,),
            ),
        ),
        (
            StepResult(step(Action.LOAD, (1,)), True, 0.008, ended_at=101.541, reverting=True),
            StepResult(step(Action.VERIFY, (1,)), True, 0.001, ended_at=101.542, reverting=True),
        ),
    )
    t = read_change(change)
    assert (t.outcome, t.failed_step, t.rule) == (
        "reverted",
        "analyze",
        "early abort: probes in a row",
    )
    assert t.load_sent == pytest.approx(100.0) and t.ready == 101.5
    assert t.analysis_started == pytest.approx(101.502) and t.judged_at == 101.532
    assert t.revert_load_sent == pytest.approx(101.533) and t.reverted_at == 101.541
    assert (t.evaluations, t.aborted, t.probes_sent, t.probes_failed, t.old_probes_sent) == (
        1,
        True,
        3,
        3,
        1,
    )

    converged = ChangeResult(
        change.change,
        Outcome.CONVERGED,
        (
            StepResult(step(Action.LOAD), True, 1.5, ended_at=101.5),
            StepResult(step(Action.ANALYZE), True, 10.0, ended_at=111.6),
        ),
    )
    t = read_change(converged)
    assert t.rule == "not detected" and t.judged_at == 111.6 and t.reverted_at is None


def test_the_calls_between_ready_and_the_verdict() -> None:
    calls = [
        Call("triton load", 99.0, 100.0, None, None),
        Call("triton model_state", 100.001, 100.002, None, None),
        Call("triton infer", 100.003, 100.010, 4, "VerifyFailed"),
        Call("triton infer", 100.011, 100.020, 1, None),  # the old version's baseline probe
        Call("metrics figures", 100.020, 100.024, None, None),
        Call("triton infer", 100.025, 100.030, 4, None),
        Call("triton load", 100.040, 100.050, None, None),  # after the verdict: the revert
    ]
    figures = call_figures(calls, 100.0, 100.035, 4)
    assert figures["ready_to_first_probe_ms"] == pytest.approx(3.0)
    assert figures["ready_to_first_raised_probe_end_ms"] == pytest.approx(10.0)
    assert (figures["probes"], figures["probes_raised"], figures["metrics_reads"]) == (2, 1, 1)
    assert figures["probe_ms_mean"] == pytest.approx(6.0)
    assert figures["ms_in_calls"]["triton infer"] == pytest.approx(21.0)
    assert figures["ms_outside_calls"] == pytest.approx(35.0 - 26.0)
    assert call_figures(calls, None, 100.0, 4) == {}
    assert len(between(calls, 100.0, 100.035)) == 5
    assert seconds_by_label(calls[:1]) == {"triton load": pytest.approx(1.0)}


def test_a_call_log_records_each_call_and_passes_failures_on() -> None:
    class Port:
        def infer(self, model: str, version: int) -> str:
            if version == 10:
                raise ValueError("error response")
            return f"{model} {version}"

    log = CallLog()
    port = log.timed(Port(), "triton")
    assert port.infer("echo", 4) == "echo 4"
    with pytest.raises(ValueError):
        port.infer("echo", 10)
    assert [(c.label, c.version, c.failed) for c in log.calls] == [
        ("triton infer", 4, None),
        ("triton infer", 10, "ValueError"),
    ]
    assert all(c.ended >= c.started for c in log.calls)


def sample(started: float, version: int | None, error: str | None = None) -> Sample:
    return Sample(started, 0.001, version, error)


def test_failed_requests_in_a_rollouts_window() -> None:
    samples = [
        sample(0.5, 1),  # before the window
        sample(1.0, 1),
        sample(1.1, None, "version 4 failed request 16"),
        sample(1.2, 4),
        sample(1.3, None, "version 4 failed request 18"),
        sample(1.35, None, "Request for unknown model: 'echo' version 4 is not at ready state"),
        sample(1.4, 1),
        sample(2.0, None, "version 4 failed request 99"),  # after the window
    ]
    starts = [s.started for s in samples]
    window = in_window(samples, starts, 1.0, 2.0)
    assert len(window) == 6
    counts = client_counts(window, "error", 4, "version 4 failed request", 1.05, 1.25, 1.38)
    assert counts["failed"] == 2  # the bad version's own failures, not the routing one
    assert (counts["failed_until_verdict"], counts["failed_after_verdict"]) == (1, 1)
    assert counts["other_failures"] == 1
    assert counts["answered_by_new"] == 1 and counts["affected"] == 0
    assert counts["first_new_after_ready_ms"] == pytest.approx(50.0)
    assert counts["last_new_started_after_revert_ms"] == pytest.approx(-80.0)
    assert counts["exposure_ms"] == pytest.approx(201.0)

    wrong = client_counts(
        [sample(1.0, 3), sample(1.1, 3), sample(1.2, 1)], "wrong", 3, None, 1.0, 1.15, 1.19
    )
    assert (wrong["failed"], wrong["failed_until_verdict"]) == (2, 2)
    slow = client_counts(
        [sample(1.0, 5), sample(1.1, 5), sample(1.2, 1)], "slow", 5, None, 1.0, 1.15, 1.19
    )
    assert (slow["failed"], slow["affected"]) == (0, 2)
    assert slow["mean_latency_new_ms"] == pytest.approx(1.0)
    good = client_counts(
        [sample(1.0, 2), sample(1.1, None, "anything")], "good", 2, None, 1.0, None, None
    )
    assert (good["failed"], good["other_failures"], good["failed_after_verdict"]) == (1, 0, 1)


def test_a_saved_rollout_comes_back_as_the_run_made_it() -> None:
    change = ChangeResult(
        ModelChange("edge-a", "echo", "echo", (1,), (4,), ()),
        Outcome.CONVERGED,
        (StepResult(step(Action.LOAD), True, 1.5, ended_at=101.5),),
    )
    rollout = Rollout(
        "new", "error-1", 3, 1, 11, "abc", "manifest", 99.0, 12.0, read_change(change), True,
        {"probes": 1}, 113.0, {"failed": 2},
    )  # fmt: skip
    saved = asdict(rollout) | {"detected": rollout.detected}
    assert rollouts_of({"rollouts": [saved]}) == [rollout]
    assert not rollout.detected
