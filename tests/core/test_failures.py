"""failures: what a pass that did not fully succeed reports, one PassFailure per server, model
or router, from PassReports made by running real plans on the Triton fakes (and, for the
results the fakes cannot produce, results written by hand)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from reconciler.core.failures import pass_failures
from reconciler.core.plan.planner import plan
from reconciler.core.records import alerts_from
from reconciler.engine.apply import apply
from reconciler.engine.context import Timing
from reconciler.model.analysis import CheckResult, Evaluation, Verdict
from reconciler.model.history import History
from reconciler.model.plan import Action, ModelChange, Plan, PlanProblem, Step
from reconciler.model.reports import PassFailure, PassReport
from reconciler.model.results import ApplyResult, ChangeResult, FailureKind, Outcome, StepResult
from reconciler.model.traffic import RouteUpdate
from tests.core.fakes import FakeClock, FakeTriton, deploy, desired_state, observe


def applied(fakes: Mapping[str, FakeTriton], *models: tuple[str, list[int]]) -> PassReport:
    """Plan ``models`` (each on every server of ``fakes``) and apply the plan, as a pass does."""
    servers = tuple(fakes)
    desired = desired_state(*(deploy(m, v, servers=servers) for m, v in models), servers=servers)
    planned = plan(desired, {n: observe(f) for n, f in fakes.items()}, History(), "rev-1")
    clock = FakeClock()
    result = apply(planned, fakes, timing=Timing(clock=clock.clock, sleep=clock.sleep))
    return PassReport("rev-1", planned, result)


def test_a_refused_load_names_server_model_step_kind_and_tritons_reason() -> None:
    fake = FakeTriton("s1", {"m": [1, 2]}, failing={("m", 2)})
    fake.serve("m", [1])

    (failure,) = pass_failures(applied({"s1": fake}, ("m", [2])))

    assert failure == PassFailure(
        "rev-1",
        "against-versions",
        "server s1: failed to load 'm' version 2: initialize failed",
        server="s1",
        model="m",
        deployment="m",
        step="load",
        outcome="reverted",
        versions=(2,),
        severe=True,  # held: only a commit (or retry) releases it
    )


def test_a_server_lost_mid_pass_is_one_transient_failure_and_its_other_changes_skipped() -> None:
    fake = FakeTriton("s1", {"a": [1], "b": [1]})
    desired = desired_state(deploy("a", [1]), deploy("b", [1]))
    planned = plan(desired, {"s1": observe(fake)}, History(), "rev-1")
    fake.unreachable = True  # after it was observed: the first load finds it gone
    clock = FakeClock()
    result = apply(planned, {"s1": fake}, timing=Timing(clock=clock.clock, sleep=clock.sleep))

    lost, skipped = pass_failures(PassReport("rev-1", planned, result))

    assert (lost.model, lost.kind, lost.step, lost.outcome, lost.severe) == (
        "a",
        FailureKind.SERVER_LOST.value,
        "load",
        "failed",
        False,
    )
    assert lost.reason  # the client's error, whatever its words
    assert (skipped.model, skipped.kind, skipped.step, skipped.severe) == (
        "b",
        "skipped",
        None,
        False,
    )
    assert skipped.reason == "not attempted: the server was lost earlier in this pass"


def test_a_server_lost_mid_pass_counts_as_unreachable_and_is_alerted_as_cut_short() -> None:
    # The service backs off and watches the servers in ``PassReport.unreachable``: a server
    # that vanished mid-load must be there too, or nothing notices when it is back.
    down = PlanProblem("s2", None, "connection refused")
    fake = FakeTriton("s1", {"a": [1, 2]})
    fake.serve("a", [1])
    desired = desired_state(deploy("a", [2]))
    planned = plan(desired, {"s1": observe(fake)}, History(), "rev-1")
    fake.unreachable = True
    clock = FakeClock()
    result = apply(planned, {"s1": fake}, timing=Timing(clock=clock.clock, sleep=clock.sleep))

    report = PassReport("rev-1", replace(planned, problems=(down,)), result)
    assert report.unreachable == {"s1", "s2"}
    (event,) = alerts_from(result, "hold")
    assert (event.kind, event.severity) == ("load-failed", "warning")
    assert event.summary == (
        "a 2 on s1 was cut short: the server was lost during load; tried again once it answers"
    )


def test_a_version_that_fails_leaves_its_server_reachable() -> None:
    fake = FakeTriton("s1", {"m": [1, 2]}, failing={("m", 2)})
    fake.serve("m", [1])

    assert applied({"s1": fake}, ("m", [2])).unreachable == frozenset()


def test_plan_problems_come_first_a_whole_server_as_unreachable() -> None:
    report = PassReport(
        "rev-1",
        Plan(
            "rev-1",
            problems=(
                PlanProblem("s2", None, "connection refused"),
                PlanProblem("s1", "m", "version 3 not in the repository"),
                PlanProblem("s1", "n", "digest differs", kind="artifact-mismatch"),
            ),
        ),
    )

    failures = pass_failures(report)

    assert [(f.server, f.model, f.kind, f.reason, f.severe) for f in failures] == [
        ("s2", None, "unreachable", "connection refused", False),
        ("s1", "m", "problem", "version 3 not in the repository", False),
        ("s1", "n", "artifact-mismatch", "digest differs", True),
    ]
    assert all(f.step is None and f.outcome is None for f in failures)


def _step(action: Action, ok: bool, error: str | None = None, **more: Any) -> StepResult:
    return StepResult(Step("s1", "m", action, (2,), ""), ok, 0.1, error, **more)


CHANGE = ModelChange("s1", "m", "m-deployment", (1,), (2,), ())


def test_a_failed_analysis_carries_its_last_evaluations_checks() -> None:
    latency = CheckResult("latency", Verdict.FAIL, 0.31, "<= 0.2")
    analysis = _step(
        Action.ANALYZE,
        False,
        "latency=0.31 (<= 0.2): fail",
        failure=FailureKind.AGAINST_VERSIONS,
        evaluations=(Evaluation(0, 5.0, (latency,), Verdict.FAIL),),
    )
    change = ChangeResult(
        CHANGE,
        Outcome.REVERTED,
        (_step(Action.LOAD, True), analysis),
        (_step(Action.LOAD, True),),
    )

    (failure,) = pass_failures(PassReport("r", Plan("r"), ApplyResult("r", (change,))))

    assert (failure.step, failure.kind, failure.reason) == (
        "analyze",
        "against-versions",
        "latency=0.31 (<= 0.2): fail",
    )
    assert failure.checks == (
        {"check": "latency", "verdict": "fail", "value": 0.31, "threshold": "<= 0.2", "detail": ""},
    )
    assert failure.revert_error is None


def test_a_revert_that_failed_is_severe_whatever_the_kind() -> None:
    lost = _step(Action.VERIFY, False, "server s1 restarted", failure=FailureKind.SERVER_LOST)
    change = ChangeResult(
        CHANGE,
        Outcome.FAILED,
        (_step(Action.LOAD, True), lost),
        (_step(Action.LOAD, False, "server s1: out of memory"),),
    )

    (failure,) = pass_failures(PassReport("r", Plan("r"), ApplyResult("r", (change,))))

    assert (failure.kind, failure.reason, failure.revert_error) == (
        "server-lost",
        "server s1 restarted",
        "server s1: out of memory",
    )
    assert failure.severe  # what serves now is not what anyone planned


def test_a_router_not_set_back_is_named() -> None:
    update = RouteUpdate("edge-router", {"stable": 100}, {}, "drifted")
    route = StepResult(
        Step("", "", Action.ROUTE, (), "router edge-router: drifted"),
        False,
        0.1,
        "admin API refused",
        failure=FailureKind.SERVER_LOST,
    )
    report = PassReport("r", Plan("r", routes=(update,)), ApplyResult("r", (), (route,)))

    (failure,) = pass_failures(report)

    assert (failure.router, failure.server, failure.kind, failure.reason, failure.step) == (
        "edge-router",
        None,
        "server-lost",
        "admin API refused",
        "route",
    )


@pytest.mark.parametrize("outcome", list(Outcome))
def test_failures_are_empty_exactly_when_the_pass_is_ok(outcome: Outcome) -> None:
    failed = outcome is not Outcome.CONVERGED
    steps = (_step(Action.LOAD, not failed, "boom" if failed else None),)
    change = ChangeResult(CHANGE, outcome, steps)
    report = PassReport("r", Plan("r"), ApplyResult("r", (change,)))

    failures = pass_failures(report)

    assert bool(failures) is not report.ok
    assert [f.outcome for f in failures] == ([str(outcome)] if failed else [])
