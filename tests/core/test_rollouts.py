"""rollouts: the records, holds, alerts and applied specs a pass leaves behind, from ApplyResults
made by running real plans on the Triton fakes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import pytest

from reconciler.core.plan.planner import plan
from reconciler.core.records import (
    alerts_from,
    applied_from,
    hold_reminders,
    holds_from,
    released_holds,
    rollouts_from,
)
from reconciler.engine.apply import apply
from reconciler.engine.context import Timing
from reconciler.model.analysis import (
    AnalysisSpec,
    Check,
    EarlyAbort,
    Figures,
    NoTraffic,
    ProbeSpec,
)
from reconciler.model.errors import LoadFailed
from reconciler.model.history import KINDS, AlertEvent, AppliedSpec, History, Hold
from reconciler.model.plan import Action, Plan
from reconciler.model.results import ApplyResult, Outcome
from reconciler.model.spec import DesiredState, ModelDeployment, RolloutSpec
from tests.core.fakes import (
    FakeClock,
    FakeTriton,
    StuckUnloading,
    deploy,
    desired_state,
    observe,
)

NO_QUERIES: Mapping[str, str] = MappingProxyType({})
ANALYSIS = AnalysisSpec(
    5.0,
    10.0,
    0,
    NoTraffic.WAIT,
    (
        Check("success-rate", "successRate", min=0.99),
        Check("latency", "latency", max_increase=0.5),
    ),
    # Judged by the scripted counters at evaluations only (no probes, no reads between).
    probes=ProbeSpec(enabled=False),
    early_abort=EarlyAbort(every=0.0),
)


class Counters:
    """A FiguresSource: every read, each version set has answered ``ok`` more requests (in
    100us each) and failed ``failed`` more."""

    def __init__(self, ok: int = 100, failed: int = 0) -> None:
        self.ok, self.failed = ok, failed
        self.reads: dict[tuple[int, ...], int] = {}

    def figures(
        self, model: str, versions: tuple[int, ...], queries: Mapping[str, str] = NO_QUERIES
    ) -> Figures:
        n = self.reads[versions] = self.reads.get(versions, 0) + 1
        return Figures(
            success=float(self.ok * n),
            failure=float(self.failed * n) if self.failed else None,
            duration_us=100.0 * self.ok * n,
            memory_bytes=1e6,
        )


def watched(
    versions: Sequence[int],
    servers: Sequence[str] = ("s1",),
    fingerprint: str = "fp-new",
    config: Mapping[str, Any] | None = None,
) -> ModelDeployment:
    return replace(
        deploy("m", versions, servers=servers, config=config),
        analysis=ANALYSIS,
        fingerprint=fingerprint,
    )


def server(name: str = "s1", serving: Sequence[int] = (1,), **options: Any) -> FakeTriton:
    fake = FakeTriton(name, {"m": range(1, 7)}, **options)
    if serving:
        fake.serve("m", serving)
    return fake


@dataclass
class Pass:
    """One plan and apply on the fakes, and what it left."""

    desired: DesiredState
    fakes: Mapping[str, FakeTriton]
    history: History = field(default_factory=History)
    metrics: Mapping[str, Counters] = field(default_factory=dict)
    revision: str = "rev-2"
    clock: FakeClock = field(default_factory=FakeClock)

    def run(self) -> tuple[Plan, ApplyResult]:
        serving = {name: observe(fake) for name, fake in self.fakes.items()}
        p = plan(self.desired, serving, self.history, self.revision)
        timing = Timing(clock=self.clock.clock, sleep=self.clock.sleep)
        return p, apply(p, self.fakes, timing=timing, metrics=self.metrics)


def failing_analysis(servers: Mapping[str, Sequence[int]]) -> tuple[Pass, Plan, ApplyResult]:
    """Version 3 of m, half of whose requests fail, on servers serving the versions given."""
    names = sorted(servers)
    run = Pass(
        desired_state(watched([3], names), servers=names),
        {s: server(s, servers[s]) for s in names},
        metrics={s: Counters(ok=50, failed=50) for s in names},
    )
    return (run, *run.run())


# -- holds -----------------------------------------------------------------------------------


def test_a_reverted_rollout_holds_its_deployment_at_each_servers_previous_versions() -> None:
    run, _, result = failing_analysis({"s1": [1], "s2": [1, 2]})
    assert [c.outcome for c in result.changes] == [Outcome.REVERTED, Outcome.REVERTED]

    (hold,) = holds_from(result, run.desired, run.history)

    assert (hold.deployment, hold.fingerprint, hold.revision) == ("m", "fp-new", "rev-2")
    assert dict(hold.previous) == {"s1": (1,), "s2": (1, 2)}
    # The config each server served before, as the revert loaded it.
    reverts = {c.change.server: c.change.revert[0].config for c in result.changes}
    assert dict(hold.configs) == reverts
    assert hold.configs["s2"] is not None
    assert hold.configs["s2"]["version_policy"] == {"specific": {"versions": [1, 2]}}
    assert hold.reason == "; ".join(sorted(c.error or "" for c in result.changes))
    assert "analysis of m version(s) 3 failed" in hold.reason


def test_the_next_plan_keeps_a_held_deployment_where_it_was() -> None:
    run, _, result = failing_analysis({"s1": [1], "s2": [1, 2]})
    holds = holds_from(result, run.desired, run.history)

    again = replace(run, history=History("rev-2", holds={h.deployment: h for h in holds}))
    p, second = again.run()

    assert p.changes == () and second.changes == ()
    assert [(h.server, h.versions) for h in p.held] == [("s1", (1,)), ("s2", (1, 2))]
    assert released_holds(run.desired, again.history) == ()


def test_a_hold_in_force_fires_its_open_alert_again_with_the_same_labels() -> None:
    run, _, result = failing_analysis({"s1": [1], "s2": [1, 2]})
    holds = holds_from(result, run.desired, run.history)
    (first,) = [e for e in alerts_from(result, "hold") if e.server == "s1"]
    again = replace(run, history=History("rev-2", holds={h.deployment: h for h in holds}))
    p, _ = again.run()

    # Only alerts still open are fired again; an alert resolved meanwhile stays resolved.
    (reminder,) = hold_reminders(p, {("m", "s1", first.kind), ("m", "s3", "rollout-failed")})
    assert (reminder.kind, reminder.severity, reminder.model, reminder.server) == (
        first.kind,
        first.severity,
        "m",
        "s1",
    )
    assert "held at 1" in reminder.summary and reminder.details["held"] == "yes"
    assert hold_reminders(p, set()) == ()
    released = replace(p, held=())  # a commit changed the spec: nothing to remind of
    assert hold_reminders(released, {("m", "s1", first.kind)}) == ()


def test_a_failed_load_holds_the_deployment_too() -> None:
    run = Pass(desired_state(watched([3])), {"s1": server(failing={("m", 3)})})
    _, result = run.run()

    (hold,) = holds_from(result, run.desired, run.history)

    assert dict(hold.previous) == {"s1": (1,)}
    assert hold.reason == "server s1: failed to load 'm' version 3: initialize failed"


def test_a_failed_first_deployment_is_held_at_nothing() -> None:
    run = Pass(
        desired_state(watched([3])), {"s1": server(serving=())}, metrics={"s1": Counters(0, 9)}
    )
    _, result = run.run()

    (hold,) = holds_from(result, run.desired, run.history)

    assert dict(hold.previous) == {"s1": ()}
    assert dict(hold.configs) == {"s1": None}  # the revert unloaded: no config to restore


def unload_stuck() -> tuple[Pass, ApplyResult]:
    fake = StuckUnloading("s1", {"m": range(1, 7)})
    fake.serve("m", [1])
    run = Pass(desired_state(watched([2])), {"s1": fake}, metrics={"s1": Counters()})
    return run, run.run()[1]


def test_a_failed_unload_only_is_not_held() -> None:
    run, result = unload_stuck()
    (change,) = result.changes
    assert change.outcome is Outcome.FAILED
    assert [(r.step.action, r.ok) for r in change.steps][-2:] == [
        (Action.ANALYZE, True),
        (Action.UNLOAD, False),
    ]

    assert holds_from(result, run.desired, run.history) == ()


def test_a_converged_rollout_is_not_held() -> None:
    run = Pass(desired_state(watched([2])), {"s1": server()}, metrics={"s1": Counters()})
    _, result = run.run()
    assert result.ok

    assert holds_from(result, run.desired, run.history) == ()


def test_a_server_that_did_not_answer_does_not_hold_the_deployment() -> None:
    fake = server()
    run = Pass(desired_state(watched([2])), {"s1": fake}, metrics={"s1": Counters()})
    serving = {"s1": observe(fake)}
    p = plan(run.desired, serving, run.history, run.revision)
    fake.unreachable = True  # goes away between observe and apply
    result = apply(p, run.fakes, timing=Timing(run.clock.clock, run.clock.sleep))
    (change,) = result.changes
    assert change.outcome is Outcome.FAILED and change.steps[0].unreachable

    assert holds_from(result, run.desired, run.history) == ()


def test_a_held_restore_that_fails_keeps_the_versions_from_before_the_first_failure() -> None:
    # Held at 1 after version 3 failed; 1 is gone meanwhile and will not load again.
    fake = server(serving=[3], failing={("m", 1)})
    earlier = Hold("m", "fp-new", "rev-1", "analysis failed", {"s1": (1,)}, {"s1": None})
    run = Pass(desired_state(watched([3])), {"s1": fake}, History("rev-1", holds={"m": earlier}))
    _, result = run.run()
    (change,) = result.changes
    assert (change.change.serving, change.change.desired) == ((3,), (1,))
    assert change.outcome is Outcome.REVERTED

    (hold,) = holds_from(result, run.desired, run.history)

    assert dict(hold.previous) == {"s1": (1,)}  # not (3,): that is the spec that failed
    assert hold.revision == "rev-2"
    assert hold.reason == "server s1: failed to load 'm' version 1: initialize failed"


def test_holds_are_released_by_a_changed_or_removed_deployment() -> None:
    desired = desired_state(watched([3], fingerprint="fp-same"), deploy("other", [1]))
    history = History(
        holds={
            "m": Hold("m", "fp-same", "rev-1", "failed", {"s1": (1,)}),
            "other": Hold("other", "fp-old", "rev-1", "failed", {"s1": (1,)}),
            "gone": Hold("gone", "fp-gone", "rev-1", "failed", {"s1": (1,)}),
        }
    )

    assert released_holds(desired, history) == ("gone", "other")


# -- rollout records -------------------------------------------------------------------------


def test_a_reverted_rollout_is_recorded_with_its_checks_and_rollback_time() -> None:
    _, _, result = failing_analysis({"s1": [1]})
    (change,) = result.changes

    (record,) = rollouts_from(result, now=1_700_000_000.0)

    assert (record.revision, record.deployment, record.server, record.model) == (
        "rev-2",
        "m",
        "s1",
        "m",
    )
    assert (record.from_versions, record.to_versions) == ((1,), (3,))
    assert (record.outcome, record.verdict) == ("reverted", "failed")
    assert record.checks == (
        {
            "check": "success-rate",
            "verdict": "fail",
            "value": 0.5,
            "threshold": ">= 0.99",
            # From READY: the reading before the load, to the first evaluation's (two reads).
            "detail": "triton: 100 of 200 requests failed",
        },
        {
            "check": "latency",
            "verdict": "pass",
            "value": 0.0,
            "threshold": "increase <= 0.5",
            "detail": "mean 100us vs 100us meanwhile",
        },
    )
    assert record.error == change.error
    assert record.rollback_seconds == change.rollback_seconds == pytest.approx(0.0)
    assert record.finished_at == 1_700_000_000.0


def test_records_of_a_passed_analysis_and_of_a_failed_load() -> None:
    passed = Pass(desired_state(watched([2])), {"s1": server()}, metrics={"s1": Counters()})
    refused = Pass(desired_state(watched([3])), {"s1": server(failing={("m", 3)})})

    (ok,) = rollouts_from(passed.run()[1], now=1.0)
    (bad,) = rollouts_from(refused.run()[1], now=2.0)

    assert (ok.outcome, ok.verdict, ok.error, ok.rollback_seconds) == (
        "converged",
        "passed",
        None,
        None,
    )
    assert [c["verdict"] for c in ok.checks] == ["pass", "pass"]
    assert (bad.outcome, bad.verdict, bad.checks, bad.rollback_seconds) == (
        "reverted",
        None,
        (),
        None,
    )


def test_removals_and_unload_only_changes_are_not_rollouts() -> None:
    fake = FakeTriton("s1", {"m": range(1, 7), "gone": [1]})
    fake.serve("m", [1, 2])
    fake.serve("gone", [1])
    run = Pass(
        desired_state(deploy("m", [2])),
        {"s1": fake},
        History("rev-1", managed={"s1": frozenset({"m", "gone"})}),
    )
    _, result = run.run()
    assert sorted((c.change.model, c.outcome) for c in result.changes) == [
        ("gone", Outcome.CONVERGED),
        ("m", Outcome.CONVERGED),
    ]

    assert rollouts_from(result, now=1.0) == ()
    assert alerts_from(result, "hold") == ()
    assert holds_from(result, run.desired, run.history) == ()


# -- alerts ----------------------------------------------------------------------------------


def test_a_failed_analysis_alerts_rollout_failed_with_its_checks() -> None:
    clock = FakeClock()

    class SlowLoads(FakeTriton):
        def load(self, model: str, config: Mapping[str, Any]) -> None:
            clock.now += 0.01234
            super().load(model, config)

    fake = SlowLoads("s1", {"m": range(1, 7)})
    fake.serve("m", [1])
    run = Pass(
        desired_state(watched([3])), {"s1": fake}, metrics={"s1": Counters(50, 50)}, clock=clock
    )
    _, result = run.run()
    (change,) = result.changes

    (event,) = alerts_from(result, "commit")

    assert (event.kind, event.severity, event.resolved) == ("rollout-failed", "critical", False)
    assert (event.revision, event.model, event.server) == ("rev-2", "m", "s1")
    assert event.summary == "m 3 on s1 failed its analysis; 1 serves again"
    assert dict(event.details) == {
        "revision": "rev-2",
        "deployment": "m",
        "from_versions": [1],
        "to_versions": [3],
        "outcome": "reverted",
        "error": change.error,
        "action": "commit",
        # Counted from READY: from the read before the load (two reads of Counters).
        "checks": "success-rate=0.5 (>= 0.99): fail, triton: 100 of 200 requests failed; "
        "latency=0 (increase <= 0.5): pass, mean 100us vs 100us meanwhile",
        "rollback_seconds": 0.0123,
    }


def test_a_failed_load_alerts_load_failed_without_checks() -> None:
    run = Pass(desired_state(watched([3])), {"s1": server(failing={("m", 3)})})
    _, result = run.run()

    (event,) = alerts_from(result, "hold")

    assert (event.kind, event.severity) == ("load-failed", "critical")
    assert event.summary == "m 3 on s1 failed to load or verify; 1 serves again"
    assert event.details["action"] == "hold"
    assert event.details["error"] == "server s1: failed to load 'm' version 3: initialize failed"
    assert "checks" not in event.details and "rollback_seconds" not in event.details


def test_a_failed_first_deployment_says_nothing_serves_again() -> None:
    run = Pass(
        desired_state(watched([3])), {"s1": server(serving=())}, metrics={"s1": Counters(0, 9)}
    )
    _, result = run.run()

    (event,) = alerts_from(result, "hold")

    assert event.kind == "rollout-failed"
    assert event.summary == "m 3 on s1 failed its analysis; nothing serves again"


def test_a_rollout_whose_revert_failed_names_no_revert_action() -> None:
    class RevertRefused(FakeTriton):
        def load(self, model: str, config: Mapping[str, Any]) -> None:
            if "load m" in self.calls:
                self.calls.append(f"load {model}")
                raise LoadFailed("server s1: out of memory")
            super().load(model, config)

    fake = RevertRefused("s1", {"m": range(1, 7)})
    fake.serve("m", [1])
    run = Pass(desired_state(watched([3])), {"s1": fake}, metrics={"s1": Counters(50, 50)})
    _, result = run.run()
    (change,) = result.changes
    assert change.outcome is Outcome.FAILED

    (event,) = alerts_from(result, "commit")

    assert event.kind == "rollout-failed"
    assert event.summary == "m 3 on s1 failed its analysis"  # nothing claims 1 serves again
    assert (event.details["outcome"], event.details["action"]) == ("failed", "none")
    assert "rollback_seconds" not in event.details  # the old versions did not come back


def test_converged_rollouts_send_resolving_events() -> None:
    run = Pass(
        desired_state(watched([2, 3], ["s1", "s2"]), servers=["s1", "s2"]),
        {"s1": server("s1"), "s2": server("s2", ())},
        metrics={"s1": Counters(), "s2": Counters()},
    )
    _, result = run.run()
    assert result.ok

    events = alerts_from(result, "hold")

    assert [(e.kind, e.severity, e.resolved, e.server, e.summary) for e in events] == [
        ("rollout-succeeded", "info", True, "s1", "m 2, 3 serves on s1"),
        ("rollout-succeeded", "info", True, "s2", "m 2, 3 serves on s2"),
    ]


def test_a_stuck_unload_is_not_alerted_as_a_failed_load() -> None:
    _, result = unload_stuck()

    events = alerts_from(result, "hold")

    assert all("failed to load or verify" not in e.summary for e in events)


@pytest.mark.parametrize("kind", KINDS)
def test_an_alert_event_takes_each_known_kind(kind: str) -> None:
    assert AlertEvent(kind, "info", "s", "rev").kind == kind


def test_an_alert_event_rejects_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown alert kind 'rollout-exploded'; one of "):
        AlertEvent("rollout-exploded", "critical", "boom", "rev-2")


# -- applied specs ---------------------------------------------------------------------------


def test_a_deployment_converged_on_every_server_is_applied() -> None:
    config = {"max_batch_size": 2}
    run = Pass(
        desired_state(watched([2], ["s1", "s2"], config=config), servers=["s1", "s2"]),
        {"s1": server("s1"), "s2": server("s2")},
        metrics={"s1": Counters(), "s2": Counters()},
    )
    p, result = run.run()

    assert applied_from(run.desired, p, result) == (
        AppliedSpec("m", "rev-2", "fp-new", (2,), config),
    )


def test_a_deployment_in_sync_on_one_server_and_converged_on_the_other_is_applied() -> None:
    run = Pass(
        desired_state(watched([2], ["s1", "s2"]), servers=["s1", "s2"]),
        {"s1": server("s1", [2]), "s2": server("s2")},
        metrics={"s2": Counters()},
    )
    p, result = run.run()
    assert p.in_sync == (("s1", "m"),) and len(result.changes) == 1

    assert [a.deployment for a in applied_from(run.desired, p, result)] == ["m"]
    assert applied_from(run.desired, replace(p, changes=()), None) == ()


def test_a_deployment_reverted_on_one_server_is_not_applied() -> None:
    run = Pass(
        desired_state(watched([3], ["s1", "s2"]), servers=["s1", "s2"]),
        {"s1": server("s1"), "s2": server("s2")},
        metrics={"s1": Counters(), "s2": Counters(50, 50)},
    )
    p, result = run.run()
    assert sorted(c.outcome for c in result.changes) == [Outcome.CONVERGED, Outcome.REVERTED]

    assert applied_from(run.desired, p, result) == ()


def test_an_in_sync_deployment_is_applied_but_not_a_held_one() -> None:
    desired = desired_state(watched([2]), replace(deploy("n", [1]), fingerprint="fp-n"))
    fake = FakeTriton("s1", {"m": range(1, 7), "n": [1]})
    fake.serve("m", [1])
    fake.serve("n", [1])
    held = Hold("m", "fp-new", "rev-1", "failed", {"s1": (1,)})
    run = Pass(desired, {"s1": fake}, History("rev-1", holds={"m": held}))

    p = plan(desired, {"s1": observe(fake)}, run.history, "rev-2")

    assert p.changes == () and [h.deployment for h in p.held] == ["m"]
    assert applied_from(desired, p, None) == (AppliedSpec("n", "rev-2", "fp-n", (1,), {}),)


def test_a_deployment_on_an_unreachable_server_is_not_applied() -> None:
    desired = desired_state(watched([1], ["s1", "s2"]), servers=["s1", "s2"])
    s1, s2 = server("s1"), server("s2")
    s2.unreachable = True

    p = plan(desired, {"s1": observe(s1), "s2": observe(s2)}, History(), "rev-2")

    assert p.in_sync == (("s1", "m"),) and [q.server for q in p.problems] == ["s2"]
    assert applied_from(desired, p, None) == ()


# -- a staged rollout's baseline ---------------------------------------------------------------


class Latencies:
    """A FiguresSource: each read, every version set answered 100 more requests, each in the
    mean time given for it (microseconds)."""

    def __init__(self, mean_us: Mapping[tuple[int, ...], float]) -> None:
        self.mean_us = mean_us
        self.reads: dict[tuple[int, ...], int] = {}

    def figures(
        self, model: str, versions: tuple[int, ...], queries: Mapping[str, str] = NO_QUERIES
    ) -> Figures:
        if versions not in self.mean_us:  # the server as a whole: its memory only
            return Figures(memory_bytes=1e6)
        n = self.reads[versions] = self.reads.get(versions, 0) + 1
        return Figures(
            success=100.0 * n,
            duration_us=100.0 * n * self.mean_us[versions],
            memory_bytes=1e6,
        )


@pytest.mark.parametrize(("others_old_us", "outcome"), [(100.0, "reverted"), (300.0, "passed")])
def test_a_steps_latency_is_compared_with_the_servers_still_on_the_old_version(
    others_old_us: float, outcome: str
) -> None:
    # s1 takes step 1. Its own old version is slow (300 us), its new one 250 us: against
    # itself, faster. The servers still on version 1 answer in ``others_old_us``: at 100 us
    # the new version is 2.5x slower than the fleet it is to replace, so step 1 fails and
    # nothing reaches s2 or s3.
    names = ["s1", "s2", "s3"]
    deployment = replace(watched([2], names), rollout=RolloutSpec(steps=(1, "100%")))
    metrics = {"s1": Latencies({(1,): 300.0, (2,): 250.0})} | {
        s: Latencies({(1,): others_old_us, (2,): 250.0}) for s in ("s2", "s3")
    }
    run = Pass(
        desired_state(deployment, servers=names),
        {s: server(s) for s in names},
        metrics=metrics,  # type: ignore[arg-type]
    )
    p, result = run.run()

    assert [r.stages for r in p.rollouts] == [(("s1",), ("s2", "s3"))]
    by_server = {c.change.server: c for c in result.changes}
    if outcome == "reverted":
        assert by_server["s1"].outcome is Outcome.REVERTED
        assert "latency" in (by_server["s1"].error or "")
        assert all(run.fakes[s].ready("m") == {1} for s in names)
        assert not any(c.startswith("load") for s in ("s2", "s3") for c in run.fakes[s].calls)
    else:
        assert all(c.outcome is Outcome.CONVERGED for c in result.changes)
        assert all(run.fakes[s].ready("m") == {2} for s in names)
