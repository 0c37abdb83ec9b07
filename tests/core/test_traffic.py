"""Traffic rollouts on the fakes: what the planner decides (pools, phases, the route back,
drift, a router that does not answer or is busy), what the executor does with a router
(the order of its updates, the switch back before anything is put back, the router's
figures in the analysis), and the manifest checks, each naming its file and line."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import pytest

from reconciler.core.plan.planner import plan
from reconciler.core.spec.desired import load_desired_state
from reconciler.engine.apply import apply
from reconciler.engine.context import Timing
from reconciler.model.analysis import (
    AnalysisSpec,
    Check,
    EarlyAbort,
    Figures,
    NoTraffic,
    PoolFigures,
    ProbeSpec,
)
from reconciler.model.errors import RouterUnavailable, ValidationError
from reconciler.model.history import History
from reconciler.model.plan import Action, Plan, Step
from reconciler.model.results import ApplyResult, FailureKind, Outcome
from reconciler.model.servers import TritonServer
from reconciler.model.spec import DesiredState, RolloutSpec
from reconciler.model.traffic import (
    EnvoyRoute,
    Pool,
    RouterSpec,
    RouteState,
    Strategy,
    TrafficSpec,
)
from reconciler.views.render import plan_text
from tests.core.fakes import FakeClock, FakeTriton, deploy, observe

NO_QUERIES: Mapping[str, str] = MappingProxyType({})
ANALYSIS = AnalysisSpec(
    1.0,
    2.0,
    0,
    NoTraffic.WAIT,
    (Check("success-rate", "successRate", min=0.99),),
    probes=ProbeSpec(enabled=False),
    early_abort=EarlyAbort(every=0.0),
)
ROUTER = RouterSpec(
    "edge",
    (Pool("stable", server_names=("a", "b")), Pool("canary", server_names=("c",))),
    envoy=EnvoyRoute("http://127.0.0.1:1", "routing.triton", "mirror.triton"),
)
CANARY = TrafficSpec("edge", Strategy.CANARY, ("stable", "canary"), (100, 5_000), mirror=1_000)


class FakeRouter:
    """A TrafficRouter in memory: every update recorded; ``failing``: the share of routed
    requests to the canary pool that fail, as the router counts them. Its identity is
    Envoy's: a marker each update writes, which ``restart`` loses with the weights set and
    the statistics."""

    def __init__(self, weights: Mapping[str, int], failing: float = 0.0) -> None:
        self.defaults = dict(weights)
        self.weights = dict(weights)
        self.mirror = {p: 0 for p in weights}
        self.updates: list[tuple[dict[str, int], dict[str, int]]] = []
        self.failing = failing
        self.down = False
        self.reads = 0
        self.marker = ""
        self.identities_read = 0

    def restart(self) -> None:
        """Back at the config's defaults, nothing mirrored, the statistics started again."""
        self.weights, self.mirror = dict(self.defaults), {p: 0 for p in self.defaults}
        self.marker, self.reads = "", 0

    def observe(self) -> RouteState:
        if self.down:
            return RouteState("edge", False, error="router edge: not reachable (refused)")
        return RouteState("edge", True, dict(self.weights), dict(self.mirror))

    def route(self, weights: Mapping[str, int], mirror: Mapping[str, int]) -> str | None:
        if self.down:
            raise RouterUnavailable("router edge: not reachable (refused)")
        self.weights, self.mirror = dict(weights), {**self.mirror, **mirror}
        self.updates.append((dict(weights), dict(mirror)))
        self.marker = f"update {len(self.updates)}"
        return self.marker

    def identity(self) -> str | None:
        self.identities_read += 1
        if self.down:
            raise RouterUnavailable("router edge: not reachable (refused)")
        return self.marker

    def close(self) -> None:
        pass

    def figures(self, pools: Iterable[str]) -> Mapping[str, PoolFigures]:
        self.reads += 1
        total = 100.0 * self.reads if self.weights.get("canary") else 0.0
        ok = total * (1 - self.failing)
        return {p: PoolFigures(total, ok, None, None) for p in pools}


class Counters:
    """Triton's counters: every read, 100 more requests answered OK (in 100us each)."""

    def __init__(self) -> None:
        self.reads = 0

    def figures(
        self, model: str, versions: tuple[int, ...], queries: Mapping[str, str] = NO_QUERIES
    ) -> Figures:
        self.reads += 1
        return Figures(success=100.0 * self.reads, duration_us=1e4 * self.reads, memory_bytes=1e6)


def desired(traffic: TrafficSpec = CANARY, router: RouterSpec = ROUTER) -> DesiredState:
    deployment = replace(
        deploy("m", [2], servers=("a", "b", "c")),
        analysis=ANALYSIS,
        rollout=RolloutSpec(traffic=traffic),
        fingerprint="fp-2",
    )
    servers = [TritonServer(s, f"{s}:8001", model_repository=f"/models/{s}") for s in "abc"]
    return DesiredState.build(servers, [deployment], [router])


def fakes(serving: Sequence[int] = (1,)) -> dict[str, FakeTriton]:
    out = {}
    for name in "abc":
        fake = FakeTriton(name, {"m": range(1, 5)})
        if serving:
            fake.serve("m", serving)
        out[name] = fake
    return out


@dataclass
class Pass:
    desired: DesiredState
    fakes: dict[str, FakeTriton]
    router: FakeRouter
    clock: FakeClock = field(default_factory=FakeClock)

    def plan(self) -> Plan:
        serving = {name: observe(fake) for name, fake in self.fakes.items()}
        return plan(self.desired, serving, History(), "rev", routes={"edge": self.router.observe()})

    def run(self) -> tuple[Plan, ApplyResult]:
        planned = self.plan()
        timing = Timing(clock=self.clock.clock, sleep=self.clock.sleep)
        metrics = {name: Counters() for name in self.fakes}
        result = apply(
            planned, self.fakes, timing=timing, metrics=metrics, routers={"edge": self.router}
        )
        return planned, result


def at_rest() -> FakeRouter:
    return FakeRouter({"stable": 10_000, "canary": 0})


# -- the plan ------------------------------------------------------------------------------


def test_a_canary_is_planned_pool_by_pool_with_its_phases_and_the_route_back() -> None:
    planned = Pass(desired(), fakes(), at_rest()).plan()
    (rollout,) = planned.rollouts
    assert rollout.stages == (("c",), ("a", "b"))
    assert rollout.stage_names == ("canary pool", "stable pool")
    assert rollout.baselines == (("a", "b"), ())  # the canary is compared with the stable pool
    traffic = rollout.traffic
    assert traffic is not None
    assert [p.name for p in traffic.phases] == [
        "mirror 10% to canary",
        "step 1 of 2: canary 1%",
        "step 2 of 2: canary 50%",
    ]
    assert dict(traffic.phases[0].weights) == {"stable": 10_000, "canary": 0}
    assert dict(traffic.phases[0].mirror) == {"stable": 0, "canary": 1_000}
    assert dict(traffic.phases[1].weights) == {"stable": 9_900, "canary": 100}
    assert (
        dict(traffic.restore.weights)
        == dict(traffic.final.weights)
        == {
            "stable": 10_000,
            "canary": 0,
        }
    )
    # The analysis runs under each phase on the canary, not as a step of any change.
    assert [s.server for s in rollout.analyses] == ["c"]
    assert all(s.action is not Action.ANALYZE for s in planned.steps)
    assert planned.routes == ()


def test_with_probes_a_canary_is_probed_at_no_traffic_for_an_interval_first() -> None:
    state = desired(replace(CANARY, mirror=0))
    probed = replace(state.deployments["m"], analysis=replace(ANALYSIS, probes=ProbeSpec()))
    state = DesiredState.build(list(state.servers.values()), [probed], [ROUTER])
    (rollout,) = Pass(state, fakes(), at_rest()).plan().rollouts
    assert rollout.traffic is not None
    first = rollout.traffic.phases[0]
    assert (first.name, first.watch) == ("canary at no traffic (probes)", ANALYSIS.interval)
    assert dict(first.weights) == {"stable": 10_000, "canary": 0}


def test_a_streaming_canary_with_a_latency_check_is_probed_at_no_traffic_for_the_duration() -> None:
    """A streaming model's time to the first response is judged by the probes only where
    the loads compare, at no traffic: one interval held two 0.5 s streams a side, too few."""
    state = desired(replace(CANARY, mirror=0))
    analysis = replace(
        ANALYSIS,
        probes=ProbeSpec(),
        checks=(*ANALYSIS.checks, Check("first-response", "latency", max_increase=1.0)),
    )
    streaming = replace(
        state.deployments["m"],
        analysis=analysis,
        config={"model_transaction_policy": {"decoupled": True}},
    )
    unary = replace(streaming, config={})
    watches = []
    for deployment in (streaming, unary):
        built = DesiredState.build(list(state.servers.values()), [deployment], [ROUTER])
        (rollout,) = Pass(built, fakes(), at_rest()).plan().rollouts
        assert rollout.traffic is not None
        first = rollout.traffic.phases[0]
        assert first.name == "canary at no traffic (probes)", first
        watches.append(first.watch)
    assert watches == [ANALYSIS.duration, ANALYSIS.interval], watches


def test_blue_green_loads_the_idle_pool_and_switches_to_it() -> None:
    pools = RouterSpec(
        "edge",
        (Pool("blue", server_names=("a",)), Pool("green", server_names=("b", "c"))),
        envoy=ROUTER.envoy,
    )
    switch = TrafficSpec("edge", Strategy.BLUE_GREEN, ("blue", "green"), (10_000,), keep_old=30)
    analysis = replace(ANALYSIS, probes=ProbeSpec())
    state = desired(switch, pools)
    state = replace(
        state,
        deployments={"m": replace(state.deployments["m"], analysis=analysis)},
        placements={
            s: {m: replace(p, deployment=replace(p.deployment, analysis=analysis))}
            for s, ps in state.placements.items()
            for m, p in ps.items()
        },
    )
    # green is live now: blue is idle and takes the new versions first.
    planned = Pass(state, fakes(), FakeRouter({"blue": 0, "green": 10_000})).plan()
    (rollout,) = planned.rollouts
    traffic = rollout.traffic
    assert traffic is not None
    assert (traffic.old_pool, traffic.new_pool) == ("green", "blue")
    assert rollout.stages == (("a",), ("b", "c"))
    assert [(p.name, p.watch) for p in traffic.phases] == [
        ("blue at no traffic (probes)", 2.0),
        ("switch 1 of 1: blue 100%", 30.0),  # keepOld outlasts the analysis
    ]
    assert dict(traffic.final.weights) == {"blue": 10_000, "green": 0}
    assert dict(traffic.restore.weights) == {"blue": 0, "green": 10_000}


def test_a_router_that_does_not_answer_holds_its_rollouts_and_touches_nothing() -> None:
    router = at_rest()
    router.down = True
    planned = Pass(desired(), fakes(), router).plan()
    assert planned.changes == () and planned.rollouts == ()
    assert {p.server for p in planned.problems} == {"a", "b", "c"}
    assert all("router edge: not reachable" in p.message for p in planned.problems)
    assert all("traffic left where it is" in p.message for p in planned.problems)


def test_drift_from_the_route_at_rest_is_planned_back() -> None:
    router = FakeRouter({"stable": 7_000, "canary": 3_000})
    planned = Pass(desired(), fakes((2,)), router).plan()
    assert planned.changes == ()
    (update,) = planned.routes
    assert dict(update.weights) == {"stable": 10_000, "canary": 0}
    assert "routes canary 30%, stable 70%" in update.reason
    assert planned.has_changes
    assert Pass(desired(), fakes((2,)), at_rest()).plan().routes == ()


def test_a_first_deployment_loads_everywhere_without_phases() -> None:
    (rollout,) = Pass(desired(), fakes(()), at_rest()).plan().rollouts
    assert rollout.traffic is not None and rollout.traffic.phases == ()
    assert rollout.analyses == ()


def test_a_version_below_the_old_takes_the_new_pool_alone_before_any_traffic() -> None:
    run = Pass(replace_traffic(desired(), replace(CANARY, mirror=0)), fakes((3,)), at_rest())
    planned = run.plan()
    traffic = planned.rollouts[0].traffic
    assert traffic is not None and traffic.drop_old_first == ("c",)
    assert planned.rollouts[0].analyses[0].baseline == (3,)
    _, result = run.run()
    assert result.ok, [c.error for c in result.changes]
    # c served 2 alone before the router sent it anything (Triton answers unversioned
    # requests with the highest READY version: beside 3, 2 would have taken none).
    c = next(r for r in result.changes if r.change.server == "c")
    actions = [s.step.action for s in c.steps]
    assert actions.index(Action.UNLOAD) < actions.index(Action.ROUTE, 1)


def test_a_version_below_the_old_is_probed_against_the_old_pool_once_its_own_old_left() -> None:
    """Once c's old version is unloaded (it would take c's share of unversioned requests),
    c's phases compare with that version where it still serves, on the old pool: no probe
    and no interface read goes to the version c no longer has (Triton's unload is
    asynchronous; it was a race that left the phase with no probe, test_sequence_rollout)."""
    state = desired(replace(CANARY, mirror=0))
    probed = replace(state.deployments["m"], analysis=replace(ANALYSIS, probes=ProbeSpec()))
    built = DesiredState.build(list(state.servers.values()), [probed], [ROUTER])
    run = Pass(built, fakes((3,)), at_rest())
    planned = run.plan()
    traffic = planned.rollouts[0].traffic
    assert traffic is not None and traffic.drop_old_first == ("c",)
    assert traffic.old_probed_on == "a"
    assert "the phases after probe them on a" in plan_text(planned)
    _, result = run.run()
    assert result.ok, [c.error for c in result.changes]
    c, a = run.fakes["c"].calls, run.fakes["a"].calls
    # c's second load is the unload of 3 (the config naming 2 alone).
    unloaded = [i for i, call in enumerate(c) if call == "load m"][1]
    after = [call for call in c[unloaded:] if call in ("infer m 3", "interface m 3")]
    assert after == [], f"c was asked of version 3 after its unload: {after}"
    # ... and c's later phases probed 2 there.
    assert "infer m 2" in c[unloaded:], c[unloaded:]
    # The later phases' synthesized request was tried on and compared with 3 on a, before
    # a's own change (its stage comes after the phases).
    before_own = a[: a.index("load m")]
    assert "infer m 3" in before_own, before_own
    changed = next(r for r in result.changes if r.change.server == "c")
    analyses = [s for s in changed.steps if s.step.action is Action.ANALYZE]
    assert len(analyses) == 3 and all(s.ok for s in analyses), [s.error for s in analyses]
    assert "since then 3 unloaded here; its probes compare with 3 on a" in analyses[1].step.reason


def test_a_canary_left_with_both_versions_by_a_stopped_pass_is_analysed_again() -> None:
    cut_short = fakes()
    cut_short["c"].serve("m", (1, 2))  # loaded beside 1, then the reconciler was killed
    run = Pass(replace_traffic(desired(), replace(CANARY, mirror=0)), cut_short, at_rest())
    (rollout,) = run.plan().rollouts
    assert rollout.stages[0] == ("c",)
    assert [(s.server, s.versions, s.baseline) for s in rollout.analyses] == [("c", (2,), (1,))]
    _, result = run.run()
    assert result.ok
    assert [w["canary"] for w, _ in run.router.updates] == [0, 100, 5_000, 0]


# -- the executor --------------------------------------------------------------------------


def test_a_good_canary_sets_each_phase_then_the_final_route() -> None:
    run = Pass(desired(), fakes(), at_rest())
    _, result = run.run()
    assert result.ok, [c.error for c in result.changes]
    canary = [w["canary"] for w, _ in run.router.updates]
    mirrored = [m.get("canary", 0) for _, m in run.router.updates]
    # At rest, the mirror phase, 1%, 50%, then back to the stable pool (now on 2 too).
    assert canary == [0, 0, 100, 5_000, 0]
    assert mirrored == [0, 1_000, 0, 0, 0]
    for fake in run.fakes.values():
        assert observe(fake).model("m").ready == {2}
    c = next(r for r in result.changes if r.change.server == "c")
    assert [s.step.action for s in c.steps].count(Action.ANALYZE) == 3
    # The router's figures were read in the analysis and judged.
    assert run.router.reads > 0
    last = c.analysis
    assert last is not None and "router: 0 of" in str(last.evaluations[-1].results[0])


class Routes:
    """Apply's step events, keeping only the routes it says it set."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, int], dict[str, int]]] = []

    def started(self, step: Step, reverting: bool) -> None:
        pass

    def evaluated(self, step: Step, evaluation: object, seconds_left: float) -> None:
        pass

    def routed(self, router: str, weights: Mapping[str, int], mirror: Mapping[str, int]) -> None:
        self.seen.append((router, dict(weights), dict(mirror)))


def test_every_route_set_is_told_to_the_events_with_its_router() -> None:
    run = Pass(desired(), fakes(), at_rest())
    events = Routes()
    timing = Timing(clock=run.clock.clock, sleep=run.clock.sleep, events=events)
    metrics = {name: Counters() for name in run.fakes}
    result = apply(run.plan(), run.fakes, timing=timing, metrics=metrics,
                   routers={"edge": run.router})  # fmt: skip
    assert result.ok
    # What the router was sent, in order, is what the events heard (for the metrics).
    assert [(w, m) for _, w, m in events.seen] == [
        (dict(w), dict(m)) for w, m in run.router.updates
    ]
    assert {router for router, _, _ in events.seen} == {"edge"}


def test_a_failing_canary_is_switched_back_before_anything_is_put_back() -> None:
    run = Pass(replace_traffic(desired(), replace(CANARY, mirror=0)), fakes(), at_rest())
    run.router.failing = 0.5  # half the canary's routed requests fail, as clients see them
    _, result = run.run()
    outcomes = {c.change.server: c.outcome for c in result.changes}
    assert outcomes == {"a": Outcome.SKIPPED, "b": Outcome.SKIPPED, "c": Outcome.REVERTED}
    # At rest, 1%: failed; then the switch back.
    assert [w["canary"] for w, _ in run.router.updates] == [0, 100, 0]
    c = next(r for r in result.changes if r.change.server == "c")
    assert c.revert[0].step.action is Action.ROUTE and "switch back" in c.revert[0].step.reason
    assert c.failure is FailureKind.AGAINST_VERSIONS
    assert "router: " in (c.error or "")
    assert observe(run.fakes["c"]).model("m").ready == {1}


class NoClients(FakeRouter):
    """A router whose clients send nothing: its statistics never move."""

    def figures(self, pools: Iterable[str]) -> Mapping[str, PoolFigures]:
        self.reads += 1
        return {p: PoolFigures(0.0, 0.0, None, None) for p in pools}


class Idle:
    """Triton's counters of a model no client calls (the probes aside, which are not
    counted here: only the probes' own count is evidence)."""

    def figures(
        self, model: str, versions: tuple[int, ...], queries: Mapping[str, str] = NO_QUERIES
    ) -> Figures:
        return Figures(success=0.0, duration_us=0.0, memory_bytes=1e6)


def _timed_canary(
    analysis: AnalysisSpec, traffic: TrafficSpec, router: FakeRouter, seconds: float
) -> Pass:
    """A canary rollout of ``m`` 1 -> 2 with ``analysis``, on fakes whose every answer takes
    ``seconds`` on the pass's clock."""
    state = replace_traffic(desired(), traffic)
    analysed = replace(state.deployments["m"], analysis=analysis)
    state = DesiredState.build(list(state.servers.values()), [analysed], [ROUTER])
    run = Pass(state, fakes(), router)
    clock = run.clock

    class Timed(FakeTriton):
        def infer(self, *args: object, **kwargs: object) -> dict[str, object]:  # type: ignore[override]
            clock.sleep(seconds)
            return super().infer(*args, **kwargs)  # type: ignore[arg-type]

    for name, fake in run.fakes.items():
        timed = Timed(name, {"m": range(1, 5)})
        timed.serve("m", observe(fake).model("m").ready)
        run.fakes[name] = timed
    return run


def _slow_canary(interval: float) -> tuple[Pass, ApplyResult]:
    """A canary of a model that answers in 100 ms, with no client traffic: only the probes
    reach the new version, one every 2 s (maxShare 0.05), for each phase's ``interval``."""
    analysis = replace(
        ANALYSIS, interval=interval, duration=interval, probes=ProbeSpec(), min_evidence=10
    )
    traffic = replace(CANARY, mirror=0, steps=(1_000, 5_000))
    run = _timed_canary(analysis, traffic, NoClients({"stable": 10_000, "canary": 0}), 0.1)
    clock = run.clock
    planned = run.plan()
    timing = Timing(clock=clock.clock, sleep=clock.sleep)
    metrics = {name: Idle() for name in run.fakes}
    result = apply(planned, run.fakes, timing=timing, metrics=metrics, routers={"edge": run.router})
    return run, result


def test_a_slow_good_canary_passes_on_the_evidence_of_all_its_phases() -> None:
    # The probe-only phase alone gets 6 probes in 10 s (minEvidence 10): it used to end the
    # rollout inconclusive; the phases together give 18.
    run, result = _slow_canary(10.0)
    c = next(r for r in result.changes if r.change.server == "c")
    assert result.ok, (c.error, [str(e) for s in c.steps for e in s.evaluations])
    assert [w["canary"] for w, _ in run.router.updates] == [0, 0, 1_000, 5_000, 0]
    for fake in run.fakes.values():
        assert observe(fake).model("m").ready == {2}


def test_too_little_evidence_over_all_phases_is_inconclusive_and_says_why() -> None:
    run, result = _slow_canary(2.0)
    c = next(r for r in result.changes if r.change.server == "c")
    assert not result.ok
    assert c.outcome is Outcome.REVERTED, c
    error = c.error or ""
    # Judged once, in the last phase, over all of them; the message says what the probes
    # could do at this model's speed.
    assert "inconclusive" in error and "in earlier phases" in error, error
    assert "the probes alone reach about" in error and "a probe took 100ms" in error, error
    assert [w["canary"] for w, _ in run.router.updates] == [0, 0, 1_000, 5_000, 0], error


class IdleCanary:
    """Triton's counters: the canary's new version answers in 5 ms (an idle instance woken
    by each probe), everything else in 0.1 ms (warm client traffic)."""

    def __init__(self, server: str) -> None:
        self.server, self.reads = server, 0

    def figures(
        self, model: str, versions: tuple[int, ...], queries: Mapping[str, str] = NO_QUERIES
    ) -> Figures:
        self.reads += 1
        each = 5_000.0 if self.server == "c" and versions == (2,) else 100.0
        return Figures(success=30.0 * self.reads, duration_us=30 * each * self.reads)


def test_at_no_traffic_the_canarys_latency_is_judged_by_the_probes_new_against_old() -> None:
    # Seen with a CPU burner: an idle canary's counters (probes only) against the stable
    # pool's warm clients reverted good versions. The probes, sent to the new and the old
    # version on the canary alike, compare like with like.
    latency = Check("latency", "latency", max_increase=0.5)
    analysis = replace(
        ANALYSIS, checks=(*ANALYSIS.checks, latency), probes=ProbeSpec(), duration=3.0
    )
    run = _timed_canary(analysis, replace(CANARY, mirror=0), at_rest(), 0.002)
    clock = run.clock
    timing = Timing(clock=clock.clock, sleep=clock.sleep)
    metrics = {name: IdleCanary(name) for name in run.fakes}
    result = apply(
        run.plan(), run.fakes, timing=timing, metrics=metrics, routers={"edge": run.router}
    )

    c = next(r for r in result.changes if r.change.server == "c")
    first = next(s for s in c.steps if s.step.action is Action.ANALYZE)
    details = [str(r) for e in first.evaluations for r in e.results if r.check == "latency"]
    assert "at no traffic" in first.step.reason, first.step.reason
    assert details and all("probes" in d for d in details), details
    assert all("fail" not in d for d in details), details


def test_a_router_lost_mid_rollout_stops_it_as_transient() -> None:
    run = Pass(replace_traffic(desired(), replace(CANARY, mirror=0)), fakes(), at_rest())

    class Flaky(FakeRouter):
        def figures(self, pools: Iterable[str]) -> Mapping[str, PoolFigures]:
            if self.weights.get("canary"):
                raise RouterUnavailable("router edge: not reachable (refused)")
            return super().figures(pools)

    run.router = Flaky({"stable": 10_000, "canary": 0})
    _, result = run.run()
    c = next(r for r in result.changes if r.change.server == "c")
    assert c.outcome is Outcome.REVERTED
    assert c.failure is FailureKind.SERVER_LOST  # nothing known against version 2: no hold


class RestartAt:
    """Apply's step events and its clock, restarting the router at a moment of the canary's
    phase at no traffic (the route there is the router's default: a restarted router routes
    exactly as that phase set it): ``between_reads``, at the first sleep of its analysis;
    else right after its last evaluation, before the phase passes."""

    def __init__(self, run: Pass, between_reads: bool) -> None:
        self.run, self.between_reads, self.restarted = run, between_reads, False

    def _at_no_traffic(self) -> bool:
        return len(self.run.router.updates) == 2  # the route at rest, then this phase's

    def sleep(self, seconds: float) -> None:
        self.run.clock.sleep(seconds)
        if self.between_reads and self._at_no_traffic() and not self.restarted:
            self.restarted = True
            self.run.router.restart()

    def started(self, step: Step, reverting: bool) -> None:
        pass

    def evaluated(self, step: Step, evaluation: object, seconds_left: float) -> None:
        if not self.between_reads and self._at_no_traffic() and not self.restarted:
            assert seconds_left == 0  # its only evaluation: the analysis passes on it
            self.restarted = True
            self.run.router.restart()

    def routed(self, router: str, weights: Mapping[str, int], mirror: Mapping[str, int]) -> None:
        pass


def _restarted_at_no_traffic(between_reads: bool) -> tuple[Pass, ApplyResult]:
    state = replace_traffic(desired(), replace(CANARY, mirror=0))
    probed = replace(state.deployments["m"], analysis=replace(ANALYSIS, probes=ProbeSpec()))
    run = Pass(DesiredState.build(list(state.servers.values()), [probed], [ROUTER]), fakes(),
               at_rest())  # fmt: skip
    restart = RestartAt(run, between_reads)
    timing = Timing(clock=run.clock.clock, sleep=restart.sleep, events=restart)
    metrics = {name: Counters() for name in run.fakes}
    planned = run.plan()
    traffic = planned.rollouts[0].traffic
    assert traffic is not None and traffic.phases[0].name == "canary at no traffic (probes)"
    result = apply(planned, run.fakes, timing=timing, metrics=metrics, routers={"edge": run.router})
    assert restart.restarted
    return run, result


@pytest.mark.parametrize("between_reads", [True, False], ids=["mid-analysis", "before-passing"])
def test_a_router_restarted_under_a_phase_stops_the_rollout_though_it_routes_as_set(
    between_reads: bool,
) -> None:
    # Issue 41, point 5: a restarted Envoy comes back at its defaults, which is what the
    # phase at no traffic set, and its statistics start again; read between two of the
    # analysis's readings (or after its last), nothing but its identity tells.
    run, result = _restarted_at_no_traffic(between_reads)
    assert not result.ok
    c = next(r for r in result.changes if r.change.server == "c")
    assert c.outcome is Outcome.REVERTED
    assert c.failure is FailureKind.SERVER_LOST  # nothing known against version 2: no hold
    error = c.error or ""
    assert "router edge restarted since the route of canary at no traffic (probes)" in error
    failed = c.steps[-1]
    # Mid-analysis: at its next reading, an evaluation's or an early abort's poll; after
    # its last evaluation: by the check before the phase passes.
    assert failed.step.action is (Action.ANALYZE if between_reads else Action.ROUTE), failed
    assert between_reads or "read back" in failed.step.reason
    # No further phase: at rest, at no traffic, then the switch back.
    assert [w["canary"] for w, _ in run.router.updates] == [0, 0, 0]
    for fake in run.fakes.values():
        assert observe(fake).model("m").ready == {1}


def test_the_same_router_answering_throughout_passes_each_phase_on_its_identity() -> None:
    run = Pass(replace_traffic(desired(), replace(CANARY, mirror=0)), fakes(), at_rest())
    _, result = run.run()
    assert result.ok, [c.error for c in result.changes]
    # Read at every reading of each phase's analysis, and once more before it passed.
    assert run.router.identities_read >= 2 * 2


def test_a_router_with_no_identity_is_not_checked_for_one() -> None:
    # The Gateway API's: its route is an object the API server keeps, which no restart of
    # the Gateway undoes.
    class Declarative(FakeRouter):
        def route(self, weights: Mapping[str, int], mirror: Mapping[str, int]) -> None:
            super().route(weights, mirror)

        def identity(self) -> None:
            raise AssertionError("no identity to read")

    run = Pass(replace_traffic(desired(), replace(CANARY, mirror=0)), fakes(),
               Declarative({"stable": 10_000, "canary": 0}))  # fmt: skip
    _, result = run.run()
    assert result.ok, [c.error for c in result.changes]


def replace_traffic(state: DesiredState, traffic: TrafficSpec) -> DesiredState:
    deployment = replace(
        state.deployments["m"],
        rollout=replace(state.deployments["m"].rollout, traffic=traffic),
    )
    return DesiredState.build(
        list(state.servers.values()), [deployment], list(state.routers.values())
    )


# -- the manifests -------------------------------------------------------------------------

SERVERS = "".join(
    f"apiVersion: triton-gitops/v1alpha1\nkind: TritonServer\nmetadata: {{name: {s}}}\n"
    f"spec: {{grpc: '127.0.0.1:{i}', modelRepository: /m}}\n---\n"
    for i, s in enumerate("abc", 1)
)
ROUTER_DOC = """\
apiVersion: triton-gitops/v1alpha1
kind: Router
metadata: {name: edge}
spec:
  envoy: {admin: "http://127.0.0.1:9901"}
  pools:
    - {name: stable, servers: {names: [a, b]}}
    - {name: canary, servers: {names: [c]}}
"""


def deployment_doc(traffic: str, analysis: bool = True, servers: str = "[a, b, c]") -> str:
    return (
        "apiVersion: triton-gitops/v1alpha1\nkind: ModelDeployment\nmetadata: {name: m}\n"
        f"spec:\n  servers: {{names: {servers}}}\n  versions: [2]\n"
        + (
            "  verify:\n    analysis: {interval: 1s, duration: 2s, checks: "
            "[{name: ok, successRate: {min: 0.9}}]}\n"
            if analysis
            else ""
        )
        + f"  rollout:\n    traffic: {traffic}\n"
    )


def problems(*docs: str) -> list[str]:
    files = {"servers.yaml": SERVERS.encode(), "router.yaml": ROUTER_DOC.encode()}
    files.update({f"d{i}.yaml": doc.encode() for i, doc in enumerate(docs)})
    with pytest.raises(ValidationError) as caught:
        load_desired_state(files)
    return [str(p) for p in caught.value.problems]


CANARY_DOC = "{router: edge, strategy: canary, stablePool: stable, canaryPool: canary, steps: [1%]}"


def test_a_valid_traffic_rollout_loads() -> None:
    files = {
        "servers.yaml": SERVERS.encode(),
        "router.yaml": ROUTER_DOC.encode(),
        "m.yaml": deployment_doc(CANARY_DOC).encode(),
    }
    state = load_desired_state(files)
    traffic = state.deployments["m"].rollout.traffic
    assert traffic is not None and traffic.steps == (100,)
    assert state.routers["edge"].pool_of(state.servers["c"]) == "canary"


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (
            deployment_doc(CANARY_DOC.replace("router: edge", "router: gone")),
            "d0.yaml:10: ModelDeployment 'm': unknown Router 'gone' (known: edge)",
        ),
        (
            deployment_doc(CANARY_DOC.replace("canaryPool: canary", "canaryPool: green")),
            "d0.yaml:10: ModelDeployment 'm': Router 'edge' has no pool 'green'",
        ),
        (
            deployment_doc(CANARY_DOC, analysis=False),
            "d0.yaml:8: ModelDeployment 'm': rollout.traffic needs spec.verify.analysis",
        ),
        (
            deployment_doc(CANARY_DOC.replace("steps: [1%]", "steps: [50%, 5%]")),
            "d0.yaml:10: ModelDeployment 'm': traffic steps must grow",
        ),
        (
            deployment_doc(
                "{router: edge, strategy: canary, stablePool: stable, canaryPool: canary}"
            ),
            "d0.yaml:10: spec.rollout.traffic: 'steps' is a required property",
        ),
    ],
)
def test_traffic_mistakes_are_named_with_their_file_and_line(doc: str, expected: str) -> None:
    found = problems(doc)
    assert any(expected in p for p in found), found


def test_a_selected_server_outside_the_pools_is_named() -> None:
    extra = SERVERS + (
        "apiVersion: triton-gitops/v1alpha1\nkind: TritonServer\nmetadata: {name: d}\n"
        "spec: {grpc: '127.0.0.1:9', modelRepository: /m}\n"
    )
    files = {
        "servers.yaml": extra.encode(),
        "router.yaml": ROUTER_DOC.encode(),
        "m.yaml": deployment_doc(CANARY_DOC, servers="[a, b, c, d]").encode(),
    }
    with pytest.raises(ValidationError) as caught:
        load_desired_state(files)
    assert any(
        "m.yaml:5: ModelDeployment 'm': server(s) d are selected but stand in neither pool"
        in str(p)
        for p in caught.value.problems
    ), caught.value.problems
