"""Post-swap analysis end to end: real Triton, Prometheus, Alertmanager and Git.

A load generator keeps sending unversioned requests while the reconciler swaps versions; the
test model's versions 4, 5 and 6 load fine but fail requests, are slow, or leak memory.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from testkit.cli_run import Reconciler, cli
from testkit.loadgen import WITNESS_PAUSE, LoadGenerator
from testkit.local_triton import LocalTriton
from testkit.manifests import ManifestRepo, git, server_doc
from testkit.services import ALERTMANAGER_BINARIES, Alertmanager
from tests.integration.flows import ready_versions, served_factor
from tests.services import StartPrometheus, find_binary

CHECKS = """\
      checks:
        - name: success-rate
          successRate: {min: 0.95}
        - name: latency
          latency: {maxIncrease: 10.0}  # version 5 is ~60x slower; a busy machine doubles others
        - name: memory
          memory: {maxIncreaseBytes: 536870912}
"""


def analysed(
    versions: list[int],
    *,
    checks: str = CHECKS,
    duration: str = "4s",
    no_traffic: str = "wait",
    extra: str = "",
) -> str:
    return (
        "# The echo model, watched after every swap.\n"
        "apiVersion: triton-gitops/v1alpha1\n"
        "kind: ModelDeployment\n"
        "metadata:\n"
        "  name: echo\n"
        "spec:\n"
        "  servers:\n"
        "    names: [edge-a]\n"
        f"  versions: [{', '.join(map(str, versions))}]  # the versions that serve\n"
        "  verify:\n"
        "    analysis:\n"
        "      interval: 1s\n"
        f"      duration: {duration}\n"
        f"      noTraffic: {no_traffic}\n" + extra + checks
    )


@pytest.fixture
def setup(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> Reconciler:
    manifests.write(
        "servers.yaml",
        server_doc("edge-a", triton.grpc_address, model_repository, metrics=triton.metrics_url),
    )
    manifests.write("echo.yaml", analysed([1]))
    manifests.commit("deploy echo 1")
    return Reconciler(manifests.url, tmp_path / "reconciler")


def deploy_under_load(reconciler: Reconciler, triton: LocalTriton) -> None:
    """The first deployment, analysed too: with no traffic (noTraffic: wait) it would be
    inconclusive and go back to nothing, so clients are already calling."""
    with LoadGenerator(triton.grpc_address, "echo", threads=2, pause=WITNESS_PAUSE) as load:
        load.wait_for_samples(20, timeout=10)  # nothing serves yet: these fail
        first = reconciler.apply()
        assert first.code == 0, first.out
    assert ready_versions(triton, "echo") == {1}


def rollout(
    reconciler: Reconciler, triton: LocalTriton, *extra: str
) -> tuple[int, str, LoadGenerator]:
    with LoadGenerator(triton.grpc_address, "echo", threads=4, pause=WITNESS_PAUSE) as load:
        load.wait_for_samples(300)  # the old version's baseline
        result = reconciler.apply("--output", "json", *extra)
        load.wait_for_samples(len(load.samples) + 100)
    return result.code, result.out, load


def wait_for_series(prometheus: str, query: str, timeout: float = 30) -> None:
    """Prometheus takes its first scrape about 5 s after start."""
    url = f"{prometheus}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url, timeout=5) as response:
            if json.load(response)["data"]["result"]:
                return
        time.sleep(0.5)
    raise AssertionError(f"Prometheus never had {query}")


def last_rollout(reconciler: Reconciler) -> dict[str, object]:
    shown = cli("history", "--state", reconciler.options[3], "--output", "json")
    assert shown.code == 0
    rollouts: list[dict[str, object]] = shown.json()["rollouts"]
    return rollouts[0]


def test_good_version_passes_and_old_is_unloaded(
    setup: Reconciler, manifests: ManifestRepo, triton: LocalTriton
) -> None:
    deploy_under_load(setup, triton)
    manifests.write("echo.yaml", analysed([2]))
    manifests.commit("echo 2")
    code, out, load = rollout(setup, triton)
    assert code == 0, out
    assert load.failures == []
    assert ready_versions(triton, "echo") == {2}
    record = last_rollout(setup)
    assert (record["outcome"], record["verdict"]) == ("converged", "passed")
    checks = {c["check"]: c for c in record["checks"]}  # type: ignore[union-attr]
    assert checks["success-rate"]["value"] == 1.0
    assert checks["latency"]["verdict"] == "pass" and checks["latency"]["value"] is not None
    assert checks["memory"]["verdict"] == "pass"
    steps = json.loads(out)["result"]["changes"][0]["steps"]
    assert [s["action"] for s in steps] == ["load", "verify", "analyze", "unload"]


MEMORY_ONLY = """\
      checks:
        - name: memory
          memory: {maxIncreaseBytes: 536870912}
"""


@pytest.mark.parametrize(
    ("version", "failing_check", "checks"),
    # The leaking version is slow too (it touches 8 MB per request): watch memory alone.
    [(4, "success-rate", CHECKS), (5, "latency", CHECKS), (6, "memory", MEMORY_ONLY)],
)
def test_bad_version_is_reverted_and_held(
    setup: Reconciler,
    manifests: ManifestRepo,
    triton: LocalTriton,
    version: int,
    failing_check: str,
    checks: str,
) -> None:
    deploy_under_load(setup, triton)
    # Triton samples memory every couple of seconds: give the leak time to show.
    manifests.write("echo.yaml", analysed([version], checks=checks, duration="8s"))
    bad = manifests.commit(f"echo {version}")
    code, out, load = rollout(setup, triton)
    assert code == 1, out
    assert ready_versions(triton, "echo") == {1}
    assert served_factor(triton, "echo") == 1.0
    change = json.loads(out)["result"]["changes"][0]
    assert change["outcome"] == "reverted"
    failed = [
        c["check"]
        for c in change["analysis"]["evaluations"][-1]["checks"]
        if c["verdict"] == "fail"
    ]
    assert failing_check in failed
    assert change["rollback_seconds"] is not None and change["rollback_seconds"] < 5
    if version != 4:  # only the version that fails requests may fail any
        assert load.failures == []
    record = last_rollout(setup)
    assert (record["revision"], record["outcome"], record["verdict"]) == (bad, "reverted", "failed")

    # hold: the failed spec is not applied again; plan shows why.
    again = setup.plan()
    assert again.code == 0, again.out
    assert "held" in again.out and bad[:12] in again.out and failing_check in again.out
    assert setup.apply().code == 0
    assert ready_versions(triton, "echo") == {1}


def test_commit_mode_reverts_in_git_alerts_and_rolls_forward(
    setup: Reconciler, manifests: ManifestRepo, triton: LocalTriton, alertmanager: Alertmanager
) -> None:
    deploy_under_load(setup, triton)
    manifests.write("echo.yaml", analysed([4]))
    bad = manifests.commit("echo 4")
    options = ("--revert-mode", "commit", "--alertmanager-url", alertmanager.url)
    code, out, _ = rollout(setup, triton, *options)
    assert code == 1
    assert ready_versions(triton, "echo") == {1}

    # The revert commit is on the tracked branch of the bare remote, comments intact.
    head = git(manifests.bare, "log", "-1", "--format=%H%n%an%n%B", "main")
    assert bad not in head.splitlines()[0]
    assert head.splitlines()[1] == "triton-gitops"
    assert f"Reverted-revision: {bad}" in head
    assert "success-rate=" in head and "fail" in head
    restored = git(manifests.bare, "show", "main:echo.yaml")
    assert "versions: [1]  # the versions that serve" in restored
    assert restored.startswith("# The echo model, watched after every swap.")
    assert json.loads(out)["reverts"][0].startswith("pushed revert ")

    # The alert is in Alertmanager, with the numbers behind the decision.
    (alert,) = [a for a in alertmanager.alerts() if a["labels"]["alertname"] != "Watchdog"]
    assert alert["labels"]["model"] == "echo" and alert["labels"]["server"] == "edge-a"
    assert alert["labels"]["severity"] == "critical"
    assert "success-rate=" in alert["annotations"]["checks"]
    assert bad in alert["annotations"]["revision"]
    assert alert["status"]["state"] == "active"

    # The next pass sees the reverted manifests: nothing to do, nothing held.
    git(manifests.work, "pull", "--quiet", "--rebase", "origin", "main")
    in_sync = setup.plan()
    assert in_sync.code == 0 and "held" not in in_sync.out.split("plan:")[0]

    # A later good commit rolls forward and resolves the alert.
    manifests.write("echo.yaml", analysed([2]))
    manifests.commit("echo 2")
    code, out, _ = rollout(setup, triton, *options)
    assert code == 0, out
    assert ready_versions(triton, "echo") == {2}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        active = [
            a
            for a in alertmanager.alerts(active="true", silenced="false", inhibited="false")
            if a["labels"].get("model") == "echo"
        ]
        if not active:
            break
        time.sleep(0.2)
    assert active == []


def test_the_alert_of_a_hold_stays_active_while_the_hold_lasts(
    setup: Reconciler, manifests: ManifestRepo, triton: LocalTriton, tmp_path: Path
) -> None:
    """Alertmanager resolves an alert nobody sends again within resolve_timeout (2 s here);
    every pass that keeps the hold fires it again."""
    binary = find_binary(ALERTMANAGER_BINARIES, "prometheus-alertmanager")
    alertmanager = Alertmanager(binary, tmp_path / "alertmanager", resolve_timeout="2s")
    alertmanager.start()
    try:
        deploy_under_load(setup, triton)
        manifests.write("echo.yaml", analysed([4]))
        manifests.commit("echo 4")
        options = ("--alertmanager-url", alertmanager.url)
        code, _, _ = rollout(setup, triton, *options)
        assert code == 1 and ready_versions(triton, "echo") == {1}
        ends = time.monotonic() + 6  # three resolve timeouts of passes that keep the hold
        while time.monotonic() < ends:
            kept = setup.apply(*options)
            assert "held" in kept.out, kept.out + kept.err
            time.sleep(0.5)
        active = [
            a
            for a in alertmanager.alerts(active="true", silenced="false", inhibited="false")
            if a["labels"].get("model") == "echo"
        ]
        assert [a["labels"]["alertname"] for a in active] == ["TritonGitopsRolloutFailed"]
        assert active[0]["labels"]["severity"] == "critical"
        assert "held at 1" in active[0]["annotations"]["summary"]
        assert ready_versions(triton, "echo") == {1}
    finally:
        alertmanager.stop()


def test_branch_mode_leaves_the_tracked_branch_alone(
    setup: Reconciler, manifests: ManifestRepo, triton: LocalTriton
) -> None:
    deploy_under_load(setup, triton)
    manifests.write("echo.yaml", analysed([4]))
    bad = manifests.commit("echo 4")
    code, _, _ = rollout(setup, triton, "--revert-mode", "branch")
    assert code == 1
    assert git(manifests.bare, "rev-parse", "main") == bad
    branch = f"triton-gitops/revert-{bad[:12]}"
    assert "versions: [1]" in git(manifests.bare, "show", f"{branch}:echo.yaml")
    assert git(manifests.bare, "rev-parse", f"{branch}~1") == bad


def test_prometheus_source_with_a_promql_check(
    setup: Reconciler,
    manifests: ManifestRepo,
    triton: LocalTriton,
    start_prometheus: StartPrometheus,
) -> None:
    prometheus = start_prometheus([triton.metrics_url.removeprefix("http://").split("/")[0]])
    deploy_under_load(setup, triton)
    kpi = CHECKS + (
        "        - name: traffic\n"
        "          promql: 'sum(rate(nv_inference_request_success{model=\"echo\"}[10s]))'\n"
        "          min: 1\n"
    )
    manifests.write("echo.yaml", analysed([2], checks=kpi, duration="6s"))
    manifests.commit("echo 2 with a business KPI")
    wait_for_series(prometheus.url, 'nv_inference_request_success{model="echo"}')
    code, out, _ = rollout(setup, triton, "--prometheus-url", prometheus.url)
    assert code == 0, out
    record = last_rollout(setup)
    checks = {c["check"]: c for c in record["checks"]}  # type: ignore[union-attr]
    assert checks["traffic"]["verdict"] == "pass" and checks["traffic"]["value"] >= 1

    manifests.write("echo.yaml", analysed([4], checks=kpi, duration="6s"))
    manifests.commit("echo 4")
    code, out, _ = rollout(setup, triton, "--prometheus-url", prometheus.url)
    assert code == 1, out
    assert ready_versions(triton, "echo") == {2}


NO_PROBES = "      probes: {enabled: false}\n"


@pytest.mark.parametrize(
    ("policy", "extra", "code", "ready"),
    [
        # Judged by Triton's counters alone, no client means no traffic: the policy decides
        # (and a pass without evidence needs minEvidence: 0).
        ("pass", NO_PROBES + "      minEvidence: 0\n", 0, {2}),
        ("fail", NO_PROBES, 1, {1}),
        # The probes are traffic: with them, no window goes without requests.
        ("fail", "", 0, {2}),
    ],
)
def test_no_traffic_policy(
    setup: Reconciler,
    manifests: ManifestRepo,
    triton: LocalTriton,
    policy: str,
    extra: str,
    code: int,
    ready: set[int],
) -> None:
    deploy_under_load(setup, triton)
    manifests.write("echo.yaml", analysed([2], duration="2s", no_traffic=policy, extra=extra))
    manifests.commit(f"echo 2, noTraffic {policy}")
    result = setup.apply()  # no client: the new version sees no request
    assert result.code == code, result.out
    assert ready_versions(triton, "echo") == ready


def test_analysis_sources_are_validated(tmp_path: Path) -> None:
    kpi = CHECKS + "        - name: kpi\n          promql: 'up'\n          min: 1\n"
    (tmp_path / "servers.yaml").write_text(server_doc("edge-a", "127.0.0.1:8001", tmp_path))
    (tmp_path / "echo.yaml").write_text(analysed([1], checks=kpi))
    result = cli("validate", str(tmp_path))
    assert result.code == 1  # the analysis names a server without spec.metrics
    # validate asks no Prometheus: that the promql check needs one is a warning here.
    assert "echo.yaml:11: warning: promql check(s) kpi need --prometheus-url" in result.err
    assert "echo.yaml:11: the analysis of 'echo' needs metrics: set spec.metrics on " in (
        result.err
    )
