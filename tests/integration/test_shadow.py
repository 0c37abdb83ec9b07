"""Live shadow traffic, compared (issue 31): a real Envoy on loopback mirrors live client
requests to the reconciler's comparator while a canary rollout's shadow phase runs, and the
comparator asks two real tritonservers (the stable pool's, then the canary pool's) for the
serving and the new version's answers.

The test model multiplies its input by ``scale`` (1 for every version here: old and new
answer alike), with the config parameters that make a version misbehave as a real one would:
5% off on the inputs whose CRC-32 is a multiple of ``skew_every``, relative ``noise`` drawn
anew per request, ``delay_ms`` late. Clients send varied inputs through Envoy's listener.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from reconciler.adapters.envoy import EnvoyRouter
from reconciler.model.traffic import EnvoyRoute, Pool, RouterSpec
from testkit.cli_run import Reconciler
from testkit.envoy import LocalEnvoy
from testkit.loadgen import LoadGenerator, SequenceClient
from testkit.local_triton import LocalTriton, free_port, shared_between_tests
from testkit.manifests import ManifestRepo, router_doc, server_doc
from tests.integration.flows import ready_versions
from tests.services import envoy_or_skip

pytestmark = pytest.mark.triton

POOLS = {"stable": ["a"], "canary": ["c"]}


class Fleet:
    def __init__(self, tritons: dict[str, LocalTriton], envoy: LocalEnvoy, listen: str) -> None:
        self.tritons, self.envoy, self.listen = tritons, envoy, listen

    def canary_requests(self) -> float:
        """The gRPC requests Envoy sent the canary pool so far (clients', not mirrored)."""
        spec = RouterSpec(
            "edge",
            tuple(Pool(name, server_names=tuple(s)) for name, s in POOLS.items()),
            envoy=EnvoyRoute(self.envoy.admin_url, "routing.triton", "mirror.triton"),
        )
        figures = EnvoyRouter(spec).figures(("canary",)).get("canary")
        return figures.total or 0.0 if figures is not None else 0.0


@pytest.fixture(scope="module")
def fleet(model_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    envoy_or_skip()
    logs = tmp_path_factory.mktemp("shadow")
    tritons = {
        name: LocalTriton(model_repository, log_file=logs / f"triton-{name}.log")
        for name in ("a", "c")
    }
    envoy: LocalEnvoy | None = None
    try:
        for server in tritons.values():
            server.start()
        listen = f"127.0.0.1:{free_port('127.0.0.1')}"
        envoy = LocalEnvoy.of(
            logs / "envoy",
            {"stable": [tritons["a"].grpc_address], "canary": [tritons["c"].grpc_address]},
            {"stable": 10_000},
            mirrors={"comparator": [listen]},
        ).start()
        with ExitStack() as shared:
            for server in tritons.values():
                shared.enter_context(shared_between_tests(server))
            yield Fleet(tritons, envoy, listen)
    finally:
        if envoy is not None:
            envoy.stop()
        for server in tritons.values():
            server.stop()


def _manifests(manifests: ManifestRepo, fleet: Fleet, model_repository: Path) -> None:
    for name, server in fleet.tritons.items():
        manifests.write(
            f"servers/{name}.yaml",
            server_doc(name, server.grpc_address, model_repository, metrics=server.metrics_url),
        )
    manifests.write("router.yaml", router_doc(fleet.envoy.admin_url, POOLS, "comparator"))


def _deployment(version: int, parameters: dict[str, str], shadow: str, duration: str = "3s") -> str:
    given = ", ".join(
        f"{k}: {{string_value: '{v}'}}" for k, v in {"scale": "1", **parameters}.items()
    )
    return (
        "apiVersion: triton-gitops/v1alpha1\n"
        "kind: ModelDeployment\n"
        "metadata: {name: echo}\n"
        "spec:\n"
        "  servers: {names: [a, c]}\n"
        f"  versions: [{version}]\n"
        f"  config: {{parameters: {{{given}}}}}\n"
        "  verify:\n"
        "    analysis:\n"
        "      interval: 1s\n"
        f"      duration: {duration}\n"
        "      checks:\n"
        "        - name: success-rate\n"
        "          successRate: {min: 0.99}\n"
        "  rollout:\n"
        "    traffic:\n"
        "      router: edge\n"
        "      strategy: canary\n"
        "      stablePool: stable\n"
        "      canaryPool: canary\n"
        "      steps: [50%]\n"
        f"      shadow: {shadow}\n"
    )


FAST = "share: 100%, rate: 200, maxShare: 0.5"


@pytest.fixture
def serving(
    fleet: Fleet, manifests: ManifestRepo, model_repository: Path, tmp_path: Path
) -> Reconciler:
    """Version 1 on both pools (scale 1), every request through Envoy to the stable pool."""
    for server in fleet.tritons.values():
        import tritonclient.grpc as triton_grpc

        with triton_grpc.InferenceServerClient(server.grpc_address) as client:
            for model in client.get_model_repository_index(as_json=True).get("models", []):
                if model.get("state") == "READY":
                    client.unload_model(model["name"])
    _manifests(manifests, fleet, model_repository)
    manifests.write("echo.yaml", _deployment(1, {}, f"{{{FAST}}}"))
    manifests.commit("echo 1 through the router")
    reconciler = Reconciler(manifests.url, tmp_path / "reconciler")
    first = reconciler.apply("--comparator-listen", fleet.listen)
    assert first.code == 0, first.explain()
    return reconciler


def _roll(
    manifests: ManifestRepo, reconciler: Reconciler, fleet: Fleet, doc: str, *extra: str
) -> tuple[int, dict[str, Any], LoadGenerator, str, float]:
    """The apply's exit code, its JSON report, the clients' load, the apply's outcome in
    words, and the requests Envoy sent the canary pool meanwhile."""
    manifests.write("echo.yaml", doc)
    manifests.commit("roll echo")
    before = fleet.canary_requests()
    with LoadGenerator(fleet.envoy.address, "echo", threads=2, varied=True) as load:
        load.wait_for_samples(200)
        result = reconciler.apply("--output", "json", "--comparator-listen", fleet.listen, *extra)
        load.wait_for_samples(len(load.samples) + 50)
    canary = fleet.canary_requests() - before
    return result.code, json.loads(result.out), load, result.explain(), canary


def _shadow_checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every evaluation's shadow checks on the canary server, phase after phase."""
    change = next(c for c in report["result"]["changes"] if c["server"] == "c")
    return [
        check
        for step in change["steps"]
        for evaluation in (step.get("analysis") or {}).get("evaluations", [])
        for check in evaluation["checks"]
        if check["check"].startswith("shadow")
    ]


def test_a_candidate_off_by_5_percent_on_2_percent_of_inputs_is_caught_before_any_client(
    fleet: Fleet, serving: Reconciler, manifests: ManifestRepo
) -> None:
    shadow = (
        f"{{{FAST}, minRequests: 300, compare: {{relativeTolerance: 0.001, minAgreement: 0.995}}}}"
    )
    doc = _deployment(2, {"skew_every": "50"}, shadow, duration="6s")
    code, report, load, why, canary = _roll(manifests, serving, fleet, doc)
    assert code != 0, why
    assert load.failures == [], load.failures[:3]
    assert canary == 0, f"Envoy sent the canary pool {canary} client request(s)\n{why}"
    checks = _shadow_checks(report)
    failed = [c for c in checks if c["verdict"] == "fail"]
    assert failed and "beyond the noise" in failed[-1]["detail"], why
    assert "5% off" not in why  # the detail says how, in values: 1.05 times the primary's
    assert ready_versions(fleet.tritons["c"], "echo") == {1}
    assert ready_versions(fleet.tritons["a"], "echo") == {1}


def test_a_good_candidate_with_noise_passes_where_an_exact_comparison_fails_it(
    fleet: Fleet, serving: Reconciler, manifests: ManifestRepo
) -> None:
    noisy = {"noise": "0.00001"}  # relative, as GPU kernels' reordered sums are
    # Against an exact comparison the deterministic version 1 agrees with itself, and the
    # noisy version 2 differs from it in the last digits of every answer.
    exact = f"{{{FAST}, minRequests: 100}}"
    code, report, load, why, canary = _roll(manifests, serving, fleet, _deployment(2, noisy, exact))
    assert code != 0, why
    assert load.failures == [] and canary == 0, (load.failures[:3], canary)
    failed = [c for c in _shadow_checks(report) if c["verdict"] == "fail"]
    assert failed and "beyond atol 0 + rtol 0" in failed[-1]["detail"], why
    assert ready_versions(fleet.tritons["c"], "echo") == {1}
    # The same version within a relative tolerance far above the noise passes.
    shadow = f"{{{FAST}, minRequests: 100, compare: {{relativeTolerance: 0.0001}}}}"
    code, report, load, why, _ = _roll(manifests, serving, fleet, _deployment(2, noisy, shadow))
    assert code == 0, why
    assert load.failures == [], load.failures[:3]
    checks = _shadow_checks(report)
    passed = [c for c in checks if c["verdict"] == "pass" and c["check"] == "shadow"]
    assert passed and not [c for c in checks if c["verdict"] == "fail"], why
    assert ready_versions(fleet.tritons["c"], "echo") == {2}
    assert ready_versions(fleet.tritons["a"], "echo") == {2}


def test_a_serving_version_noisier_than_the_tolerance_no_longer_passes_a_class_flipper(
    fleet: Fleet, serving: Reconciler, manifests: ManifestRepo
) -> None:
    """Issue 41, point 1, as measured: relative noise 1e-3 per value in both versions against
    the README's relativeTolerance 1e-4 (the serving version disagrees with itself on every
    request), and a candidate that also flips the top class on 3% of inputs. It passed
    ("candidate 203 of 203, serving version with itself 203"); now the serving version's own
    differences are learned and the flips are far beyond them.

    The candidate here flips 1 input in 10, not the 3% measured: the noise also flips a near
    tie now and then (1 of 273 in a clean-clone CI run), and against one such flip the 3%
    flipper's excess over ~270 compared requests (about 5 beyond the 1% budget) lies within
    the chance of two noisy counts (3.3 requests) one time in three, which made this test
    inconclusive there. At 1 in 10 the fail is missed about once in 1,000 at 200 compared
    (tests/core/test_comparison.py pins the counts; the README says how many requests a
    rarer flipper needs)."""
    noisy = {"noise": "0.001", "flip_every": "2:10"}
    # The serving version made noisy first (one config says both versions' parameters: a
    # change of config reloads version 1 as well), compared within a tolerance above it.
    loose = f"{{{FAST}, minRequests: 20, compare: {{relativeTolerance: 0.01}}}}"
    code, _, _, why, _ = _roll(manifests, serving, fleet, _deployment(1, noisy, loose))
    assert code == 0, why
    shadow = f"{{{FAST}, minRequests: 200, compare: {{relativeTolerance: 0.0001}}}}"
    code, report, load, why, canary = _roll(
        manifests, serving, fleet, _deployment(2, noisy, shadow, duration="4s")
    )
    assert code != 0, why
    assert load.failures == [] and canary == 0, (load.failures[:3], canary)
    checks = [c for c in _shadow_checks(report) if c["check"] == "shadow"]
    failed = [c for c in checks if c["verdict"] == "fail"]
    assert failed, f"no shadow check failed: {[(c['verdict'], c['detail']) for c in checks]}"
    assert "own differences discounted" in failed[-1]["detail"], failed[-1]["detail"]
    assert "beyond the noise" in failed[-1]["detail"], failed[-1]["detail"]
    assert ready_versions(fleet.tritons["c"], "echo") == {1}
    assert ready_versions(fleet.tritons["a"], "echo") == {1}


def test_a_right_but_twice_slower_candidate_fails_the_latency_part(
    fleet: Fleet, serving: Reconciler, manifests: ManifestRepo
) -> None:
    # Version 1 serves 10 ms late; version 2 answers alike but 20 ms late. One config says
    # both, so that only the version changes (a config change reloads version 1 as well).
    delays = {"delay_ms": "1:10,2:20"}
    slowed = _deployment(1, delays, f"{{{FAST}, minRequests: 20}}")
    code, _, _, why, _ = _roll(manifests, serving, fleet, slowed)
    assert code == 0, why
    shadow = (
        f"{{{FAST}, minRequests: 60, compare: {{maxLatencyIncrease: 0.5, latencyQuantile: p50}}}}"
    )
    # The median of the interleaved calls: on a machine shared by three test processes one
    # stalled call among ~60 made the serving version's p99 five times the candidate's
    # (shadow-latency -0.82, a clean-clone CI run), whatever the versions' delays.
    doc = _deployment(2, delays, shadow)
    code, report, load, why, canary = _roll(manifests, serving, fleet, doc)
    assert code != 0, why
    assert load.failures == [] and canary == 0, (load.failures[:3], canary)
    checks = _shadow_checks(report)
    latency = [c for c in checks if c["check"] == "shadow-latency" and c["verdict"] == "fail"]
    assert latency and "p50 latency" in latency[-1]["detail"], why
    answers = [c for c in checks if c["check"] == "shadow" and c["verdict"] != "skipped"]
    assert answers and all(c["verdict"] == "pass" for c in answers), why  # right answers
    assert ready_versions(fleet.tritons["c"], "echo") == {1}


def test_a_comparator_the_router_cannot_reach_fails_the_rollout_as_the_manifest_says(
    fleet: Fleet, serving: Reconciler, manifests: ManifestRepo
) -> None:
    # The comparator listens elsewhere than where Envoy's comparator cluster points.
    elsewhere = f"127.0.0.1:{free_port('127.0.0.1')}"
    shadow = f"{{{FAST}, minRequests: 50, whenShort: fail}}"
    manifests.write("echo.yaml", _deployment(2, {}, shadow, duration="2s"))
    manifests.commit("roll echo")
    before = fleet.canary_requests()
    with LoadGenerator(fleet.envoy.address, "echo", threads=2, varied=True) as load:
        load.wait_for_samples(200)
        result = serving.apply("--output", "json", "--comparator-listen", elsewhere)
        load.wait_for_samples(len(load.samples) + 50)
    why = result.explain()
    assert result.code != 0, why
    assert "nothing was mirrored to the comparator" in why, why
    assert load.failures == [], load.failures[:3]  # Envoy's mirror failures reach no client
    assert fleet.canary_requests() == before
    assert ready_versions(fleet.tritons["c"], "echo") == {1}


def test_without_comparator_listen_plan_says_so_and_apply_loads_nothing(
    fleet: Fleet, serving: Reconciler, manifests: ManifestRepo
) -> None:
    """Issue 41, point 2: `plan` showed the shadow phase and exited 2; `apply` loaded the
    candidate on the canary pool and only then failed. Both now say what is missing, and
    nothing is loaded."""
    manifests.write("echo.yaml", _deployment(2, {}, f"{{{FAST}, minRequests: 50}}"))
    manifests.commit("roll echo, the reconciler started without --comparator-listen")
    planned = serving.plan()
    assert planned.code == 1, planned.explain()
    assert "none listens here: start the reconciler with --comparator-listen" in planned.out, (
        planned.explain()
    )
    assert "shadow 10%" not in planned.out, planned.out
    applied = serving.apply("--output", "json")
    assert applied.code == 1, applied.explain()
    report = json.loads(applied.out)
    ran = [step for c in report["result"]["changes"] for step in c["steps"]]
    assert ran == [], f"steps ran without a comparator: {ran}"
    problems = [p["message"] for p in report["problems"]]
    assert problems and all("--comparator-listen" in p for p in problems), problems
    assert ready_versions(fleet.tritons["c"], "echo") == {1}
    assert ready_versions(fleet.tritons["a"], "echo") == {1}


def _counter(version: int, scale: str, shadow: str) -> str:
    """The test sequence model (a running sum times ``scale``) rolled out like echo above.
    The fleet's Router declares no sequenceAffinity: allowed explicitly (the shadow phase,
    where this test ends, moves no client sequence)."""
    return (
        _deployment(version, {"scale": scale}, shadow)
        .replace("metadata: {name: echo}", "metadata: {name: counter}")
        .replace("spec:\n", "spec:\n  model: counter\n", 1)
        .replace("    traffic:\n", "    traffic:\n      allowWithoutSequenceAffinity: true\n", 1)
    )


def test_a_sequence_model_mirrored_by_envoy_is_compared_by_whole_sequences(
    fleet: Fleet, serving: Reconciler, manifests: ManifestRepo
) -> None:
    """Envoy mirrors every request of the clients' sequences; the comparator replays each
    sampled sequence whole, in order, on each side in a sequence of its own. A version whose
    running sums are three times too large is caught before any client request reaches it,
    and no client sequence is broken meanwhile."""
    whole = "{share: 100%, rate: 200, maxShare: 0.5, sequences: whole, minRequests: 30}"
    manifests.write("counter.yaml", _counter(1, "1", whole))
    manifests.commit("counter 1 through the router")
    first = serving.apply("--comparator-listen", fleet.listen)
    assert first.code == 0, first.explain()
    manifests.write("counter.yaml", _counter(2, "1:1,2:3", whole))
    manifests.commit("counter 2, its sums three times too large")
    # The plan knows it from the repository's config (sequence_batching): without the
    # Router's sequence affinity its steps would split sequences in flight between the pools
    # (allowed here); the shadow phase does not.
    planned = serving.plan("--comparator-listen", fleet.listen)
    assert "(a sequence model through a router without sequence affinity" in planned.out, (
        planned.out
    )
    before = fleet.canary_requests()
    with SequenceClient(fleet.envoy.address) as client:
        time.sleep(0.5)
        result = serving.apply("--output", "json", "--comparator-listen", fleet.listen)
        time.sleep(0.5)
    why = result.explain()
    assert result.code != 0, why
    assert client.broken == [] and client.completed > 0, (client.broken[:3], client.completed)
    assert fleet.canary_requests() == before, why
    checks = _shadow_checks(json.loads(result.out))
    failed = [c for c in checks if c["check"] == "shadow" and c["verdict"] == "fail"]
    assert failed and "beyond the noise" in failed[-1]["detail"], why
    # The serving version asked twice agreed with itself on every running sum: each sequence
    # reached the comparator whole and in order, and each side summed a sequence of its own.
    assert "the serving version with itself on 0.0%" in failed[-1]["detail"], why
    assert ready_versions(fleet.tritons["c"], "counter") == {1}
