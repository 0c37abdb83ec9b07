"""Apply executes, the plan decides: the failure policy, a staged stage's baseline and the
finish of a restarted server are plan data; what a failed step means is decided once, from
its error's class; every planned action has its executor; webhooks go through the hooks
apply is given."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from reconciler.core.analysis import concluded
from reconciler.core.plan.planner import plan
from reconciler.engine.apply import apply
from reconciler.engine.change import failed_step
from reconciler.engine.context import ChangeContext, NoEvents, Timing
from reconciler.engine.stages import CUT
from reconciler.engine.steps import CUT_READING, EXECUTORS, execute_step
from reconciler.model.analysis import (
    AnalysisSpec,
    CheckResult,
    Evaluation,
    Figures,
    RolloutVerdict,
    Verdict,
)
from reconciler.model.errors import (
    AnalysisFailed,
    DrainTimeout,
    Interrupted,
    LoadFailed,
    MetricsUnavailable,
    ReconcileError,
    ServerUnavailable,
    ShutdownBetweenStages,
    StepFailed,
    UnloadFailed,
    VerifyFailed,
)
from reconciler.model.history import History
from reconciler.model.plan import Action, OnFailure, Plan, Step
from reconciler.model.results import Cut, Draining, FailureKind, Outcome
from reconciler.model.spec import RolloutSpec, SequencePolicy
from reconciler.ports import StepHooks
from reconciler.views.live import drain_text
from tests.core.fakes import FakeClock, FakeTriton, deploy, desired_state, observe


def server(name: str = "s1", serving: tuple[int, ...] = (1,)) -> FakeTriton:
    fake = FakeTriton(name, {"m": range(1, 7)})
    fake.serve("m", serving)
    return fake


def plan_on(fakes: Mapping[str, FakeTriton], *deployments: Any) -> Plan:
    desired = desired_state(*deployments, servers=sorted(fakes))
    return plan(desired, {n: observe(f) for n, f in fakes.items()}, History(), "rev-2")


class Recorded:
    """StepHooks that record every call and agree, or refuse with ``refuse``."""

    def __init__(self, refuse: str | None = None) -> None:
        self.webhooks: list[tuple[str, dict[str, Any]]] = []
        self.libraries: list[Step] = []
        self.refuse = refuse

    def call_webhook(self, url: str, payload: Mapping[str, Any]) -> None:
        self.webhooks.append((url, dict(payload)))
        if self.refuse:
            raise StepFailed(self.refuse)

    def replace_library(self, step: Step) -> None:
        self.libraries.append(step)


# -- dispatch ----------------------------------------------------------------------------------


@pytest.mark.parametrize("action", list(Action))
def test_every_planned_action_has_its_executor(action: Action) -> None:
    # ROLLOUT is in results only (a staged rollout that failed elsewhere), never planned;
    # ROUTE is planned in RolloutPlan.traffic and run by engine/traffic.py, not per server.
    assert (action in EXECUTORS) is (action not in (Action.ROLLOUT, Action.ROUTE))


# -- what a failure means ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (LoadFailed("refused"), FailureKind.AGAINST_VERSIONS),
        (VerifyFailed("not READY"), FailureKind.AGAINST_VERSIONS),
        (AnalysisFailed("failed", ()), FailureKind.AGAINST_VERSIONS),
        (StepFailed("webhook said no"), FailureKind.AGAINST_VERSIONS),
        (ReconcileError("anything else"), FailureKind.AGAINST_VERSIONS),
        (ServerUnavailable("s1", "gone"), FailureKind.SERVER_LOST),
        (
            MetricsUnavailable("unreadable", (), "metrics-unavailable"),
            FailureKind.METRICS_UNAVAILABLE,
        ),
        (Interrupted("shutdown", ()), FailureKind.INTERRUPTED),
        (ShutdownBetweenStages("shutdown"), FailureKind.INTERRUPTED),
        (DrainTimeout("busy"), FailureKind.NOT_SWAPPED),
        (UnloadFailed("stuck"), FailureKind.UNLOAD_FAILED),
    ],
)
def test_a_failed_step_records_what_its_error_means(
    error: ReconcileError, kind: FailureKind
) -> None:
    step = Step("s1", "m", Action.LOAD, (2,), "load")
    result = failed_step(step, error, 1.0, 3.0, reverting=False)
    assert result.failure is kind and not result.ok and result.seconds == 2.0
    assert result.unreachable is (kind is FailureKind.SERVER_LOST)
    # Held only for a failure against the versions; transient ones are retried, not held.
    assert kind.transient is (
        kind
        in (FailureKind.SERVER_LOST, FailureKind.METRICS_UNAVAILABLE, FailureKind.UNLOAD_FAILED)
    )


@pytest.mark.parametrize(
    ("unreadable", "verdict"),
    [(False, RolloutVerdict.INCONCLUSIVE), (True, RolloutVerdict.METRICS_UNAVAILABLE)],
)
def test_an_inconclusive_analysis_with_a_failed_reading_is_metrics_unavailable(
    unreadable: bool, verdict: RolloutVerdict
) -> None:
    spec = AnalysisSpec(interval=1.0, duration=2.0)
    no_data = Evaluation(
        0, 2.0, (CheckResult("latency", Verdict.NO_DATA, None, "<= 1.5x"),), Verdict.NO_DATA
    )
    assert concluded(spec, (no_data,), 2.0, unreadable) is verdict
    # Only an inconclusive end is told apart: a failure stays a failure.
    failed = Evaluation(
        0, 2.0, (CheckResult("latency", Verdict.FAIL, 3.0, "<= 1.5x"),), Verdict.FAIL
    )
    assert concluded(spec, (failed,), 2.0, unreadable) is RolloutVerdict.FAILED


def test_an_interrupted_analysis_records_interrupted_as_its_verdict() -> None:
    assert Interrupted("shutdown", ()).verdict == "interrupted"


# -- the failure policy is planned ---------------------------------------------------------------


def test_the_planner_stops_after_a_drain_or_the_old_versions_unload_and_reverts_the_rest() -> None:
    fakes = {"s1": server()}
    sequence = replace(deploy("m", [2]), sequence=SequencePolicy(idle=1.0, drain_timeout=5.0))
    (change,) = plan_on(fakes, sequence).changes
    assert [(s.action, s.on_failure) for s in change.steps] == [
        (Action.DRAIN, OnFailure.STOP),
        (Action.LOAD, OnFailure.REVERT),
        (Action.VERIFY, OnFailure.REVERT),
        (Action.UNLOAD, OnFailure.STOP),
    ]


def test_a_removal_stops_where_its_unload_fails() -> None:
    fakes = {"s1": server()}
    desired = desired_state(servers=["s1"])
    history = History(managed={"s1": frozenset({"m"})})
    (change,) = plan(desired, {"s1": observe(fakes["s1"])}, history, "rev-2").changes
    assert [(s.action, s.on_failure) for s in change.steps] == [(Action.UNLOAD, OnFailure.STOP)]


def test_a_drain_that_times_out_is_not_put_back() -> None:
    fake = server()
    sequence = replace(deploy("m", [2]), sequence=SequencePolicy(idle=1.0, drain_timeout=5.0))
    p = plan_on({"s1": fake}, sequence)
    clock = FakeClock()
    # No metrics source: the drain cannot tell idle and times out at once.
    result = apply(p, {"s1": fake}, timing=Timing(clock=clock.clock, sleep=clock.sleep))
    (change,) = result.changes
    assert change.outcome is Outcome.FAILED and change.revert == ()
    assert change.failure is FailureKind.NOT_SWAPPED
    assert fake.ready("m") == {1}


class SequencesEnding:
    """A sequence model's counters while its clients' sequences end: ``rate`` inferences a
    second for ``until`` seconds from now, then none; nothing queued."""

    def __init__(self, clock: FakeClock, rate: float, until: float) -> None:
        self.clock, self.rate, self.until, self.start = clock, rate, until, clock.now

    def figures(
        self, model: str, versions: tuple[int, ...], queries: Mapping[str, str] | None = None
    ) -> Figures:
        flowed = min(self.clock.now - self.start, self.until)
        return Figures(pending=0, inferences=self.rate * flowed)


class DrainReadings(NoEvents):
    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.seen = clock, []

    def draining(self, step: Step, draining: Draining) -> None:
        self.seen.append((self.clock.now, draining))


def test_a_drain_tells_what_still_reaches_the_model_and_how_long_it_may_wait() -> None:
    """Issue 44, point 2: Triton counts no open sequence; what stands for them is what
    still reaches the model. While the sequences in flight send their later requests the
    drain says how many a second, then how long it has been quiet of the idle window that
    ends it, and how long it may still wait; the live view says it in words."""
    fake = server()
    sequence = replace(deploy("m", [2]), sequence=SequencePolicy(idle=2.0, drain_timeout=60.0))
    p = plan_on({"s1": fake}, sequence)
    clock = FakeClock()
    events = DrainReadings(clock)
    began = clock.now
    timing = Timing(clock=clock.clock, sleep=clock.sleep, events=events)
    source = SequencesEnding(clock, rate=12.0, until=3.0)
    result = apply(p, {"s1": fake}, timing=timing, metrics={"s1": source})
    (change,) = result.changes
    assert change.outcome is Outcome.CONVERGED, change.error
    drain = change.steps[0]
    assert drain.step.action is Action.DRAIN and 4.5 <= drain.seconds <= 6.0, drain
    readings = events.seen
    assert readings and readings[0][1].rate is None  # one reading: no rate yet
    flowing = [d for at, d in readings if 1.0 <= at - began <= 3.0]
    assert flowing and all(d.rate == pytest.approx(12.0) and d.quiet == 0 for d in flowing)
    ending = [d for at, d in readings if at - began > 3.6]
    assert ending and all(d.rate == 0 and 0 < d.quiet < 2.0 for d in ending), ending
    assert [d.left for _, d in readings] == sorted((d.left for _, d in readings), reverse=True)
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(readings)]
    assert min(gaps) >= 1.0 - 1e-9, gaps  # told at most once a second
    assert drain_text(flowing[0].as_json()) == (
        "draining: 12 request(s)/s still arriving (the sequences in flight); quiet 0s of the "
        f"2s that end it; at most {flowing[0].left:.0f}s more"
    )
    assert drain_text(ending[-1].as_json()).startswith("draining: no request arriving; quiet")


def test_a_revert_drain_ends_at_its_timeout_and_the_revert_goes_on() -> None:
    """A switch back's drain of the new versions (``Step.unless_failed``) waits for the
    sequences in flight on them as a drain does, but never stops the revert: past its
    timeout, or without metrics, what is left is cut and the old versions go back. The
    forward drain of the same model fails instead (nothing is swapped). After a failure
    against the new versions (``cutting``) it does not wait: it reads for CUT_READING what
    still reaches them, the figure the report gives for the sequences it cut."""
    policy = SequencePolicy(idle=2.0, drain_timeout=5.0)
    forward = Step("s1", "m", Action.DRAIN, (2,), "drain", drain=policy)
    revert = replace(forward, unless_failed=True)
    clock = FakeClock()
    busy = SequencesEnding(clock, rate=12.0, until=1e9)  # sequences never stop arriving
    timing = Timing(clock=clock.clock, sleep=clock.sleep)
    began = clock.now
    waited = ChangeContext(source=busy)
    execute_step(server(), revert, timing, waited)
    assert 5.0 <= clock.now - began <= 6.5, clock.now - began
    assert waited.cut is not None and waited.cut.rate == pytest.approx(12.0), waited.cut
    with pytest.raises(DrainTimeout, match="did not go idle within 5s"):
        execute_step(server(), forward, timing, ChangeContext(source=busy))
    blind = ChangeContext()
    execute_step(server(), revert, timing, blind)  # no metrics: cut at once
    assert blind.cut == Cut(None, 0.0), blind.cut
    with pytest.raises(DrainTimeout, match="needs its metrics"):
        execute_step(server(), forward, timing, ChangeContext())
    assert {FailureKind.AGAINST_VERSIONS, FailureKind.INTERRUPTED} == CUT
    cutting = ChangeContext(source=busy, cutting=True)
    began = clock.now
    execute_step(server(), revert, timing, cutting)
    assert clock.now - began == pytest.approx(CUT_READING), clock.now - began
    assert cutting.cut is not None and cutting.cut.rate == pytest.approx(12.0), cutting.cut
    assert "12.0 requests a second still reached them" in cutting.cut.text("2")


# -- staged rollouts: baselines and the restarted finish are planned -----------------------------


def test_a_staged_rollout_plans_each_stages_baseline_and_the_restarted_finish() -> None:
    names = ["s0", "s1", "s2", "s3"]
    rollout = RolloutSpec(steps=(1, "100%"), preview_names=("s0",))
    p = plan_on(
        {s: server(s) for s in names}, replace(deploy("m", [2], servers=names), rollout=rollout)
    )

    (staged,) = p.rollouts
    assert staged.stages == (("s0",), ("s1",), ("s2", "s3"))
    # Each stage against the production servers still on the old versions; the preview
    # server is no production server, and the last stage has nothing left to compare with.
    assert staged.baselines == (("s1", "s2", "s3"), ("s2", "s3"), ())
    for change in p.changes:
        load, verify = change.restarted_finish
        assert (load.action, load.versions) == (Action.LOAD, (2,))
        assert load.config is not None and load.config["version_policy"] == {
            "specific": {"versions": [2]}
        }
        assert (verify.action, verify.versions, verify.interface_check) == (
            Action.VERIFY,
            (2,),
            False,
        )
        assert "lost every version of m after its stage passed" in load.reason


def test_a_change_outside_a_staged_rollout_plans_no_restarted_finish() -> None:
    (change,) = plan_on({"s1": server()}, deploy("m", [2])).changes
    assert (
        change.restarted_finish == () and plan_on({"s1": server()}, deploy("m", [2])).rollouts == ()
    )


# -- webhooks go through the hooks apply is given ------------------------------------------------


def staged_with_webhooks() -> tuple[Plan, dict[str, FakeTriton]]:
    fakes = {s: server(s) for s in ("s1", "s2")}
    rollout = RolloutSpec(
        steps=(1, "100%"), pre_step="http://gate/pre", post_step="http://gate/post"
    )
    return plan_on(fakes, replace(deploy("m", [2], servers=sorted(fakes)), rollout=rollout)), fakes


def test_step_webhooks_are_called_through_the_hooks_given() -> None:
    p, fakes = staged_with_webhooks()
    hooks = Recorded()
    clock = FakeClock()
    result = apply(p, fakes, timing=Timing(clock=clock.clock, sleep=clock.sleep), hooks=hooks)
    assert all(c.outcome is Outcome.CONVERGED for c in result.changes)
    assert [(url, body["stage"], body["hook"]) for url, body in hooks.webhooks] == [
        ("http://gate/pre", "step 1 of 2", "preStep"),
        ("http://gate/post", "step 1 of 2", "postStep"),
        ("http://gate/pre", "step 2 of 2", "preStep"),
        ("http://gate/post", "step 2 of 2", "postStep"),
    ]
    assert hooks.webhooks[0][1] == {
        "deployment": "m",
        "model": "m",
        "stage": "step 1 of 2",
        "servers": ["s1"],
        "from_versions": [1],
        "to_versions": [2],
        "hook": "preStep",
    }


def test_a_refusing_step_webhook_stops_the_rollout_against_its_versions() -> None:
    p, fakes = staged_with_webhooks()
    clock = FakeClock()
    hooks: StepHooks = Recorded(refuse="http://gate/pre answered 409")
    result = apply(p, fakes, timing=Timing(clock=clock.clock, sleep=clock.sleep), hooks=hooks)
    assert all(c.outcome is Outcome.SKIPPED for c in result.changes)
    assert all(c.failure is FailureKind.AGAINST_VERSIONS for c in result.changes)
    assert "step webhook refused: http://gate/pre answered 409" in (result.changes[0].error or "")


def test_without_hooks_a_step_webhook_fails_saying_so() -> None:
    p, fakes = staged_with_webhooks()
    clock = FakeClock()
    result = apply(p, fakes, timing=Timing(clock=clock.clock, sleep=clock.sleep))
    assert all(c.outcome is Outcome.SKIPPED for c in result.changes)
    assert "no step hooks were given to apply" in (result.changes[0].error or "")
    assert all(f.ready("m") == {1} for f in fakes.values())


def test_a_server_restarted_after_its_stage_passed_runs_the_planned_restarted_finish() -> None:
    fakes = {s: server(s) for s in ("s1", "s2")}
    rollout = RolloutSpec(steps=(1, "100%"))
    p = plan_on(fakes, replace(deploy("m", [2], servers=sorted(fakes)), rollout=rollout))

    def restart_s1_once_it_passed(_: Any, completed: tuple[str, ...], __: Any) -> None:
        if "s1" in completed:
            fakes["s1"]._models.clear()  # restarted: EXPLICIT mode starts empty

    clock = FakeClock()
    result = apply(
        p,
        fakes,
        timing=Timing(clock=clock.clock, sleep=clock.sleep),
        staged_progress=restart_s1_once_it_passed,
    )
    by_server = {c.change.server: c for c in result.changes}
    assert all(c.outcome is Outcome.CONVERGED for c in result.changes)
    assert all(f.ready("m") == {2} for f in fakes.values())
    s1_finish = by_server["s1"].steps[-2:]
    assert tuple(r.step for r in s1_finish) == by_server["s1"].change.restarted_finish
    # s2 kept its old version until the end: its planned finish drops it.
    assert by_server["s2"].steps[-1].step.action is Action.UNLOAD
