"""The schemas are the one home of the defaults of optional manifest fields: the builders
(core/spec/build.py, core/spec/smoke_cases.py) read every default from them, through
``schema.or_default``, and write none of their own."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from typing import Any

import pytest

from reconciler.core.spec import build, schema, smoke_cases
from reconciler.core.spec.desired import load_desired_state
from reconciler.core.spec.durations import duration_seconds
from reconciler.core.spec.schema import KIND_SCHEMAS, schema_defaults
from reconciler.core.spec.schema import default as schema_default
from reconciler.model.analysis import AnalysisSpec, NoTraffic
from reconciler.model.servers import Discovery
from reconciler.model.shadow import LiveShadow
from reconciler.model.spec import (
    DesiredState,
    Expectation,
    ModelDeployment,
    SequencePolicy,
    ShadowSpec,
    StreamExpectation,
)

# Every optional object is there, with each field that has a default left out.
MANIFESTS = textwrap.dedent(
    """\
    apiVersion: triton-gitops/v1alpha1
    kind: TritonServer
    metadata: {name: edge}
    spec:
      discovery: {dns: triton.internal, grpcPort: 8001}
    ---
    apiVersion: triton-gitops/v1alpha1
    kind: ModelDeployment
    metadata: {name: resnet}
    spec:
      servers: {names: [edge]}
      versions: [1]
      config: {backend: python}
      verify:
        smoke:
          - inputs: {X: {datatype: FP32, shape: [1], data: [1]}}
            expect: {Y: {data: [1]}}
            stream: {each: [{Y: {data: [1]}}]}
        analysis:
          checks: [{name: ok, successRate: {min: 0.9}}, {name: slow, latency: {maxIncrease: 0.5}}]
        shadow: {requests: r.jsonl, compare: {}}
        gate: {maxMemoryIncrease: 30%}
      sequence: {}
      rollout: {}
    ---
    apiVersion: triton-gitops/v1alpha1
    kind: TritonServer
    metadata: {name: blue}
    spec: {grpc: "127.0.0.1:1"}
    ---
    apiVersion: triton-gitops/v1alpha1
    kind: TritonServer
    metadata: {name: green}
    spec: {grpc: "127.0.0.1:2"}
    ---
    apiVersion: triton-gitops/v1alpha1
    kind: Router
    metadata: {name: envoy}
    spec:
      envoy: {admin: "http://127.0.0.1:9901", routesFile: /run/envoy/routes.json}
      sequenceAffinity: {header: x-sequence-id}
      comparator: {name: comparator}
      pools:
        - {name: blue, servers: {names: [blue]}}
        - {name: green, servers: {names: [green]}}
    ---
    apiVersion: triton-gitops/v1alpha1
    kind: Router
    metadata: {name: gateway}
    spec:
      gatewayAPI: {namespace: ml, grpcRoute: triton}
      pools:
        - {name: blue, servers: {names: [blue]}}
        - {name: green, servers: {names: [green]}}
    ---
    apiVersion: triton-gitops/v1alpha1
    kind: ModelDeployment
    metadata: {name: switched}
    spec:
      servers: {names: [blue, green]}
      versions: [1]
      config: {backend: python}
      verify:
        analysis: {interval: 1s, duration: 2s, checks: [{name: ok, successRate: {min: 0.9}}]}
      rollout:
        traffic: {router: envoy, strategy: blueGreen, pools: [blue, green], shadow: {}}
    """
)


def load() -> DesiredState:
    return load_desired_state({"m.yaml": MANIFESTS.encode()})


def test_left_out_fields_take_the_defaults_they_always_had() -> None:
    state = load()
    server, deployment = state.servers["edge"], state.deployments["resnet"]
    assert server.discovery is not None and server.discovery.refresh == 10.0
    assert deployment.verify_timeout == 120.0
    assert deployment.smoke[0].expect[0].tolerance == 0.0
    assert deployment.analysis is not None
    assert deployment.analysis.interval == 10.0
    assert deployment.analysis.duration == 60.0
    assert deployment.analysis.failure_limit == 0
    assert deployment.analysis.no_traffic is NoTraffic.WAIT
    assert deployment.analysis.checks[1].of == "firstResponse"
    assert deployment.shadow is not None
    assert (deployment.shadow.tolerance, deployment.shadow.min_agreement) == (0.0, 1.0)
    assert deployment.suspend is False
    assert deployment.allow_interface_change is False
    assert deployment.sequence is not None
    assert (deployment.sequence.drain_timeout, deployment.sequence.idle) == (300.0, 10.0)
    assert deployment.when_no_headroom == "refuse"
    envoy, gateway = state.routers["envoy"].envoy, state.routers["gateway"].gateway
    assert envoy is not None and (envoy.weight_prefix, envoy.mirror_prefix) == (
        "routing.triton",
        "mirror.triton",
    )
    assert gateway is not None and gateway.rule == 0
    affinity = state.routers["envoy"].sequence_affinity
    assert affinity is not None
    assert (affinity.pool_header, affinity.mechanism) == ("x-triton-pool", "session")
    traffic = state.deployments["switched"].rollout.traffic
    assert traffic is not None
    assert (traffic.mirror, traffic.keep_old, traffic.steps) == (0, 0.0, (10_000,))
    assert traffic.allow_without_affinity is False
    assert traffic.shadow == LiveShadow(share=1_000)  # 10%, and the model's own defaults


def test_the_builder_reads_every_schema_default_and_only_those(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: set[tuple[str, tuple[str, ...]]] = set()

    def spy(kind: str, *path: str) -> Any:
        asked.add((kind, path))
        return schema_default(kind, *path)  # a KeyError if the schema has no default there

    monkeypatch.setattr(schema, "default", spy)
    load()
    in_schemas = {(kind, path) for kind in KIND_SCHEMAS for path in schema_defaults(kind)}
    assert asked == in_schemas


def test_a_changed_schema_default_changes_what_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    def other(kind: str, *path: str) -> Any:
        given = schema_default(kind, *path)
        if not isinstance(given, str):  # lists (gate.concurrency) are not keys
            return given
        return {"120s": "7s", "refuse": "replace"}.get(given, given)

    monkeypatch.setattr(schema, "default", other)
    deployment = load().deployments["resnet"]
    assert (deployment.verify_timeout, deployment.when_no_headroom) == (7.0, "replace")


def _own_value(fallback: ast.expr) -> bool:
    """Whether a fallback is a value of its own: not None, not empty (an absent block read
    as empty), not computed from the document."""
    if isinstance(fallback, ast.Constant):
        return fallback.value not in (None, "")
    if isinstance(fallback, ast.Dict):
        return bool(fallback.keys)
    if isinstance(fallback, ast.List | ast.Tuple):
        return bool(fallback.elts)
    return False


@pytest.mark.parametrize("builder", [build, smoke_cases])
def test_the_builder_writes_no_default_of_its_own(builder: Any) -> None:
    fallbacks = [
        f"{builder.__name__}:{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(ast.parse(inspect.getsource(builder)))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and len(node.args) == 2
        and _own_value(node.args[1])
    ]
    assert fallbacks == []


SERVER, DEPLOYMENT = "TritonServer", "ModelDeployment"
TOLERANCE = ("spec", "verify", "smoke", "*", "expect", "*", "tolerance")

# The model's values carry the same defaults for code and tests that make them directly.
MODEL_DEFAULTS = [
    (Discovery, "refresh", SERVER, ("spec", "discovery", "refresh")),
    (Expectation, "tolerance", DEPLOYMENT, TOLERANCE),
    (ShadowSpec, "tolerance", DEPLOYMENT, ("spec", "verify", "shadow", "compare", "tolerance")),
    (
        ShadowSpec,
        "min_agreement",
        DEPLOYMENT,
        ("spec", "verify", "shadow", "compare", "minAgreement"),
    ),
    (SequencePolicy, "drain_timeout", DEPLOYMENT, ("spec", "sequence", "drainTimeout")),
    (SequencePolicy, "idle", DEPLOYMENT, ("spec", "sequence", "idle")),
    (
        Expectation,
        "tolerance",
        DEPLOYMENT,
        ("spec", "verify", "smoke", "*", "stream", "each", "*", "*", "tolerance"),
    ),
    (
        StreamExpectation,
        "deadline",
        DEPLOYMENT,
        ("spec", "verify", "smoke", "*", "stream", "deadline"),
    ),
    (
        StreamExpectation,
        "cap",
        DEPLOYMENT,
        ("spec", "verify", "smoke", "*", "stream", "maxResponses"),
    ),
    (ModelDeployment, "verify_timeout", DEPLOYMENT, ("spec", "verify", "timeout")),
    (ModelDeployment, "suspend", DEPLOYMENT, ("spec", "suspend")),
    (ModelDeployment, "allow_interface_change", DEPLOYMENT, ("spec", "allowInterfaceChange")),
    (ModelDeployment, "when_no_headroom", DEPLOYMENT, ("spec", "rollout", "whenNoHeadroom")),
    (AnalysisSpec, "failure_limit", DEPLOYMENT, ("spec", "verify", "analysis", "failureLimit")),
    (AnalysisSpec, "no_traffic", DEPLOYMENT, ("spec", "verify", "analysis", "noTraffic")),
    *(
        (LiveShadow, name, DEPLOYMENT, ("spec", "rollout", "traffic", "shadow", *where))
        for name, where in (
            ("min_agreement", ("compare", "minAgreement")),
            ("latency_quantile", ("compare", "latencyQuantile")),
            ("min_requests", ("minRequests",)),
            ("rate", ("rate",)),
            ("max_share", ("maxShare",)),
            ("timeout", ("timeout",)),
            ("when_short", ("whenShort",)),
            ("max_wait", ("maxWait",)),
            ("uncomparable", ("uncomparable",)),
            ("allow_side_effects", ("allowSideEffects",)),
        )
    ),
]


@pytest.mark.parametrize(("value", "name", "kind", "path"), MODEL_DEFAULTS)
def test_the_model_values_default_as_the_schema_does(
    value: type[Any], name: str, kind: str, path: tuple[str, ...]
) -> None:
    declared = {f.name: f.default for f in dataclasses.fields(value)}[name]
    given = schema_default(kind, *path)
    seconds = duration_seconds(given) if isinstance(given, str) else None
    assert declared == (seconds if seconds is not None else given)
