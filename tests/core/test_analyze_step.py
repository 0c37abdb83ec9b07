"""The analyze step: plan() + apply() on the Triton fake, with scripted metrics and a fake clock.

The old versions stay READY while the new ones are watched; a failing evaluation puts the old
versions back at once; a hold keeps a failed spec from being tried again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import pytest

from reconciler.core.plan.planner import plan
from reconciler.core.records import holds_from
from reconciler.engine.apply import apply
from reconciler.engine.context import Timing
from reconciler.model.analysis import (
    AnalysisSpec,
    Check,
    EarlyAbort,
    Figures,
    NoTraffic,
    ProbeSpec,
    RolloutVerdict,
    Verdict,
)
from reconciler.model.history import Held, History, Hold
from reconciler.model.plan import Action, Plan
from reconciler.model.results import ApplyResult, ChangeResult, Outcome
from reconciler.model.spec import DesiredState, ModelDeployment
from tests.core.fakes import FakeClock, FakeTriton, deploy, desired_state, observe

NO_QUERIES: Mapping[str, str] = MappingProxyType({})
SUCCESS_RATE = Check("success-rate", "successRate", min=0.99)
LATENCY = Check("latency", "latency", max_increase=0.5)
KPI = Check("kpi", "promql", min=1, query="sum(rate(kpi_total[1m]))")


def analysis(*checks: Check, interval: float = 5.0, duration: float = 20.0) -> AnalysisSpec:
    """Judged by the scripted counters alone: no probes, and the counters read at
    evaluations only (tests/core/test_probing.py has the probes and the early abort)."""
    return AnalysisSpec(
        interval,
        duration,
        0,
        NoTraffic.WAIT,
        checks or (SUCCESS_RATE, LATENCY),
        probes=ProbeSpec(enabled=False),
        early_abort=EarlyAbort(every=0.0),
    )


def watched(
    versions: Sequence[int], spec: AnalysisSpec | None = None, fingerprint: str = "fp-new"
) -> ModelDeployment:
    return replace(deploy("m", versions), analysis=spec or analysis(), fingerprint=fingerprint)


def cumulative(*windows: tuple[int, int], mean_us: float = 100.0) -> list[Figures]:
    """Cumulative readings of the new versions: a first one, then one per (ok, failed) window."""
    readings = [Figures(success=0.0, duration_us=0.0, memory_bytes=1e6, queries={"kpi": 5.0})]
    for ok, failed in windows:
        last = readings[-1]
        assert last.success is not None and last.duration_us is not None
        readings.append(
            Figures(
                success=last.success + ok,
                # Like Triton: no failure series until the first request fails.
                failure=(last.failure or 0.0) + failed if failed or last.failure else None,
                duration_us=last.duration_us + ok * mean_us,
                memory_bytes=1e6,
                queries={"kpi": 5.0},
            )
        )
    return readings


HEALTHY = cumulative(*[(100, 0)] * 4)
OLD = Figures(success=5000.0, failure=2.0, duration_us=500_000.0)  # 100us on average


@dataclass
class Call:
    versions: tuple[int, ...]
    queries: dict[str, str]
    at: float
    ready: frozenset[int]
    calls_before: int  # how many calls the Triton fake had had
    snapshots_before: int  # how many snapshots its timeline held


class ScriptedFigures:
    """A FiguresSource: ``old`` for the baseline read, then ``new`` in order (the last repeats)."""

    def __init__(
        self, fake: FakeTriton, clock: FakeClock, new: Sequence[Figures], old: Figures = OLD
    ) -> None:
        self.fake, self.clock = fake, clock
        self.new, self.old = list(new), old
        self.calls: list[Call] = []
        self.served = 0

    def figures(
        self, model: str, versions: tuple[int, ...], queries: Mapping[str, str] = NO_QUERIES
    ) -> Figures:
        self.calls.append(
            Call(
                versions,
                dict(queries),
                self.clock.now,
                self.fake.ready(model),
                len(self.fake.calls),
                len(self.fake.timeline),
            )
        )
        if versions != (2,):
            return self.old
        if 2 not in self.fake.ready(model):
            return Figures()  # like Triton: no series for a version it does not serve
        reading = self.new[min(self.served, len(self.new) - 1)]
        self.served += 1
        return reading


class SlowLoads(FakeTriton):
    """Every load takes ``seconds`` on the injected clock."""

    def __init__(self, clock: FakeClock, seconds: float, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.clock, self.seconds = clock, seconds

    def load(self, model: str, config: Mapping[str, Any]) -> None:
        self.clock.now += self.seconds
        super().load(model, config)


def serving_one(clock: FakeClock | None = None, load_seconds: float = 0.0) -> FakeTriton:
    fake = (
        SlowLoads(clock, load_seconds, "s1", {"m": range(1, 7)})
        if clock is not None
        else FakeTriton("s1", {"m": range(1, 7)})
    )
    fake.serve("m", [1])
    return fake


def plan_for(desired: DesiredState, fake: FakeTriton, history: History | None = None) -> Plan:
    return plan(desired, {"s1": observe(fake)}, history or History(), "rev-2")


def run(p: Plan, fake: FakeTriton, clock: FakeClock, source: ScriptedFigures | None) -> ApplyResult:
    return apply(
        p,
        {"s1": fake},
        timing=Timing(clock=clock.clock, sleep=clock.sleep),
        metrics={"s1": source} if source is not None else {},
    )


def only(result: ApplyResult) -> ChangeResult:
    (change,) = result.changes
    return change


def test_a_passing_analysis_converges_and_unloads_the_old_versions_only_after_it() -> None:
    fake, clock = serving_one(), FakeClock()
    source = ScriptedFigures(fake, clock, HEALTHY)
    p = plan_for(desired_state(watched([2], analysis(SUCCESS_RATE, LATENCY, KPI))), fake)
    (planned,) = p.changes
    assert [(s.action, s.versions) for s in planned.steps] == [
        (Action.LOAD, (1, 2)),
        (Action.VERIFY, (2,)),
        (Action.ANALYZE, (2,)),
        (Action.UNLOAD, (2,)),
    ]
    assert planned.steps[2].baseline == (1,)

    result = run(p, fake, clock, source)

    change = only(result)
    assert change.outcome is Outcome.CONVERGED and result.ok
    analyze = change.analysis
    assert analyze is not None and analyze.ok
    assert analyze.verdict is RolloutVerdict.PASSED
    assert [(e.index, e.at, e.verdict) for e in analyze.evaluations] == [
        (0, 5.0, Verdict.PASS),
        (1, 10.0, Verdict.PASS),
        (2, 15.0, Verdict.PASS),
        (3, 20.0, Verdict.PASS),
    ]
    assert analyze.seconds == pytest.approx(20.0)
    assert clock.elapsed == pytest.approx(20.0)
    assert change.rollback_seconds is None
    # Before anything loads, the new version's counters (none yet: its requests count from
    # READY); then a server-wide memory read (versions ()) for the footprint; with no memory
    # figure in it, no second read after the load.
    assert (source.calls[0].versions, source.calls[0].ready) == ((2,), {1})
    assert source.calls[1].versions == () and source.calls[2].versions == (2,)
    analysis_calls = [c for c in source.calls[1:] if c.versions]
    # The new ones at the start (first: clients may be failing), one baseline read of the old
    # versions, then at every tick the new ones and the old ones again (with a latency
    # check, their latency meanwhile is the baseline when they served enough requests).
    assert [(c.versions, c.at - clock.start) for c in analysis_calls] == [
        ((2,), 0.0),
        ((1,), 0.0),
        ((2,), 5.0),
        ((1,), 5.0),
        ((2,), 10.0),
        ((1,), 10.0),
        ((2,), 15.0),
        ((1,), 15.0),
        ((2,), 20.0),
        ((1,), 20.0),
    ]
    assert analysis_calls[1].queries == {}
    assert all(c.queries == {"kpi": KPI.query} for c in analysis_calls if c.versions == (2,))
    # The old version served beside the new one through the whole analysis...
    assert all(c.ready == {1, 2} for c in analysis_calls)
    # ...and was dropped by the one load that came after the last reading.
    later = fake.calls[source.calls[-1].calls_before :]
    assert [c for c in later if not c.startswith("model_state")] == ["load m"]
    assert fake.ready("m") == {2}
    history = fake.history("m")  # [start, serve m [1], ...]
    dropped = next(i for i in range(2, len(history)) if 1 not in history[i])
    assert dropped >= source.calls[-1].snapshots_before
    assert fake.timeline[dropped].call == "load m"


def test_a_failing_evaluation_reverts_at_once_without_waiting_for_the_duration() -> None:
    fake, clock = serving_one(), FakeClock()
    bad = cumulative((50, 50), (100, 0), (100, 0), (100, 0))
    source = ScriptedFigures(fake, clock, bad)
    p = plan_for(desired_state(watched([2], analysis(duration=60.0))), fake)

    change = only(run(p, fake, clock, source))

    assert change.outcome is Outcome.REVERTED
    assert clock.elapsed == pytest.approx(5.0)  # one interval, not the 60s duration
    assert [(r.step.action, r.ok) for r in change.steps] == [
        (Action.LOAD, True),
        (Action.VERIFY, True),
        (Action.ANALYZE, False),
    ]
    assert [(r.step.action, r.ok) for r in change.revert] == [
        (Action.LOAD, True),
        (Action.VERIFY, True),
    ]
    analyze = change.analysis
    assert analyze is not None
    assert analyze.verdict == RolloutVerdict.FAILED
    (evaluation,) = analyze.evaluations
    assert evaluation.verdict is Verdict.FAIL
    assert [(r.check, r.verdict) for r in evaluation.results] == [
        ("success-rate", Verdict.FAIL),
        ("latency", Verdict.PASS),
    ]
    assert change.error == (
        "server s1: analysis of m version(s) 2 failed after 1 evaluation(s): "
        "success-rate=0.5 (>= 0.99): fail, triton: 50 of 100 requests failed"
    )
    assert change.rollback_seconds == pytest.approx(0.0)  # set: measured on the fake clock
    assert fake.ready("m") == {1}
    assert fake.model_state("m").reason(2) == "UNAVAILABLE: unloaded"
    assert all(1 in ready for ready in fake.history("m")[1:])  # version 1 never stopped
    assert "unload m" not in fake.calls


def test_rollback_seconds_run_from_the_failing_evaluation_to_the_old_versions_loaded() -> None:
    clock = FakeClock()
    fake = serving_one(clock, load_seconds=0.25)
    source = ScriptedFigures(fake, clock, cumulative((10, 90)))
    p = plan_for(desired_state(watched([2])), fake)

    change = only(run(p, fake, clock, source))

    assert change.outcome is Outcome.REVERTED
    assert change.rollback_seconds == pytest.approx(0.25)
    analyze = change.analysis
    assert analyze is not None
    assert change.revert[0].ended_at - analyze.ended_at == pytest.approx(0.25)
    # The first load (0.25s) came before the analysis started, and ticks count from its start.
    assert clock.elapsed == pytest.approx(0.25 + 5.0 + 0.25)


def test_failures_within_the_limit_are_tolerated_and_the_next_one_reverts() -> None:
    fake, clock = serving_one(), FakeClock()
    flaky = cumulative((90, 10), (100, 0), (90, 10), (100, 0))
    source = ScriptedFigures(fake, clock, flaky)
    spec = replace(analysis(SUCCESS_RATE, duration=60.0), failure_limit=1)
    p = plan_for(desired_state(watched([2], spec)), fake)

    change = only(run(p, fake, clock, source))

    assert change.outcome is Outcome.REVERTED
    analyze = change.analysis
    assert analyze is not None
    assert [e.verdict for e in analyze.evaluations] == [Verdict.FAIL, Verdict.PASS, Verdict.FAIL]
    assert clock.elapsed == pytest.approx(15.0)
    assert fake.ready("m") == {1}


def test_metrics_that_cannot_be_read_end_inconclusive_and_revert_without_a_hold() -> None:
    fake, clock = serving_one(), FakeClock()
    down = Figures(error="metrics at http://s1:8002/metrics: connection refused")
    source = ScriptedFigures(fake, clock, [down], old=down)
    desired = desired_state(watched([2]))
    p = plan_for(desired, fake)

    result = run(p, fake, clock, source)
    change = only(result)
    assert holds_from(result, desired, History()) == ()

    assert change.outcome is Outcome.REVERTED
    analyze = change.analysis
    assert analyze is not None and not analyze.ok
    # Inconclusive because the source was down: put back, but nothing is known against the
    # new versions, so they are not held (the next pass analyses again).
    assert analyze.verdict is RolloutVerdict.METRICS_UNAVAILABLE
    # One evaluation without data is one more than inconclusiveLimit (0) allows: the
    # analysis ends there, not at the end of its duration.
    assert len(analyze.evaluations) == 1
    assert {(r.verdict, r.detail) for e in analyze.evaluations for r in e.results} == {
        (Verdict.NO_DATA, down.error)
    }
    assert clock.elapsed == pytest.approx(5.0)
    assert change.error is not None
    assert change.error == (
        "server s1: analysis of m version(s) 2 inconclusive: metrics unavailable "
        f"({down.error}); the old versions serve again, not held: the next pass analyses again"
    )
    assert fake.ready("m") == {1}


def _success_rate_judged(readings: Sequence[Figures]) -> ChangeResult:
    """Version 2 over version 1 on one server, judged by its success rate on ``readings``
    (``ScriptedFigures``: in order, the last repeating)."""
    fake, clock = serving_one(), FakeClock()
    p = plan_for(desired_state(watched([2], analysis(SUCCESS_RATE))), fake)
    return only(run(p, fake, clock, ScriptedFigures(fake, clock, readings)))


def test_evaluations_before_the_new_versions_first_series_are_shown_not_counted() -> None:
    # Prometheus scrapes every scrape_interval: versions READY a moment ago have no series
    # there yet (seen in CI under load: one such evaluation ended the analysis inconclusive).
    unseen = Figures(memory_bytes=1e6)

    change = _success_rate_judged([unseen, unseen, *HEALTHY[1:]])

    assert change.outcome is Outcome.CONVERGED, change.error
    analyze = change.analysis
    assert analyze is not None
    assert [(e.verdict, e.counted) for e in analyze.evaluations] == [
        (Verdict.NO_DATA, False),  # no series yet: shown, not counted
        (Verdict.PASS, True),  # the first window with the series counts from READY
        (Verdict.PASS, True),
        (Verdict.PASS, True),
    ]
    assert "0 of 100 requests" in str(analyze.evaluations[1].results[0]), analyze.evaluations[1]
    # A series that never shows up leaves nothing counted: inconclusive, never a pass.
    never = _success_rate_judged([unseen])
    assert never.outcome is Outcome.REVERTED
    assert never.analysis is not None and never.analysis.verdict is RolloutVerdict.INCONCLUSIVE


def test_a_failed_scrape_between_two_good_ones_is_shown_not_counted() -> None:
    # Prometheus hides every series of a server its last scrape failed on (a busy host, a
    # slow endpoint): seen in CI, one such reading ended a good analysis inconclusive.
    missed = Figures(scrape_failed="Prometheus could not scrape s1 last time (up 0)")
    first, _missed_window, third, fourth = HEALTHY[1:]

    change = _success_rate_judged([HEALTHY[0], first, missed, third, fourth])

    assert change.outcome is Outcome.CONVERGED, change.error
    analyze = change.analysis
    assert analyze is not None
    assert [(e.verdict, e.counted) for e in analyze.evaluations] == [
        (Verdict.PASS, True),
        (Verdict.NO_DATA, False),  # the failed scrape: shown with its reason, not counted
        (Verdict.PASS, True),  # the window runs from the last fresh reading: 200 requests
        (Verdict.PASS, True),
    ]
    assert analyze.evaluations[1].results[0].detail == missed.scrape_failed
    assert "0 of 200 requests" in str(analyze.evaluations[2].results[0]), analyze.evaluations[2]
    # Scrapes that keep failing leave nothing counted: put back, not held (as for a
    # Prometheus that does not answer), never a pass.
    blind = _success_rate_judged([HEALTHY[0], missed])
    assert blind.outcome is Outcome.REVERTED
    assert blind.analysis is not None
    assert blind.analysis.verdict is RolloutVerdict.METRICS_UNAVAILABLE, blind.analysis


@pytest.mark.parametrize("metrics", [{}, {"s2": "another server's source"}])
def test_an_analysis_without_a_metrics_source_for_its_server_reverts(
    metrics: Mapping[str, Any],
) -> None:
    fake, clock = serving_one(), FakeClock()
    p = plan_for(desired_state(watched([2])), fake)

    result = apply(p, {"s1": fake}, timing=Timing(clock.clock, clock.sleep), metrics=metrics)

    change = only(result)
    assert change.outcome is Outcome.REVERTED
    assert change.error == "server s1: no metrics source for the analysis"
    analyze = change.analysis
    assert analyze is not None and analyze.evaluations == ()
    assert analyze.verdict == RolloutVerdict.FAILED
    assert clock.elapsed == 0.0
    assert fake.ready("m") == {1}


def test_a_first_deployment_is_watched_without_a_baseline_and_latency_is_skipped() -> None:
    fake, clock = FakeTriton("s1", {"m": range(1, 7)}), FakeClock()
    source = ScriptedFigures(fake, clock, HEALTHY)
    p = plan_for(desired_state(watched([2])), fake)
    (planned,) = p.changes
    assert planned.steps[2].action is Action.ANALYZE and planned.steps[2].baseline == ()

    change = only(run(p, fake, clock, source))

    assert change.outcome is Outcome.CONVERGED
    # No old versions to read; the one server-wide read (versions ()) is the load's footprint.
    assert all(c.versions in ((2,), ()) for c in source.calls)
    assert sum(c.versions == () for c in source.calls) == 1
    analyze = change.analysis
    assert analyze is not None
    assert {(r.check, r.verdict) for e in analyze.evaluations for r in e.results} == {
        ("success-rate", Verdict.PASS),
        ("latency", Verdict.SKIPPED),
    }
    assert fake.ready("m") == {2}


# -- holds -----------------------------------------------------------------------------------


def hold(
    fingerprint: str = "fp-new", previous: Mapping[str, tuple[int, ...]] | None = None
) -> Hold:
    return Hold(
        "m",
        fingerprint,
        "rev-2",
        "server s1: analysis of m version(s) 2 failed after 1 evaluation(s): ...",
        previous if previous is not None else {"s1": (1,)},
    )


def test_a_held_deployment_keeps_the_previous_versions() -> None:
    fake = serving_one()
    desired = desired_state(watched([2]))

    p = plan_for(desired, fake, History("rev-2", holds={"m": hold()}))

    assert p.changes == ()
    assert p.in_sync == (("s1", "m"),)
    assert p.held == (Held("s1", "m", "m", "rev-2", hold().reason, (1,)),)


def test_a_hold_brings_back_the_previous_versions_without_analysis_or_smoke() -> None:
    fake = FakeTriton("s1", {"m": range(1, 7)})
    fake.serve("m", [1, 2])  # the revert was cut short: the failed version still serves
    clock = FakeClock()
    p = plan_for(desired_state(watched([2])), fake, History("rev-2", holds={"m": hold()}))

    (change,) = p.changes
    assert [(s.action, s.versions) for s in change.steps] == [(Action.UNLOAD, (1,))]
    assert change.steps[0].dropped == (2,)
    result = run(p, fake, clock, None)  # no metrics needed: nothing is analysed
    assert result.ok and fake.ready("m") == {1}


def plan_after_a_hold_on_one_of_two() -> Plan:
    """The next plan after a rollout of 2 that s1 failed (back on 1, m held) and s2 converged."""
    s1, s2 = FakeTriton("s1", {"m": range(1, 7)}), FakeTriton("s2", {"m": range(1, 7)})
    s1.serve("m", [1])
    s2.serve("m", [2])
    both = ["s1", "s2"]
    desired = desired_state(replace(watched([2]), server_names=tuple(both)), servers=both)
    history = History("rev-2", holds={"m": hold()})
    return plan(desired, {"s1": observe(s1), "s2": observe(s2)}, history, "rev-3")


def test_a_hold_leaves_servers_that_took_no_part_alone() -> None:
    p = plan_after_a_hold_on_one_of_two()

    assert p.changes == ()
    assert p.in_sync == (("s1", "m"), ("s2", "m"))
    assert [h.server for h in p.held if h.versions] == ["s1"]


def test_a_changed_fingerprint_releases_the_hold() -> None:
    fake = serving_one()
    desired = desired_state(watched([3], fingerprint="fp-newer"))

    p = plan_for(desired, fake, History("rev-2", holds={"m": hold("fp-new")}))

    assert p.held == ()
    (change,) = p.changes
    assert [s.action for s in change.steps] == [
        Action.LOAD,
        Action.VERIFY,
        Action.ANALYZE,
        Action.UNLOAD,
    ]
    assert change.desired == (3,)


def test_a_server_the_hold_does_not_name_is_not_reported_as_held_at_nothing() -> None:
    p = plan_after_a_hold_on_one_of_two()

    assert [(h.server, h.versions) for h in p.held if h.server == "s2"] in ([], [("s2", (2,))])
