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
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import start_http_server

from reconciler.service.telemetry import ReconcilerMetrics
from testkit.local_triton import free_port
from tests.integration.test_packaging import (
    ALERTS_MUST_HAVE,
    alert_rules,
    prometheus_rule_groups,
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
