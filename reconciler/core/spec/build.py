"""Typed manifest values from validated documents: TritonServer and
ModelDeployment, durations, sizes, analysis checks, rollouts.

``load_desired_state`` (core/spec/desired.py) calls the builders on documents the schema
accepted. An optional field left out takes the schema's ``default`` (``_or_default``): the
schema is the one place a default is written.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from reconciler.core.spec.durations import schema_seconds
from reconciler.core.spec.pointed import pointed_at
from reconciler.core.spec.promql import promql_syntax_error
from reconciler.core.spec.schema import (
    ANY,
    DEPLOYMENT,
    ROUTER,
    SERVER,
    VERIFY,
    JsonPath,
    or_default,
)
from reconciler.core.spec.smoke_cases import smoke_cases
from reconciler.core.spec.yaml import Document
from reconciler.core.triton_config import canonical
from reconciler.model.analysis import AnalysisSpec, Check, EarlyAbort, NoTraffic, ProbeSpec
from reconciler.model.gate import GateSpec
from reconciler.model.problems import Problem
from reconciler.model.repository import parse_repository
from reconciler.model.servers import Discovery, Location, TritonServer
from reconciler.model.shadow import LiveShadow, Tolerance, Uncomparable, WhenShort
from reconciler.model.spec import (
    BackendSpec,
    ModelDeployment,
    RolloutSpec,
    SequencePolicy,
    ServingProbes,
    ShadowSpec,
)
from reconciler.model.traffic import (
    WEIGHT_SCALE,
    AffinityMechanism,
    EnvoyRoute,
    GatewayRoute,
    Pool,
    RouterSpec,
    SequenceAffinity,
    Strategy,
    TrafficSpec,
)

_SIZE = re.compile(r"^([0-9]+)(Ki|Mi|Gi|Ti)?$")


def _bytes(value: int | str) -> int:
    if isinstance(value, int):
        return value
    match = _SIZE.match(value)
    assert match is not None  # the schema's pattern guarantees the form
    return int(match.group(1)) << {None: 0, "Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40}[match.group(2)]


_ANALYSIS = (*VERIFY, "analysis")
_CHECKS = (*_ANALYSIS, "checks", ANY)


def _serving_probes(probes: Mapping[str, Any]) -> ServingProbes:
    path = ("spec", "servingProbes")
    return ServingProbes(
        enabled=bool(or_default(probes, DEPLOYMENT, *path, "enabled")),
        interval=schema_seconds(or_default(probes, DEPLOYMENT, *path, "interval")),
        failures=int(or_default(probes, DEPLOYMENT, *path, "failures")),
        timeout=schema_seconds(or_default(probes, DEPLOYMENT, *path, "timeout")),
    )


def build_server(doc: Document, spec: dict[str, Any], problems: list[Problem]) -> TritonServer:
    metadata, body = spec["metadata"], spec["spec"]
    discovery = body.get("discovery")
    if "modelRepository" in body:
        try:
            parse_repository(body["modelRepository"])
        except ValueError as exc:
            problems.append(
                doc.problem(
                    ("spec", "modelRepository"),
                    f"TritonServer {metadata['name']!r}: spec.modelRepository {exc}",
                )
            )
    return TritonServer(
        name=metadata["name"],
        labels=dict(metadata.get("labels", {})),
        grpc=body.get("grpc", ""),
        http=body.get("http", ""),
        metrics=body.get("metrics"),
        model_repository=body.get("modelRepository"),
        location=Location(doc.file, doc.start_line),
        discovery=(
            Discovery(
                discovery["dns"],
                discovery["grpcPort"],
                discovery.get("metricsPort"),
                schema_seconds(or_default(discovery, SERVER, "spec", "discovery", "refresh")),
                discovery.get("httpPort"),
            )
            if discovery
            else None
        ),
    )


def build_deployment(
    doc: Document, spec: dict[str, Any], problems: list[Problem]
) -> ModelDeployment:
    """A ModelDeployment from a schema-valid document; what the schema cannot say (config
    that protobuf refuses, smoke data that does not fill its shape, versions written twice)
    is added to ``problems``, in the order of the document."""
    metadata, body = spec["metadata"], spec["spec"]
    model = body.get("model", metadata["name"])
    config = body.get("config", {})
    _check_config(doc, config, model, problems)
    verify = body.get("verify", {})
    smoke = smoke_cases(doc, verify, problems)
    versions, digests = _versions(doc, body, problems)
    servers = body["servers"]
    analysis = verify.get("analysis")
    _check_promql(doc, analysis or {}, problems)
    return ModelDeployment(
        name=metadata["name"],
        model=model,
        versions=versions,
        server_names=tuple(servers["names"]) if "names" in servers else None,
        match_labels=dict(servers["matchLabels"]) if "matchLabels" in servers else None,
        config=config,
        smoke=smoke,
        verify_timeout=schema_seconds(or_default(verify, DEPLOYMENT, *VERIFY, "timeout")),
        analysis=_analysis(analysis) if analysis is not None else None,
        suspend=bool(or_default(body, DEPLOYMENT, "spec", "suspend")),
        digests=digests,
        depends_on=tuple(body.get("dependsOn", ())),
        sequence=_sequence(body),
        backend=_backend(body),
        memory_per_version=(
            _bytes(body["resources"]["memory"]) if "memory" in body.get("resources", {}) else None
        ),
        allow_interface_change=bool(or_default(body, DEPLOYMENT, "spec", "allowInterfaceChange")),
        serving_probes=_serving_probes(body.get("servingProbes", {})),
        when_no_headroom=or_default(
            body.get("rollout", {}), DEPLOYMENT, "spec", "rollout", "whenNoHeadroom"
        ),
        rollout=_rollout(doc, body.get("rollout", {})),
        shadow=_shadow(doc, verify),
        gate=_gate(verify["gate"]) if "gate" in verify else None,
        location=Location(doc.file, doc.start_line),
        analysis_location=(
            Location(doc.file, doc.line(("spec", "verify", "analysis")))
            if analysis is not None
            else None
        ),
        lines=pointed_at(doc, body),
        fingerprint=fingerprint_of(body),
    )


def _check_config(
    doc: Document, config: dict[str, Any], model: str, problems: list[Problem]
) -> None:
    """spec.config as Triton's ModelConfig would take it, and naming the model it is for."""
    try:
        canonical(config)
    except ValueError as exc:
        # Point at the offending key when protobuf names one of spec.config's own keys.
        named = re.search(r'field named "([^"]+)"|parse (\w+) field', str(exc))
        key = next((k for k in (named.groups() if named else ()) if k in config), None)
        where: JsonPath = ("spec", "config", key) if key else ("spec", "config")
        problems.append(doc.problem(where, f"spec.config: {exc}"))
    if "name" in config and config["name"] != model:
        problems.append(
            doc.problem(
                ("spec", "config", "name"),
                f"config.name {config['name']!r} must equal the model name {model!r}",
            )
        )


def _check_promql(doc: Document, analysis: dict[str, Any], problems: list[Problem]) -> None:
    """Each promql check's query must parse (syntax only: no Prometheus is asked)."""
    for index, check in enumerate(analysis.get("checks", [])):
        if "promql" not in check:
            continue
        error = promql_syntax_error(check["promql"])
        if error is not None:
            problems.append(
                doc.problem(
                    (*_ANALYSIS, "checks", index, "promql"),
                    f"check {check['name']}: promql is not valid PromQL: {error}",
                )
            )


def _versions(
    doc: Document, body: dict[str, Any], problems: list[Problem]
) -> tuple[tuple[int, ...], dict[int, str]]:
    """spec.versions, sorted, and the digests pinned for some of them."""
    numbers: list[Any] = []
    digests: dict[int, str] = {}
    for entry in body["versions"]:
        number = entry["version"] if isinstance(entry, dict) else entry
        numbers.append(number)
        if isinstance(entry, dict) and isinstance(number, int):
            digests[number] = entry["digest"]
    if len(set(numbers)) != len(numbers):
        problems.append(doc.problem(("spec", "versions"), "spec.versions lists a version twice"))
    for index, version in enumerate(numbers):
        # JSON Schema's integer admits 2.0; a version number must be written as one.
        if not isinstance(version, int):
            problems.append(
                doc.problem(
                    ("spec", "versions", index),
                    f"spec.versions[{index}]: {version!r} is not a whole version number",
                )
            )
    return tuple(sorted(int(v) for v in numbers)), digests


def _sequence(body: dict[str, Any]) -> SequencePolicy | None:
    if "sequence" not in body:
        return None
    sequence = body["sequence"]
    return SequencePolicy(
        schema_seconds(or_default(sequence, DEPLOYMENT, "spec", "sequence", "drainTimeout")),
        schema_seconds(or_default(sequence, DEPLOYMENT, "spec", "sequence", "idle")),
        sequence.get("drainWebhook"),
    )


def _backend(body: dict[str, Any]) -> BackendSpec | None:
    if "backend" not in body:
        return None
    backend = body["backend"]
    replace = backend.get("replaceLibrary", {})
    return BackendSpec(
        backend["name"],
        backend["revision"],
        tuple(replace.get("command", ())) or None,
        replace.get("webhook"),
    )


def _shadow(doc: Document, verify: dict[str, Any]) -> ShadowSpec | None:
    if "shadow" not in verify:
        return None
    shadow = verify["shadow"]
    compare = shadow.get("compare", {})
    return ShadowSpec(
        shadow["requests"],
        float(or_default(compare, DEPLOYMENT, *VERIFY, "shadow", "compare", "tolerance")),
        float(or_default(compare, DEPLOYMENT, *VERIFY, "shadow", "compare", "minAgreement")),
        compare.get("maxLatencyIncrease"),
        location=Location(doc.file, doc.line(("spec", "verify", "shadow", "requests"))),
        relative_tolerance=float(
            or_default(compare, DEPLOYMENT, *VERIFY, "shadow", "compare", "relativeTolerance")
        ),
        top_k={str(k): int(v) for k, v in compare.get("topK", {}).items()},
    )


def _gate(gate: dict[str, Any]) -> GateSpec:
    path = (*VERIFY, "gate")
    memory = gate.get("maxMemoryIncrease")
    share = float(memory.rstrip("%")) / 100 if isinstance(memory, str) and "%" in memory else None
    return GateSpec(
        max_latency_increase=gate.get("maxLatencyIncrease"),
        max_between_responses_increase=gate.get("maxBetweenResponsesIncrease"),
        min_throughput_ratio=gate.get("minThroughputRatio"),
        max_memory_increase=share,
        max_memory_increase_bytes=_bytes(memory) if memory is not None and share is None else None,
        max_error_rate=or_default(gate, DEPLOYMENT, *path, "maxErrorRate"),
        concurrency=tuple(or_default(gate, DEPLOYMENT, *path, "concurrency")),
        rounds=or_default(gate, DEPLOYMENT, *path, "rounds"),
        requests=or_default(gate, DEPLOYMENT, *path, "requests"),
    )


def fingerprint_of(spec: Mapping[str, Any]) -> str:
    """A short digest of a ModelDeployment's spec, stable across key order and layout."""
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _share(text: str) -> int:
    """``"1%"``, ``"0.25%"`` out of WEIGHT_SCALE (the schema's pattern guarantees the form)."""
    return round(float(text.rstrip("%")) * WEIGHT_SCALE / 100)


def _traffic(doc: Document, spec: dict[str, Any]) -> TrafficSpec:
    path = ("spec", "rollout", "traffic")
    strategy = Strategy(spec["strategy"])
    if strategy is Strategy.CANARY:
        pools = (spec["stablePool"], spec["canaryPool"])
    else:
        pools = (spec["pools"][0], spec["pools"][1])
    # blueGreen without steps switches at once.
    steps = tuple(_share(step) for step in spec["steps"]) if "steps" in spec else (WEIGHT_SCALE,)
    return TrafficSpec(
        router=spec["router"],
        strategy=strategy,
        pools=pools,
        steps=steps,
        mirror=_share(or_default(spec, DEPLOYMENT, *path, "mirror")),
        keep_old=schema_seconds(or_default(spec, DEPLOYMENT, *path, "keepOld")),
        location=Location(doc.file, doc.line(path)),
        shadow=_live_shadow(spec["shadow"]) if "shadow" in spec else None,
        allow_without_affinity=bool(
            or_default(spec, DEPLOYMENT, *path, "allowWithoutSequenceAffinity")
        ),
    )


def _live_shadow(shadow: dict[str, Any]) -> LiveShadow:
    path = ("spec", "rollout", "traffic", "shadow")
    compare = shadow.get("compare", {})

    def given(*where: str) -> Any:
        holder = compare if where[0] == "compare" else shadow
        return or_default(holder, DEPLOYMENT, *path, *where)

    return LiveShadow(
        share=_share(given("share")),
        tolerance=Tolerance(
            float(given("compare", "tolerance")),
            float(given("compare", "relativeTolerance")),
            {str(k): int(v) for k, v in compare.get("topK", {}).items()},
        ),
        min_agreement=float(given("compare", "minAgreement")),
        max_latency_increase=compare.get("maxLatencyIncrease"),
        latency_quantile=str(given("compare", "latencyQuantile")),
        min_requests=int(given("minRequests")),
        rate=float(given("rate")),
        max_share=float(given("maxShare")),
        timeout=schema_seconds(given("timeout")),
        when_short=WhenShort(given("whenShort")),
        max_wait=schema_seconds(given("maxWait")),
        uncomparable=Uncomparable(given("uncomparable")),
        allow_side_effects=bool(given("allowSideEffects")),
        whole_sequences=given("sequences") == "whole",
    )


def build_router(doc: Document, spec: dict[str, Any]) -> RouterSpec:
    metadata, body = spec["metadata"], spec["spec"]
    envoy, gateway = body.get("envoy"), body.get("gatewayAPI")
    where = ("spec", "envoy")
    return RouterSpec(
        name=metadata["name"],
        pools=tuple(
            Pool(
                pool["name"],
                server_names=tuple(pool["servers"]["names"])
                if "names" in pool["servers"]
                else None,
                match_labels=dict(pool["servers"]["matchLabels"])
                if "matchLabels" in pool["servers"]
                else None,
                port=pool.get("port"),
            )
            for pool in body["pools"]
        ),
        envoy=EnvoyRoute(
            envoy["admin"].rstrip("/"),
            or_default(envoy, ROUTER, *where, "weightPrefix"),
            or_default(envoy, ROUTER, *where, "mirrorPrefix"),
            envoy.get("routesFile"),
        )
        if envoy is not None
        else None,
        gateway=GatewayRoute(
            gateway["namespace"],
            gateway["grpcRoute"],
            or_default(gateway, ROUTER, "spec", "gatewayAPI", "rule"),
            gateway.get("kubeconfig"),
        )
        if gateway is not None
        else None,
        location=Location(doc.file, doc.start_line),
        comparator=body["comparator"]["name"] if "comparator" in body else None,
        comparator_port=body.get("comparator", {}).get("port"),
        comparator_namespace=body.get("comparator", {}).get("namespace"),
        sequence_affinity=_affinity(doc, body["sequenceAffinity"])
        if "sequenceAffinity" in body
        else None,
    )


def _affinity(doc: Document, affinity: dict[str, Any]) -> SequenceAffinity:
    path = ("spec", "sequenceAffinity")
    return SequenceAffinity(
        header=affinity["header"],
        pool_header=or_default(affinity, ROUTER, *path, "poolHeader"),
        mechanism=AffinityMechanism(or_default(affinity, ROUTER, *path, "mechanism")),
        location=Location(doc.file, doc.line(path)),
    )


def _rollout(doc: Document, spec: dict[str, Any]) -> RolloutSpec:
    preview = spec.get("preview", {}).get("servers", {})
    webhooks = spec.get("webhooks", {})
    return RolloutSpec(
        traffic=_traffic(doc, spec["traffic"]) if "traffic" in spec else None,
        steps=tuple(step["servers"] for step in spec.get("steps", ())),
        max_parallel=spec.get("maxParallel"),
        preview_names=tuple(preview["names"]) if "names" in preview else None,
        preview_labels=dict(preview["matchLabels"]) if "matchLabels" in preview else None,
        pre_step=webhooks.get("preStep"),
        post_step=webhooks.get("postStep"),
    )


def _analysis(spec: dict[str, Any]) -> AnalysisSpec:
    checks = []
    for check in spec["checks"]:
        if "successRate" in check:
            checks.append(Check(check["name"], "successRate", min=check["successRate"]["min"]))
        elif "latency" in check:
            latency = check["latency"]
            of = str(or_default(latency, DEPLOYMENT, *_CHECKS, "latency", "of"))
            bound = latency["maxIncrease"]
            checks.append(Check(check["name"], "latency", max_increase=bound, of=of))
        elif "memory" in check:
            checks.append(
                Check(
                    check["name"],
                    "memory",
                    max_increase_bytes=check["memory"]["maxIncreaseBytes"],
                )
            )
        else:
            checks.append(
                Check(
                    check["name"],
                    "promql",
                    min=check.get("min"),
                    max=check.get("max"),
                    query=check["promql"],
                )
            )
    probes, abort = spec.get("probes", {}), spec.get("earlyAbort", {})
    probe_path, abort_path = (*_ANALYSIS, "probes"), (*_ANALYSIS, "earlyAbort")
    return AnalysisSpec(
        interval=schema_seconds(or_default(spec, DEPLOYMENT, *_ANALYSIS, "interval")),
        duration=schema_seconds(or_default(spec, DEPLOYMENT, *_ANALYSIS, "duration")),
        failure_limit=or_default(spec, DEPLOYMENT, *_ANALYSIS, "failureLimit"),
        no_traffic=NoTraffic(or_default(spec, DEPLOYMENT, *_ANALYSIS, "noTraffic")),
        checks=tuple(checks),
        inconclusive_limit=or_default(spec, DEPLOYMENT, *_ANALYSIS, "inconclusiveLimit"),
        min_evidence=or_default(spec, DEPLOYMENT, *_ANALYSIS, "minEvidence"),
        initial_delay=schema_seconds(or_default(spec, DEPLOYMENT, *_ANALYSIS, "initialDelay")),
        probes=ProbeSpec(
            enabled=or_default(probes, DEPLOYMENT, *probe_path, "enabled"),
            rate=float(or_default(probes, DEPLOYMENT, *probe_path, "rate")),
            concurrency=or_default(probes, DEPLOYMENT, *probe_path, "concurrency"),
            timeout=schema_seconds(or_default(probes, DEPLOYMENT, *probe_path, "timeout")),
            max_share=float(or_default(probes, DEPLOYMENT, *probe_path, "maxShare")),
        ),
        early_abort=EarlyAbort(
            consecutive_probe_failures=or_default(
                abort, DEPLOYMENT, *abort_path, "consecutiveProbeFailures"
            ),
            confidence=float(or_default(abort, DEPLOYMENT, *abort_path, "confidence")),
            every=schema_seconds(or_default(abort, DEPLOYMENT, *abort_path, "every")),
        ),
    )
