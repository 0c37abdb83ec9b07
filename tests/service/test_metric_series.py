"""The series of the service's metrics that exist before their first event (issue 41, point
6; service/telemetry.py): the label values that do not come from the manifests, held to the
modules that write them, and those a pass's report names (``ReconcilerMetrics.after_pass``).
tests/integration/test_alert_rules.py reads a real service's fresh ``/metrics``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from reconciler.adapters import comparator, shadow_session
from reconciler.model.plan import Plan
from reconciler.model.reports import PassReport
from reconciler.model.shadow import LiveShadow
from reconciler.model.spec import ModelDeployment, RolloutSpec
from reconciler.model.traffic import Strategy, TrafficSpec
from reconciler.service import daemon, http
from reconciler.service.telemetry import (
    PASS_RESULTS,
    SHADOW_OUTCOMES,
    WEBHOOK_RESULTS,
    WEBHOOK_SOURCES,
    ReconcilerMetrics,
)
from reconciler.service.webhooks import WEBHOOK_ROUTES


def strings_passed(module: object, function: str, position: int) -> set[str]:
    """Every string literal in the ``position``-th argument of the calls of ``function`` (a
    name or a method) in ``module``'s source, both branches of a conditional included."""
    source = Path(str(getattr(module, "__file__", ""))).read_text()
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or len(node.args) <= position:
            continue
        called = node.func.attr if isinstance(node.func, ast.Attribute) else None
        called = node.func.id if isinstance(node.func, ast.Name) else called
        if called == function:
            found |= {
                n.value
                for n in ast.walk(node.args[position])
                if isinstance(n, ast.Constant) and isinstance(n.value, str)
            }
    return found


def pass_results() -> set[str]:
    """What ``Daemon.run_pass`` counts a pass as: each string it sets ``result`` to, and
    each ``_record`` returns."""
    tree = ast.parse(Path(str(daemon.__file__)).read_text())
    results: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "result" for t in node.targets
        ):
            value = node.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                results.add(value.value)
        if isinstance(node, ast.FunctionDef) and node.name == "_record":
            results |= {
                n.value.value
                for n in ast.walk(node)
                if isinstance(n, ast.Return)
                and isinstance(n.value, ast.Constant)
                and isinstance(n.value.value, str)
            }
    return results


def test_every_label_value_the_service_writes_is_exported_from_the_start() -> None:
    written = {
        "pass results": (pass_results(), set(PASS_RESULTS)),
        "webhook sources": (
            {*WEBHOOK_ROUTES.values()}
            | strings_passed(http, "_refuse", 0)
            | strings_passed(http, "labels", 0),
            set(WEBHOOK_SOURCES),
        ),
        "webhook results": (
            strings_passed(http, "_refuse", 1) | strings_passed(http, "labels", 1),
            set(WEBHOOK_RESULTS),
        ),
        "shadow outcomes": (
            # The comparator's server and its sessions (adapters/shadow_session.py).
            {
                *strings_passed(comparator, "_count", 0),
                *strings_passed(comparator, "_observer", 1),
                *strings_passed(shadow_session, "_count", 0),
                *strings_passed(shadow_session, "_observer", 1),
            },
            set(SHADOW_OUTCOMES),
        ),
    }
    for what, (found, exported) in written.items():
        # Found at all: the reading of the source still finds the calls.
        assert len(found) >= 4, f"{what}: only {sorted(found)} found in the source"
        assert found <= exported, f"{what} written but not exported at 0: {found - exported}"
    metrics = ReconcilerMetrics()
    sample = metrics.registry.get_sample_value
    missing = [r for r in PASS_RESULTS if sample("triton_gitops_passes_total", {"result": r}) != 0]
    missing += [
        f"{s}/{r}"
        for s in WEBHOOK_SOURCES
        for r in WEBHOOK_RESULTS
        if sample("triton_gitops_webhooks_total", {"source": s, "result": r}) != 0
    ]
    assert not missing, f"not at 0 on a fresh registry: {missing}"


def through_edge(shadow: LiveShadow | None) -> ModelDeployment:
    """Model other, rolled out through router edge; with a shadow phase when given one."""
    pools = ("stable", "canary")
    traffic = TrafficSpec("edge", Strategy.CANARY, pools, (5000,), shadow=shadow)
    return ModelDeployment("ranker", "other", (1,), rollout=RolloutSpec(traffic=traffic))


GATE_ERRORS = "triton_gitops_readiness_gate_errors_total"
STUCK = "triton_gitops_versions_stuck_unloading"
SHADOW = "triton_gitops_shadow_requests_total"


def report(placed: dict[tuple[str, str], ModelDeployment]) -> PassReport:
    servers = {server: f"{server}:8001" for server, _ in placed} | {"edge-c": "edge-c:8001"}
    return PassReport("abc", Plan("abc"), servers=servers, placed=placed)


def test_a_pass_names_the_series_of_its_servers_models_and_shadowed_deployments_at_zero() -> None:
    metrics = ReconcilerMetrics()
    sample = metrics.registry.get_sample_value
    shadowed = through_edge(LiveShadow(500))
    echo = ModelDeployment("echo", "echo", (1,))
    first = {("edge-a", "echo"): echo, ("edge-b", "other"): shadowed}
    metrics.after_pass(report(first))
    expected = {
        GATE_ERRORS: {"server": "edge-c"},
        "triton_gitops_drift_corrections_total": {"server": "edge-a", "model": "echo"},
        STUCK: {"server": "edge-b", "model": "other"},
        SHADOW: {"deployment": "ranker", "outcome": "noise"},
    }
    found = {name: sample(name, labels) for name, labels in expected.items()}
    assert found == dict.fromkeys(expected, 0.0), f"after the first pass: {found}"

    # A count already there stays; label sets no longer named leave; a stuck unload the
    # watch reports is counted, and back to 0 once gone.
    metrics.readiness_gate_errors.labels("edge-a").inc()
    metrics.set_stuck_unloads({("edge-a", "echo"): 2})
    metrics.after_pass(report({("edge-a", "echo"): echo}))
    after = {
        "gate errors of edge-a": sample(GATE_ERRORS, {"server": "edge-a"}),
        "echo stuck on edge-a": sample(STUCK, {"server": "edge-a", "model": "echo"}),
        "other stuck on edge-b": sample(STUCK, {"server": "edge-b", "model": "other"}),
        "ranker's shadow": sample(SHADOW, {"deployment": "ranker", "outcome": "noise"}),
    }
    assert after == {
        "gate errors of edge-a": 1.0,
        "echo stuck on edge-a": 2.0,
        "other stuck on edge-b": None,
        "ranker's shadow": None,
    }, f"after a second pass that placed only echo on edge-a: {after}"
    metrics.set_stuck_unloads({})
    left = sample(STUCK, {"server": "edge-a", "model": "echo"})
    assert left == 0, f"echo placed on edge-a, none stuck any more: {left}"
    # A deployment without a shadow phase names no shadow series.
    metrics.after_pass(report({("edge-b", "other"): through_edge(None)}))
    names = {
        m.name for m in metrics.registry.collect() for s in m.samples if s.labels.get("deployment")
    }
    assert names == set(), f"shadow series without a shadow phase: {names}"


def test_the_metrics_are_as_a_prometheus_user_expects_them() -> None:
    """Issue 45, point 3: the process's own series (the memory bound the example promises
    is read from process_resident_memory_bytes), no ``_created`` twin of every counter, and
    each model's state labelled with the ModelDeployment that places it (a model can be
    placed by a deployment of another name)."""
    metrics = ReconcilerMetrics()
    ranker = through_edge(None)  # ModelDeployment ranker places model other
    placed = {("edge-b", "other"): ranker}
    plan = Plan("abc", in_sync=(("edge-b", "other"),))
    metrics.after_pass(PassReport("abc", plan, servers={"edge-b": "edge-b:8001"}, placed=placed))
    samples = {s.name: s for m in metrics.registry.collect() for s in m.samples}
    expected = {"process_resident_memory_bytes", "process_cpu_seconds_total", "python_info"}
    assert expected <= set(samples), f"missing: {sorted(expected - set(samples))}"
    created = sorted(name for name in samples if name.endswith("_created"))
    assert created == [], f"_created series exported: {created}"
    state = metrics.registry.get_sample_value(
        "triton_gitops_model_state",
        {"server": "edge-b", "model": "other", "deployment": "ranker", "state": "in-sync"},
    )
    assert state == 1.0, f"in-sync of model other by deployment ranker: {state}"
