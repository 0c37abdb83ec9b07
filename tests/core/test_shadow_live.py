"""Live shadow traffic on the fakes (issue 31): the comparison's checks (``core/shadow.py``),
the shadow phase the planner puts first (``core/plan/traffic.py``), the executor running the
comparator's session around it, and the manifest checks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from reconciler.core.shadow import shadow_checks, short_of_requests
from reconciler.core.spec.desired import load_desired_state, read_manifests
from reconciler.model.analysis import ProbeSpec, RolloutVerdict, Verdict
from reconciler.model.errors import ValidationError
from reconciler.model.plan import Action, Exchange
from reconciler.model.results import FailureKind, Outcome
from reconciler.model.shadow import (
    Comparison,
    LiveShadow,
    ShadowFigures,
    ShadowTarget,
    Tolerance,
    WhenShort,
)
from reconciler.model.spec import DesiredState, SequencePolicy
from reconciler.model.traffic import SequenceAffinity
from reconciler.views.render import plan_json, plan_text
from tests.core.test_traffic import ANALYSIS, CANARY, ROUTER, Pass, at_rest, desired, fakes

SHADOW = LiveShadow(share=1_000, tolerance=Tolerance(rtol=1e-3), min_requests=100)


def figures(compared: int, candidate: int = 0, noise: int = 0, **kw: object) -> ShadowFigures:
    comparison = Comparison(compared, candidate, noise, "output OUTPUT0: 1 of 4 value(s) ...")
    return ShadowFigures(received=compared, comparison=comparison, **kw)  # type: ignore[arg-type]


# -- the checks --------------------------------------------------------------------------


def test_the_comparison_is_shown_but_not_judged_before_min_requests() -> None:
    (answers,) = shadow_checks(SHADOW, figures(40, candidate=10))
    assert answers.verdict is Verdict.SKIPPED
    assert answers.detail.startswith("waiting: 40 of 40 mirrored request(s) compared")


def test_disagreement_beyond_the_noise_fails_and_noise_alike_passes() -> None:
    (caught,) = shadow_checks(SHADOW, figures(200, candidate=4))
    assert caught.verdict is Verdict.FAIL and caught.value == pytest.approx(0.02)
    assert "2.0% beyond the noise, at most 1.0% allowed" in caught.detail
    # The serving version disagrees with itself as often: nothing beyond the noise.
    (noisy,) = shadow_checks(SHADOW, figures(200, candidate=30, noise=29))
    assert noisy.verdict is Verdict.PASS, noisy


def test_the_latency_part_is_judged_on_the_declared_quantile_of_interleaved_calls() -> None:
    spec = replace(SHADOW, max_latency_increase=0.5, latency_quantile="p99")
    primary = tuple([0.010] * 99 + [0.012])
    comparison = Comparison(100, 0, 0, "", primary, tuple(2 * s for s in primary))
    _, latency = shadow_checks(spec, ShadowFigures(received=100, comparison=comparison))
    assert latency.check == "shadow-latency" and latency.verdict is Verdict.FAIL
    assert latency.detail.startswith("p99 latency 20.00 ms against 10.00 ms (+100%")
    faster = replace(comparison, candidate_seconds=primary)
    _, same = shadow_checks(spec, ShadowFigures(received=100, comparison=faster))
    assert same.verdict is Verdict.PASS and "p50 10.00ms vs 10.00ms" in same.detail


def test_short_of_requests_waits_up_to_max_wait_or_fails_as_the_manifest_says() -> None:
    short, enough = figures(10), figures(100)
    assert short_of_requests(SHADOW, enough, 60.0, 60.0) is None
    assert short_of_requests(SHADOW, short, 60.0, 60.0) is RolloutVerdict.RUNNING
    assert short_of_requests(SHADOW, short, 360.0, 60.0) is RolloutVerdict.INCONCLUSIVE
    nothing = ShadowFigures()  # nothing reached the comparator: not held
    assert short_of_requests(SHADOW, nothing, 360.0, 60.0) is RolloutVerdict.METRICS_UNAVAILABLE
    failing = replace(SHADOW, when_short=WhenShort.FAIL)
    assert short_of_requests(failing, short, 60.0, 60.0) is RolloutVerdict.FAILED


# -- the plan ------------------------------------------------------------------------------

COMPARED = replace(ROUTER, comparator="comparator")


def shadowed(shadow: LiveShadow = SHADOW) -> DesiredState:
    return desired(replace(CANARY, mirror=0, shadow=shadow), COMPARED)


def test_the_shadow_phase_comes_first_and_mirrors_to_the_comparator_only() -> None:
    (rollout,) = Pass(shadowed(), fakes(), at_rest()).plan().rollouts
    traffic = rollout.traffic
    assert traffic is not None
    first = traffic.phases[0]
    assert first.name == (
        "shadow 10% to comparator comparator: version 2 on canary compared with version 1 on canary"
    )
    assert dict(first.weights) == {"stable": 10_000, "canary": 0}
    assert dict(first.mirror) == {"stable": 0, "canary": 0, "comparator": 1_000}
    # The serving version is asked beside the candidate, on the canary's own server.
    # No server declares an HTTP endpoint here: SSE copies would be counted, not asked.
    assert first.shadow == ShadowTarget(
        "m", "m", ("c:8001",), 1, ("c:8001",), 2, SHADOW, "canary", ("",), ("",)
    )
    # Every later setting, and the route back, mirror nothing to the comparator.
    assert all(p.mirror.get("comparator") == 0 for p in traffic.phases[1:])
    assert traffic.restore.mirror["comparator"] == 0


def test_the_servers_http_endpoints_go_with_the_target_for_sse_copies() -> None:
    """Where a server declares Triton's HTTP endpoint (spec.http), the comparator asks an
    SSE copy's sides there: the target carries them in the order of the gRPC addresses."""
    state = shadowed()
    servers = [replace(s, http=f"{s.name}:8000") for s in state.servers.values()]
    state = DesiredState.build(servers, list(state.deployments.values()), [COMPARED])
    (rollout,) = Pass(state, fakes(), at_rest()).plan().rollouts
    assert rollout.traffic is not None
    target = rollout.traffic.phases[0].shadow
    assert target is not None
    assert (target.primary, target.primary_http) == (("c:8001",), ("c:8000",))
    assert (target.candidate, target.candidate_http) == (("c:8001",), ("c:8000",))


def test_with_probes_the_shadow_phase_is_the_no_traffic_phase() -> None:
    state = shadowed()
    probed = replace(state.deployments["m"], analysis=replace(ANALYSIS, probes=ProbeSpec()))
    state = DesiredState.build(list(state.servers.values()), [probed], [COMPARED])
    (rollout,) = Pass(state, fakes(), at_rest()).plan().rollouts
    assert rollout.traffic is not None
    names = [p.name for p in rollout.traffic.phases]
    assert names[0].startswith("shadow 10%") and not any("no traffic" in n for n in names)


def test_a_config_change_compares_with_the_serving_version_on_the_stable_pool() -> None:
    state = shadowed()
    changed = replace(state.deployments["m"], config={"parameters": {"x": {"string_value": "1"}}})
    state = DesiredState.build(list(state.servers.values()), [changed], [COMPARED])
    (rollout,) = Pass(state, fakes(), at_rest()).plan().rollouts
    assert rollout.traffic is not None
    target = rollout.traffic.phases[0].shadow
    assert target is not None
    # On the canary the serving version loads again with the new config: not the old one.
    assert (target.primary, target.primary_pool) == (("a:8001", "b:8001"), "stable")


def test_without_a_comparator_the_plan_says_so_and_plans_nothing_of_the_rollout() -> None:
    """Issue 41, point 2: with a shadow phase and no --comparator-listen, the plan showed the
    phase and apply loaded the candidate on the canary pool before failing. Now the plan
    has a problem line per server and no change: nothing is loaded."""
    from reconciler.core.plan.planner import plan
    from reconciler.model.history import History
    from tests.core.test_traffic import observe

    run = Pass(shadowed(), fakes(), at_rest())
    serving = {name: observe(fake) for name, fake in run.fakes.items()}
    routes = {"edge": run.router.observe()}
    refused = plan(run.desired, serving, History(), "rev", routes=routes, comparing=False)
    assert not refused.changes and not refused.rollouts, refused
    messages = {p.server: p.message for p in refused.problems}
    assert set(messages) == {"a", "b", "c"}, messages
    assert messages["c"].startswith(
        "rollout.traffic.shadow needs a comparator, and none listens here: start the "
        "reconciler with --comparator-listen HOST:PORT"
    ), messages["c"]
    assert "nothing of m is touched" in messages["c"]
    assert plan(run.desired, serving, History(), "rev", routes=routes).rollouts  # one listens


# -- the executor ----------------------------------------------------------------------------


class FakeSession:
    def __init__(self, target: ShadowTarget, figures: Callable[[int], ShadowFigures]) -> None:
        self.target, self._figures, self.reads, self.ended = target, figures, 0, False

    def figures(self) -> ShadowFigures:
        self.reads += 1
        return self._figures(self.reads)

    def end(self) -> None:
        self.ended = True


class FakeComparator:
    def __init__(self, figures: Callable[[int], ShadowFigures]) -> None:
        self._figures, self.sessions = figures, list[FakeSession]()

    def begin(self, target: ShadowTarget) -> FakeSession:
        self.sessions.append(FakeSession(target, self._figures))
        return self.sessions[-1]


def run_with(comparator: FakeComparator | None, state: DesiredState | None = None) -> Pass:
    from reconciler.engine.apply import apply
    from reconciler.engine.context import Timing
    from tests.core.test_traffic import Counters

    run = Pass(state or shadowed(), fakes(), at_rest())
    timing = Timing(clock=run.clock.clock, sleep=run.clock.sleep)
    run.result = apply(  # type: ignore[attr-defined]
        run.plan(),
        run.fakes,
        timing=timing,
        metrics={name: Counters() for name in run.fakes},
        routers={"edge": run.router},
        comparator=comparator,
    )
    return run


def test_a_candidate_that_disagrees_fails_before_the_canary_takes_any_request() -> None:
    comparator = FakeComparator(lambda reads: figures(100 * reads, candidate=5 * reads))
    run = run_with(comparator)
    canary = next(c for c in run.result.changes if c.change.server == "c")  # type: ignore[attr-defined]
    assert canary.outcome is Outcome.REVERTED, canary
    assert "beyond the noise" in (canary.error or "")
    # The router mirrored to the comparator, then went back; no update gave the canary a share.
    assert run.router.updates[1][1]["comparator"] == 1_000
    assert all(not weights.get("canary") for weights, _ in run.router.updates)
    assert run.router.updates[-1][1]["comparator"] == 0
    assert comparator.sessions and all(s.ended for s in comparator.sessions)


def test_a_candidate_that_agrees_goes_on_to_the_steps_and_the_session_ends() -> None:
    comparator = FakeComparator(lambda reads: figures(100 * reads))
    run = run_with(comparator)
    assert all(c.outcome is Outcome.CONVERGED for c in run.result.changes)  # type: ignore[attr-defined]
    assert any(weights.get("canary") for weights, _ in run.router.updates)
    assert comparator.sessions[0].ended


def test_short_of_requests_the_phase_waits_beyond_its_duration_until_enough_compared() -> None:
    # 30 more compared per read: 100 by the fourth, past the 2s duration (1s interval).
    comparator = FakeComparator(lambda reads: figures(30 * reads))
    run = run_with(comparator)
    assert all(c.outcome is Outcome.CONVERGED for c in run.result.changes)  # type: ignore[attr-defined]
    assert comparator.sessions[0].reads >= 4


def test_short_with_when_short_fail_fails_and_nothing_received_is_not_held() -> None:
    nothing = FakeComparator(lambda _reads: ShadowFigures())
    run = run_with(nothing, shadowed())
    canary = next(c for c in run.result.changes if c.change.server == "c")  # type: ignore[attr-defined]
    # whenShort wait, maxWait 300s: waited, then nothing is known against the versions.
    assert canary.outcome is Outcome.REVERTED
    assert "nothing was mirrored to the comparator" in (canary.error or "")
    analysis = canary.analysis
    assert analysis is not None and analysis.failure is FailureKind.METRICS_UNAVAILABLE
    failing = replace(SHADOW, when_short=WhenShort.FAIL)
    run = run_with(FakeComparator(lambda _reads: figures(10)), shadowed(shadow=failing))
    canary = next(c for c in run.result.changes if c.change.server == "c")  # type: ignore[attr-defined]
    assert canary.analysis is not None and canary.analysis.failure is FailureKind.AGAINST_VERSIONS
    assert "compared 10 of the 100" in (canary.error or "")


def test_without_a_comparator_the_shadow_phase_fails_saying_so_and_is_not_held() -> None:
    run = run_with(None)
    canary = next(c for c in run.result.changes if c.change.server == "c")  # type: ignore[attr-defined]
    assert canary.outcome is Outcome.REVERTED
    assert "--comparator-listen" in (canary.error or "")
    failed = next(s for s in canary.steps if not s.ok)
    assert failed.failure is FailureKind.METRICS_UNAVAILABLE
    assert all(not weights.get("canary") for weights, _ in run.router.updates)


# -- the manifests -------------------------------------------------------------------------

SERVERS = "".join(
    f"apiVersion: triton-gitops.dev/v1alpha1\nkind: TritonServer\nmetadata: {{name: {s}}}\n"
    f"spec: {{grpc: '{s}:8001'}}\n---\n"
    for s in "ac"
)


CONFIG = (
    "  config: {backend: python, input: [{name: I, data_type: TYPE_FP32, dims: [4]}],\n"
    "           output: [{name: O, data_type: TYPE_FP32, dims: [4]}]}\n"
)


def manifests(router: str, deployment_extra: str = "", shadow: str = "{}") -> dict[str, bytes]:
    doc = (
        SERVERS + "apiVersion: triton-gitops.dev/v1alpha1\nkind: Router\nmetadata: {name: edge}\n"
        "spec:\n  envoy: {admin: 'http://127.0.0.1:9901', routesFile: /run/envoy/routes.json}\n"
        + router
        + "  pools:\n"
        "    - {name: stable, servers: {names: [a]}}\n"
        "    - {name: canary, servers: {names: [c]}}\n---\n"
        "apiVersion: triton-gitops.dev/v1alpha1\nkind: ModelDeployment\nmetadata: {name: m}\n"
        "spec:\n  servers: {names: [a, c]}\n  versions: [2]\n"
        + CONFIG
        + deployment_extra
        + "  verify:\n"
        "    analysis: {interval: 1s, duration: 2s,\n"
        "               checks: [{name: ok, successRate: {min: 0.9}}]}\n"
        "  rollout:\n    traffic:\n      router: edge\n      strategy: canary\n"
        "      stablePool: stable\n      canaryPool: canary\n      steps: [50%]\n"
        f"      shadow: {shadow}\n"
    )
    return {"m.yaml": doc.encode()}


def problems(files: dict[str, bytes]) -> list[str]:
    with pytest.raises(ValidationError) as raised:
        load_desired_state(files)
    return [str(p) for p in raised.value.problems]


def test_a_declared_comparator_and_shadow_are_read() -> None:
    state = load_desired_state(
        manifests("  comparator: {name: cmp}\n", shadow="{share: 5%, minRequests: 50}")
    )
    assert state.routers["edge"].comparator == "cmp"
    traffic = state.deployments["m"].rollout.traffic
    assert traffic is not None and traffic.shadow is not None
    assert (traffic.shadow.share, traffic.shadow.min_requests) == (500, 50)


def test_shadow_without_a_comparator_is_refused_naming_the_line() -> None:
    files = manifests("")
    line = files["m.yaml"].decode().splitlines().index("      shadow: {}") + 1
    (problem,) = problems(files)
    assert problem.startswith(f"m.yaml:{line}: ") and "declares none (spec.comparator)" in problem


AFFINITY = "  sequenceAffinity: {header: x-sequence-id}\n"


def test_a_sequence_model_is_shadowed_only_whole_and_side_effects_need_consent() -> None:
    router = "  comparator: {name: cmp}\n" + AFFINITY
    (sequence,) = problems(manifests(router, "  sequence: {}\n"))
    assert "a sequence model is shadowed only by whole sequences" in sequence
    # Whole sequences need every request of a sequence mirrored.
    whole = "{sequences: whole, share: 10%}"
    (share,) = problems(manifests(router, "  sequence: {}\n", shadow=whole))
    assert "shadow.sequences: whole needs share: 100%" in share
    state = load_desired_state(
        manifests(router, "  sequence: {}\n", shadow="{sequences: whole, share: 100%}")
    )
    traffic = state.deployments["m"].rollout.traffic
    assert traffic is not None and traffic.shadow is not None
    assert traffic.shadow.whole_sequences
    quiet = "  servingProbes: {enabled: false}\n"
    (effects,) = problems(manifests(router, quiet))
    assert "allowSideEffects" in effects
    load_desired_state(manifests(router, quiet, shadow="{allowSideEffects: true}"))


def test_a_comparator_named_as_a_pool_is_refused() -> None:
    (problem,) = problems(manifests("  comparator: {name: canary}\n"))
    assert "the comparator 'canary' is also a pool" in problem


def test_a_sequence_models_traffic_rollout_needs_the_routers_sequence_affinity() -> None:
    """Issue 44, point 4: each traffic step would send the rest of the sequences in flight to
    the other pool (tests/integration/test_shadow.py measured it through Envoy): refused on
    the traffic rollout's line, naming the Router's, unless the Router declares
    sequenceAffinity or the deployment says its clients need none."""
    router = "  comparator: {name: cmp}\n"
    whole = "{sequences: whole, share: 100%}"
    files = manifests(router, "  sequence: {}\n", shadow=whole)
    line = files["m.yaml"].decode().splitlines().index("    traffic:") + 1
    router_line = files["m.yaml"].decode().splitlines().index("kind: Router")
    assert problems(files) == [
        f"m.yaml:{line}: ModelDeployment 'm' is a sequence model and Router 'edge' "
        f"(m.yaml:{router_line}) declares no spec.sequenceAffinity: each traffic step would "
        "send the later requests of sequences in flight to a server that never saw their "
        "START. Declare sequenceAffinity on the Router, or set "
        "rollout.traffic.allowWithoutSequenceAffinity: true if the clients keep each "
        "sequence on one server (one gRPC stream per sequence)"
    ]
    load_desired_state(manifests(router + AFFINITY, "  sequence: {}\n", shadow=whole))
    allowed = whole + "\n      allowWithoutSequenceAffinity: true"
    state = load_desired_state(manifests(router, "  sequence: {}\n", shadow=allowed))
    traffic = state.deployments["m"].rollout.traffic
    assert traffic is not None and traffic.allow_without_affinity
    # No sequence, no refusal, and no warning of sequences either.
    others = read_manifests(manifests(router)).warnings
    assert not [w for w in others if "sequence" in str(w)], others


def test_the_plan_refuses_a_sequence_model_it_knows_of_through_a_router_without_affinity() -> None:
    """The plan sees what the manifest may not (sequence_batching in the repository's
    config; here spec.sequence): the rollout is refused, nothing touched; allowed, the
    plan says its steps split sequences; with the Router's affinity they do not."""
    state = desired()
    sequenced = replace(state.deployments["m"], sequence=SequencePolicy())
    refused = Pass(DesiredState.build(list(state.servers.values()), [sequenced], [ROUTER]),
                   fakes(), at_rest()).plan()  # fmt: skip
    assert not refused.rollouts and not refused.changes
    assert {p.server for p in refused.problems} == {"a", "b", "c"}
    assert "declares no spec.sequenceAffinity" in refused.problems[0].message
    assert "allowWithoutSequenceAffinity" in refused.problems[0].message
    traffic = sequenced.rollout.traffic
    assert traffic is not None
    allowed = replace(
        sequenced,
        rollout=replace(sequenced.rollout, traffic=replace(traffic, allow_without_affinity=True)),
    )
    planned = Pass(DesiredState.build(list(state.servers.values()), [allowed], [ROUTER]),
                   fakes(), at_rest()).plan()  # fmt: skip
    (rollout,) = planned.rollouts
    assert rollout.traffic is not None and rollout.traffic.splits_sequences
    assert "as allowWithoutSequenceAffinity allows" in plan_text(planned)
    assert plan_json(planned)["rollouts"][0]["traffic"]["splits_sequences"] is True
    kept = replace(ROUTER, sequence_affinity=SequenceAffinity("x-sequence-id"))
    affine = Pass(DesiredState.build(list(state.servers.values()), [sequenced], [kept]),
                  fakes(), at_rest()).plan()  # fmt: skip
    (held,) = affine.rollouts
    assert held.traffic is not None and not held.traffic.splits_sequences
    # Issue 44, point 3: the probes (and verify's questions) ask a sequence model whole
    # sequences of their own: a lone request names no sequence, and Triton refuses it.
    assert held.analyses and {s.exchange for s in held.analyses} == {Exchange.SEQUENCE}
    verifies = [s for c in affine.changes for s in c.steps if s.action is Action.VERIFY]
    assert verifies and {s.exchange for s in verifies} == {Exchange.SEQUENCE}, verifies
    assert "each question asked as a whole sequence of its own" in verifies[0].reason
    # Issue 44, point 2: the canary ends at 50%, where the stable pool would keep taking new
    # sequences and its servers' drains never end: a last phase sends every new sequence to
    # the canary (judged at 50%) while those on the stable pool end there.
    *_, last, drain = held.traffic.phases
    assert last.weights == {"stable": 5_000, "canary": 5_000}, last
    assert drain.name == (
        "drain stable: every new sequence to canary while those in flight on stable end there"
    ), drain
    assert drain.weights == {"stable": 0, "canary": 10_000} and drain.watch == 0, drain
    stable = [c for c in affine.changes if c.server in held.stages[-1]]
    assert stable and all(c.steps[0].action is Action.DRAIN for c in stable), stable
    # A switch back drains the canary's new versions first, unless they failed (then the
    # sequences in flight on them are cut: engine.stages.CUT); the stable pool's revert,
    # which the route never left, is as planned.
    canary = [c for c in affine.changes if c.server in held.stages[0]]
    assert canary, affine.changes
    for change in canary:
        first = change.revert[0]
        assert (first.action, first.versions, first.unless_failed) == (Action.DRAIN, (2,), True), (
            change.revert
        )
        assert "unless the new versions failed: then they are cut" in first.reason
    assert all(not s.unless_failed for c in stable for s in c.revert), stable
    plain = DesiredState.build(list(state.servers.values()), [state.deployments["m"]], [kept])
    (unsequenced,) = Pass(plain, fakes(), at_rest()).plan().rollouts
    assert unsequenced.traffic is not None
    assert not unsequenced.traffic.phases[-1].name.startswith("drain"), unsequenced.traffic


def test_a_saturated_noise_floor_is_never_a_pass_of_the_shadow_check() -> None:
    """Issue 41, point 1: the serving version disagrees with itself on every request at the
    declared tolerance; a candidate that differs no more is not judged a pass but counted
    as an evaluation without data (inconclusive), with what to change."""
    from tests.core.test_comparison import _noisy_requests

    spec = replace(SHADOW, tolerance=Tolerance(rtol=1e-4))
    good = ShadowFigures(received=203, comparison=_noisy_requests(203, 1e-3))
    (answers,) = shadow_checks(spec, good)
    assert answers.verdict is Verdict.NO_DATA, answers
    assert answers.detail.startswith(
        "inconclusive: the serving version disagrees with itself on 100% of 203 request(s)"
    ), answers.detail
    bad = ShadowFigures(received=203, comparison=_noisy_requests(203, 1e-3, flip_every=33))
    (caught,) = shadow_checks(spec, bad)
    assert caught.verdict is Verdict.FAIL and caught.value == pytest.approx(7 / 203), caught
