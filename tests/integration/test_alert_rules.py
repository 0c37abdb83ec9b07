"""The PrometheusRule's alerts (examples/deploy/kubernetes/prometheusrule.yaml) evaluated by a
real Prometheus against real reconciler metrics endpoints.

One Prometheus (127.0.0.1, a free port, scraping and evaluating every second) loads the rule
groups and scrapes, as the job the rules name, three targets: the reconciler's registry
(``ReconcilerMetrics``) with the figures of trouble (a held model, a server unreachable for
three passes, a reverted and a failed rollout, a last success two hours old), the same
registry with healthy figures, and a port nobody listens on (the reconciler down). The test
asserts through ``/api/v1/rules`` that every rule evaluates without error, and through
``/api/v1/alerts`` that each expected alert is pending or firing on the troubled target (or
the dead one) and that nothing fires for the healthy one.

A real service's fresh ``/metrics`` (after its first pass, over two real tritonservers)
carries every series the rules and the dashboard read, at 0, with the label sets its
manifests name (issue 41, point 6): a counter first seen at 1 shows no ``increase()``.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import start_http_server

from reconciler.service.telemetry import ReconcilerMetrics
from testkit.local_triton import LocalTriton, free_port
from testkit.manifests import ManifestRepo, deployment_doc, router_doc, server_doc
from testkit.service_process import wait_until
from tests.integration.test_daemon import service_process
from tests.integration.test_packaging import (
    ALERTS_MUST_HAVE,
    alert_rules,
    dashboard_queries,
    prometheus_rule_groups,
    promql_selectors,
)
from tests.services import StartPrometheus

pytest_plugins = ("tests.services",)

JOB = "triton-gitops"  # the job the rules select: the reconciler's Service name


def serve(metrics: ReconcilerMetrics) -> Iterator[str]:
    """The registry on /metrics at 127.0.0.1 (a port the OS picks); its host:port."""
    server, thread = start_http_server(0, addr="127.0.0.1", registry=metrics.registry)
    try:
        yield f"127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def troubled() -> Iterator[tuple[str, ReconcilerMetrics]]:
    metrics = ReconcilerMetrics()
    metrics.set_model_states({("edge-a", "echo"): "held", ("edge-b", "other"): "in-sync"})
    metrics.reachable.labels("edge-a").set(1)
    metrics.reachable.labels("edge-b").set(0)
    metrics.unreachable_passes.labels("edge-a").set(0)
    metrics.unreachable_passes.labels("edge-b").set(3)
    metrics.last_success.set(time.time() - 7200)
    metrics.set_stuck_unloads({("edge-a", "echo"): 1})  # a version that never goes
    for address in serve(metrics):
        yield address, metrics


@pytest.fixture
def healthy() -> Iterator[tuple[str, ReconcilerMetrics]]:
    metrics = ReconcilerMetrics()
    metrics.set_model_states({("edge-a", "echo"): "in-sync", ("edge-b", "other"): "progressing"})
    for server in ("edge-a", "edge-b"):
        metrics.reachable.labels(server).set(1)
        metrics.unreachable_passes.labels(server).set(0)
    metrics.last_success.set(time.time())
    metrics.set_stuck_unloads({("edge-a", "echo"): 0})  # its unloads end
    for address in serve(metrics):
        yield address, metrics


def api(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]


def wait_for(what: str, check: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.2)


def test_the_alert_rules_fire_on_trouble_and_not_on_a_healthy_reconciler(
    tmp_path: Path,
    start_prometheus: StartPrometheus,
    troubled: tuple[str, ReconcilerMetrics],
    healthy: tuple[str, ReconcilerMetrics],
) -> None:
    bad, bad_metrics = troubled
    good, good_metrics = healthy
    dead = f"127.0.0.1:{free_port('127.0.0.1')}"  # nothing listens: the reconciler is down
    rules = tmp_path / "rules.yml"
    rules.write_text(json.dumps({"groups": prometheus_rule_groups()}))  # JSON is YAML
    prometheus = start_prometheus([bad, good, dead], "1s", job=JOB, rule_files=[rules])

    def scraped_twice() -> bool:
        # Two scrapes of each live target, so a counter's step after them is an increase().
        query = f"{prometheus.url}/api/v1/query?query=count_over_time(up%5B1m%5D)"
        counts = {r["metric"]["instance"]: float(r["value"][1]) for r in api(query)["result"]}
        return all(counts.get(target, 0) >= 2 for target in (bad, good, dead))

    wait_for("every target scraped twice", scraped_twice)
    bad_metrics.rollouts.labels("reverted").inc()
    bad_metrics.rollouts.labels("failed").inc()
    good_metrics.rollouts.labels("converged").inc()

    expected = {
        ("TritonGitopsDown", dead),
        ("TritonGitopsNoSuccessfulPass", bad),
        ("TritonGitopsServerUnreachable", bad),
        ("TritonGitopsModelHeld", bad),
        ("TritonGitopsRolloutFailed", bad),
        ("TritonGitopsRolloutNotReverted", bad),
        ("TritonGitopsVersionStuckUnloading", bad),
    }
    assert {name for name, _ in expected} >= set(ALERTS_MUST_HAVE)

    def active() -> dict[tuple[str, str], dict[str, Any]]:
        alerts = api(f"{prometheus.url}/api/v1/alerts")["alerts"]
        found = {(a["labels"]["alertname"], a["labels"].get("instance", "")): a for a in alerts}
        return found if set(found) >= expected else {}

    alerts = wait_for("every expected alert pending or firing", active)

    assert set(alerts) == expected  # and nothing for the healthy reconciler
    assert all(a["state"] in {"pending", "firing"} for a in alerts.values())
    # Those with no `for:` fire at once; the others wait their `for:` out.
    assert alerts[("TritonGitopsModelHeld", bad)]["state"] == "firing"
    assert alerts[("TritonGitopsDown", dead)]["state"] == "pending"
    held = alerts[("TritonGitopsModelHeld", bad)]
    assert (held["labels"]["model"], held["labels"]["server"]) == ("echo", "edge-a")
    assert held["labels"]["severity"] == "warning"
    stuck = alerts[("TritonGitopsVersionStuckUnloading", bad)]
    assert (stuck["labels"]["model"], stuck["labels"]["server"]) == ("echo", "edge-a"), (
        f"the stuck-unloading alert names another model or server: {stuck['labels']}"
    )
    assert "echo" in held["annotations"]["summary"] and "edge-a" in held["annotations"]["summary"]
    unreachable = alerts[("TritonGitopsServerUnreachable", bad)]
    assert unreachable["labels"]["server"] == "edge-b"
    assert "edge-b" in unreachable["annotations"]["summary"]
    assert "3 passes" in unreachable["annotations"]["summary"]

    groups = api(f"{prometheus.url}/api/v1/rules")["groups"]
    evaluated = {r["name"]: r for g in groups for r in g["rules"]}
    assert set(evaluated) == {r["alert"] for r in alert_rules()}
    for name, rule in evaluated.items():
        assert rule["health"] == "ok" and not rule.get("lastError"), (name, rule)


# The series of a rollout in flight, and a route's share once the reconciler has set it: no
# series before (service/telemetry.py), as 0 would say something false. Only panels read
# them, as they are (never a rate), and no rule.
IN_FLIGHT = frozenset(
    {
        "triton_gitops_rollout_step",
        "triton_gitops_analysis_check_value",
        "triton_gitops_analysis_check_bound",
        "triton_gitops_route_weight",
        "triton_gitops_route_mirror",
    }
)
# The probe streams' histograms, per version of a streaming model from the probes' first look
# at it (service/telemetry.py): the fleet here serves none. Their series on a real service
# probing gen: tests/integration/test_streaming.py.
STREAMING_ONLY = frozenset(
    {
        f"triton_gitops_probe_{name}_seconds_{part}"
        for name in ("first_response", "response_gap")
        for part in ("bucket", "sum", "count")
    }
)


def ranker_through_edge() -> str:
    """Model other on edge-a and edge-b, rolled out through router edge with a shadow
    phase: a deployment whose shadow series the manifests name."""
    return (
        "apiVersion: triton-gitops.dev/v1alpha1\n"
        "kind: ModelDeployment\n"
        "metadata: {name: ranker}\n"
        "spec:\n"
        "  model: other\n"
        "  servers: {names: [edge-a, edge-b]}\n"
        "  versions: [1]\n"
        "  verify:\n"
        "    analysis:\n"
        "      interval: 1s\n"
        "      duration: 2s\n"
        "      checks: [{name: success-rate, successRate: {min: 0.99}}]\n"
        "  rollout:\n"
        "    traffic: {router: edge, strategy: canary, stablePool: stable, canaryPool: canary,\n"
        "              steps: [50%], shadow: {share: 10%}}\n"
    )


@pytest.mark.triton
def test_every_series_a_rule_or_panel_reads_is_on_a_fresh_services_metrics(
    manifests: ManifestRepo,
    triton: LocalTriton,
    triton_b: LocalTriton,
    model_repository: Path,
    tmp_path: Path,
) -> None:
    # What the shipped rules and dashboard read of the reconciler's own metrics, as
    # promql-parser reads their PromQL.
    read_by_rules = {
        name
        for rule in alert_rules()
        for name, _ in promql_selectors(rule["expr"])
        if name.startswith("triton_gitops_")
    }
    panels = [s for expr in dashboard_queries() for s in promql_selectors(expr)]
    read_by_panels = {name for name, _ in panels if name.startswith("triton_gitops_")}
    assert read_by_rules & IN_FLIGHT == set(), f"a rule reads {read_by_rules & IN_FLIGHT}"
    over_a_range = {name for name, ranged in panels if ranged} & IN_FLIGHT
    assert not over_a_range, f"a panel takes the rate of {over_a_range}"
    assert {
        "triton_gitops_readiness_gate_errors_total",
        "triton_gitops_versions_stuck_unloading",
    } <= read_by_rules, read_by_rules

    for name, server in (("edge-a", triton), ("edge-b", triton_b)):
        doc = server_doc(name, server.grpc_address, model_repository, metrics=server.metrics_url)
        manifests.write(f"{name}.yaml", doc)
    # Nobody at the router's admin address: ranker's rollout waits for it (a plan problem),
    # and the manifests name its series all the same.
    nobody = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    pools = {"stable": ["edge-a"], "canary": ["edge-b"]}
    manifests.write("router.yaml", router_doc(nobody, pools, "comparator"))
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a", "edge-b"]))
    manifests.write("ranker.yaml", ranker_through_edge())
    manifests.commit("two servers, echo, and ranker through a router")
    read = (read_by_rules | read_by_panels) - IN_FLIGHT - STREAMING_ONLY
    service = service_process(manifests.url, tmp_path / "service").start()
    try:
        wait_until(lambda: service.pass_count() >= 1, 60, "the first pass")
        # The pass is counted before its end is read back: the serving board's series
        # (triton_gitops_server_serving) come from the watch's reading just after it. A few
        # seconds for that, then whatever is missing is missing.
        metrics: dict[str, float] = {}

        def every_series_read() -> bool:
            scraped = service.metrics()  # a failed scrape keeps the last one
            metrics.clear()
            metrics.update(scraped)
            return not read - {key.split("{")[0] for key in metrics}

        with contextlib.suppress(AssertionError):  # said below, with what is missing
            wait_until(every_series_read, 10, "every series a rule or panel reads")
    finally:
        service.stop()
    exported = {key.split("{")[0] for key in metrics}
    assert read_by_rules & STREAMING_ONLY == set(), f"a rule reads {read_by_rules & STREAMING_ONLY}"
    missing = sorted(read - exported)
    assert not missing, (
        f"read by a shipped rule or panel, not on the fresh service's /metrics: {missing}"
    )
    # With the label sets the manifests name.
    named = [
        f'triton_gitops_readiness_gate_errors_total{{server="{s}"}}' for s in ("edge-a", "edge-b")
    ]
    named += [
        f'triton_gitops_{name}{{model="{model}",server="{server}"}}'
        for name in ("versions_stuck_unloading", "drift_corrections_total")
        for server in ("edge-a", "edge-b")
        for model in ("echo", "other")
    ]
    named += [
        f'triton_gitops_shadow_requests_total{{deployment="ranker",outcome="{outcome}"}}'
        for outcome in ("compared", "candidate_disagreed", "noise")
    ]
    absent = [series for series in named if series not in metrics]
    assert not absent, f"not on the fresh service's /metrics: {absent}"
    # No event happened: each of them at 0.
    counted = {series: metrics[series] for series in named if metrics[series] != 0}
    assert not counted, f"counted on a fresh service: {counted}"
