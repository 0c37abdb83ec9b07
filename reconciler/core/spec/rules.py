"""Checks that span documents: unique names, server references, one
deployment per model and server, dependency cycles, analysis sources; and the warning for
an evidence requirement that only fast models can meet on the probes alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from reconciler.core.spec.yaml import Document
from reconciler.core.triton_config import streams
from reconciler.model.problems import Problem
from reconciler.model.servers import TritonServer
from reconciler.model.spec import DesiredState, ModelDeployment
from reconciler.model.traffic import WEIGHT_SCALE, RouterSpec, Strategy, TrafficSpec, share_text


@dataclass
class Unbuilt:
    """The names of documents the schema refused, by kind: a reference to one of them is
    not reported as unknown (its own problems are, once), so fixing a typo in a server
    does not bring a second wave of problems about the deployments that name it."""

    names: dict[str, set[str]] = field(default_factory=dict)
    labels: list[Mapping[str, str]] = field(default_factory=list)  # of refused TritonServers

    def add(self, kind: str, data: Mapping[str, Any]) -> None:
        metadata = data.get("metadata")
        if not isinstance(metadata, Mapping):
            return
        if isinstance(metadata.get("name"), str):
            self.names.setdefault(kind, set()).add(metadata["name"])
        if kind == "TritonServer" and isinstance(metadata.get("labels"), Mapping):
            self.labels.append(metadata["labels"])

    def declares(self, kind: str, name: str) -> bool:
        return name in self.names.get(kind, ())

    def could_match(self, labels: Mapping[str, str]) -> bool:
        return any(all(found.get(k) == v for k, v in labels.items()) for found in self.labels)


def cross_check(
    servers: list[tuple[Document, TritonServer]],
    deployments: list[tuple[Document, ModelDeployment]],
    unbuilt: Unbuilt,
) -> Iterator[Problem]:
    seen_servers: dict[str, TritonServer] = {}
    for doc, server in servers:
        if server.name in seen_servers:
            first = seen_servers[server.name].location
            yield doc.problem(
                ("metadata", "name"),
                f"duplicate TritonServer name {server.name!r} (first defined at {first})",
            )
        else:
            seen_servers[server.name] = server
    seen_deployments: dict[str, ModelDeployment] = {}
    placed: dict[tuple[str, str], ModelDeployment] = {}
    for doc, deployment in deployments:
        if deployment.name in seen_deployments:
            first = seen_deployments[deployment.name].location
            yield doc.problem(
                ("metadata", "name"),
                f"duplicate ModelDeployment name {deployment.name!r} (first defined at {first})",
            )
            continue
        seen_deployments[deployment.name] = deployment
        if deployment.server_names is not None:
            for index, name in enumerate(deployment.server_names):
                if name not in seen_servers and not unbuilt.declares("TritonServer", name):
                    yield doc.problem(
                        ("spec", "servers", "names", index),
                        f"ModelDeployment {deployment.name!r} names unknown TritonServer {name!r}",
                    )
        targets = [s for s in seen_servers.values() if deployment.selects(s)]
        labels = deployment.match_labels
        if labels is not None and not targets and not unbuilt.could_match(labels):
            yield doc.problem(
                ("spec", "servers", "matchLabels"),
                f"ModelDeployment {deployment.name!r}: matchLabels "
                f"{dict(labels)} match no TritonServer",
            )
        for server in targets:
            other = placed.get((server.name, deployment.model))
            if other is not None:
                yield doc.problem(
                    ("spec",),
                    f"model {deployment.model!r} on server {server.name!r} is already placed by "
                    f"ModelDeployment {other.name!r} ({other.location})",
                )
            else:
                placed[(server.name, deployment.model)] = deployment
        complete = "backend" in deployment.config or "platform" in deployment.config
        blind = [s.name for s in targets if s.model_repository is None]
        if blind and not complete:
            yield doc.problem(
                ("spec",),
                f"ModelDeployment {deployment.name!r}: server(s) {', '.join(blind)} declare no "
                "spec.modelRepository to read the base config from, so spec.config must be "
                "complete (at least backend or platform, inputs and outputs)",
            )


def promql_without_prometheus(desired: DesiredState) -> list[Problem]:
    """The analyses with promql checks, which the reconciler runs only with a Prometheus
    (``--prometheus-url``): a problem for a pass without one, a warning for ``validate``."""
    problems = []
    for deployment in desired.deployments.values():
        spec, where = deployment.analysis, deployment.analysis_location
        if spec is not None and where is not None and spec.needs_prometheus:
            names = ", ".join(c.name for c in spec.checks if c.kind == "promql")
            problems.append(
                Problem(where.file, where.line, f"promql check(s) {names} need --prometheus-url")
            )
    return problems


def analysis_source_problems(desired: DesiredState, *, prometheus: bool) -> list[Problem]:
    """Analyses that cannot read their metrics: PromQL checks without Prometheus, any check
    on a server without a metrics URL."""
    problems = [] if prometheus else promql_without_prometheus(desired)
    for deployment in desired.deployments.values():
        spec, where = deployment.analysis, deployment.analysis_location
        if spec is None or where is None:
            continue
        # Metrics are located by each server's metrics URL, scraped directly or as the
        # Prometheus target's instance label.
        blind = sorted(
            s.name
            for s in desired.servers.values()
            if deployment.selects(s)
            and s.metrics is None
            and not (s.discovery and s.discovery.metrics_port)
        )
        if blind:
            problems.append(
                Problem(
                    where.file,
                    where.line,
                    f"the analysis of {deployment.name!r} needs metrics: set spec.metrics on "
                    f"TritonServer(s) {', '.join(blind)}",
                )
            )
    return problems


def dependency_cycle(edges: Mapping[str, Iterable[str]]) -> list[str] | None:
    """A cycle in ``edges`` (node -> the nodes it depends on), as [a, b, ..., a], or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            found = visit(nxt)
            if found:
                return found
        path.pop()
        done.add(node)
        return None

    for node in sorted(edges):
        found = visit(node)
        if found:
            return found
    return None


def dependency_problems(
    deployments: list[tuple[Document, ModelDeployment]], unbuilt: Unbuilt
) -> Iterator[Problem]:
    """dependsOn naming unknown ModelDeployments; cycles through dependsOn and ensembles."""
    names = {d.name for _, d in deployments}
    by_model: dict[str, set[str]] = {}
    for _, d in deployments:
        by_model.setdefault(d.model, set()).add(d.name)
    edges: dict[str, set[str]] = {}
    where: dict[str, Document] = {}
    for doc, d in deployments:
        where[d.name] = doc
        for index, other in enumerate(d.depends_on):
            if other not in names and not unbuilt.declares("ModelDeployment", other):
                yield doc.problem(
                    ("spec", "dependsOn", index),
                    f"ModelDeployment {d.name!r} depends on unknown ModelDeployment {other!r}",
                )
        edges[d.name] = {o for o in d.depends_on if o in names} | {
            n for m in d.composing_models for n in by_model.get(m, ())
        }
    cycle = dependency_cycle(edges)
    if cycle:
        yield where[cycle[0]].problem(
            ("spec",), f"dependency cycle: {' -> '.join(cycle)} (through dependsOn and ensembles)"
        )


def traffic_problems(
    servers: list[tuple[Document, TritonServer]],
    deployments: list[tuple[Document, ModelDeployment]],
    routers: list[tuple[Document, RouterSpec]],
    unbuilt: Unbuilt,
) -> Iterator[Problem]:
    """Routers whose pools name unknown servers or share one, and ModelDeployments whose
    ``rollout.traffic`` names an unknown router or pool, selects a server in neither of its
    pools, or mixes traffic steps with server steps."""
    known = {server.name: server for _, server in servers}
    by_name: dict[str, RouterSpec] = {}
    for doc, router in routers:
        if router.name in by_name:
            first = by_name[router.name].location
            yield doc.problem(
                ("metadata", "name"),
                f"duplicate Router name {router.name!r} (first defined at {first})",
            )
            continue
        by_name[router.name] = router
        holder: dict[str, str] = {}
        if router.comparator in {p.name for p in router.pools}:
            yield doc.problem(
                ("spec", "comparator", "name"),
                f"Router {router.name!r}: the comparator {router.comparator!r} is also a pool; "
                "it takes mirrored copies only, never the route's traffic",
            )
        if router.comparator and router.gateway is not None and router.comparator_port is None:
            yield doc.problem(
                ("spec", "comparator"),
                f"Router {router.name!r}: a Gateway API comparator needs its Service's port",
            )
        yield from _affinity_problems(doc, router)
        for index, pool in enumerate(router.pools):
            if [p.name for p in router.pools].count(pool.name) > 1:
                yield doc.problem(
                    ("spec", "pools", index, "name"),
                    f"Router {router.name!r}: pool {pool.name!r} is declared twice",
                )
            for position, name in enumerate(pool.server_names or ()):
                if name not in known and not unbuilt.declares("TritonServer", name):
                    yield doc.problem(
                        ("spec", "pools", index, "servers", "names", position),
                        f"Router {router.name!r}, pool {pool.name!r}: unknown TritonServer "
                        f"{name!r}",
                    )
            for server in known.values():
                if not pool.holds(server):
                    continue
                if server.name in holder:
                    yield doc.problem(
                        ("spec", "pools", index),
                        f"Router {router.name!r}: server {server.name!r} is in pools "
                        f"{holder[server.name]!r} and {pool.name!r}; a server stands behind "
                        "one pool",
                    )
                holder.setdefault(server.name, pool.name)
    for doc, deployment in deployments:
        traffic = deployment.rollout.traffic
        if traffic is None:
            continue
        yield from _deployment_traffic(doc, deployment, traffic, by_name, known, unbuilt)


def _affinity_problems(doc: Document, router: RouterSpec) -> Iterator[Problem]:
    """spec.sequenceAffinity is written into an Envoy's route configuration file: it needs
    spec.envoy.routesFile. Through the Gateway API it is the GRPCRoute rule's
    sessionPersistence (the experimental channel's; adapters/gateway.py), nothing more to
    declare."""
    affinity = router.sequence_affinity
    if affinity is None:
        return
    path = ("spec", "sequenceAffinity")
    name = f"Router {router.name!r}"
    if router.envoy is not None and router.envoy.routes_file is None:
        yield doc.problem(
            path,
            f"{name}: sequenceAffinity needs spec.envoy.routesFile, the route configuration "
            "file Envoy reads by RDS, where the reconciler writes and keeps it",
        )
    if affinity.pool_header == affinity.header:
        yield doc.problem(
            (*path, "poolHeader"),
            f"{name}: poolHeader and header must differ (both {affinity.header!r})",
        )


def _sequence_problem(
    doc: Document, deployment: ModelDeployment, traffic: TrafficSpec, router: RouterSpec
) -> Iterator[Problem]:
    """A sequence model (as its manifest shows: ``spec.sequence`` or ``sequence_batching``
    in its config; the plan refuses one known from config.pbtxt too) rolled out by traffic
    through a Router without sequence affinity: a router that picks a pool per request
    sends the later requests of sequences in flight to the other pool at every step, where
    Triton refuses them (7 of 56 client sequences failed at a 50% step through Envoy).
    Allowed where the deployment says its clients keep a sequence on one server."""
    if (
        _declares_sequences(deployment)
        and router.sequence_affinity is None
        and not traffic.allow_without_affinity
    ):
        yield doc.problem(
            ("spec", "rollout", "traffic"),
            f"ModelDeployment {deployment.name!r} is a sequence model and Router "
            f"{router.name!r} ({router.location}) declares no spec.sequenceAffinity: each "
            "traffic step would send the later requests of sequences in flight to a server "
            "that never saw their START. Declare sequenceAffinity on the Router, or set "
            "rollout.traffic.allowWithoutSequenceAffinity: true if the clients keep each "
            "sequence on one server (one gRPC stream per sequence)",
        )


def _deployment_traffic(
    doc: Document,
    deployment: ModelDeployment,
    traffic: TrafficSpec,
    routers: Mapping[str, RouterSpec],
    servers: Mapping[str, TritonServer],
    unbuilt: Unbuilt,
) -> Iterator[Problem]:
    path = ("spec", "rollout", "traffic")
    name = f"ModelDeployment {deployment.name!r}"
    rollout = deployment.rollout
    if rollout.steps or rollout.preview_names is not None or rollout.preview_labels is not None:
        yield doc.problem(
            path,
            f"{name}: rollout.traffic moves traffic through the router; leave out "
            "rollout.steps and rollout.preview (server steps)",
        )
    if deployment.analysis is None:
        yield doc.problem(
            path,
            f"{name}: rollout.traffic needs spec.verify.analysis: each traffic step is judged "
            "by it before the next",
        )
    steps = traffic.steps
    if any(b <= a for a, b in pairwise(steps)) or steps[0] <= 0:
        yield doc.problem(
            (*path, "steps"),
            f"{name}: traffic steps must grow, each above 0% "
            f"(got {', '.join(share_text(s) for s in steps)})",
        )
    router = routers.get(traffic.router)
    if router is None:
        known = ", ".join(sorted(routers)) or "none declared"
        if not unbuilt.declares("Router", traffic.router):
            yield doc.problem(
                (*path, "router"), f"{name}: unknown Router {traffic.router!r} (known: {known})"
            )
        return
    pools = {p.name for p in router.pools}
    field_names = ("stablePool", "canaryPool") if traffic.strategy == "canary" else ("pools",)
    for index, pool in enumerate(traffic.pools):
        if pool not in pools:
            where = (
                (*path, field_names[index]) if len(field_names) == 2 else (*path, "pools", index)
            )
            yield doc.problem(
                where,
                f"{name}: Router {router.name!r} has no pool {pool!r} "
                f"(it has {', '.join(sorted(pools))})",
            )
    if traffic.pools[0] == traffic.pools[1]:
        yield doc.problem(path, f"{name}: the two pools must differ")
    yield from _sequence_problem(doc, deployment, traffic, router)
    if traffic.shadow is not None:
        yield from _shadow_problems(doc, deployment, router)
    outside = sorted(
        server.name
        for server in servers.values()
        if deployment.selects(server) and router.pool_of(server) not in traffic.pools
    )
    if outside:
        yield doc.problem(
            ("spec", "servers"),
            f"{name}: server(s) {', '.join(outside)} are selected but stand in neither pool "
            f"{' nor '.join(traffic.pools)} of Router {router.name!r}",
        )


def _shadow_problems(
    doc: Document, deployment: ModelDeployment, router: RouterSpec
) -> Iterator[Problem]:
    """Live shadow traffic needs a comparator on the router, and is refused for a model
    whose requests must not run more than once (a sequence model: never; one with side
    effects: unless the manifest allows it)."""
    path = ("spec", "rollout", "traffic", "shadow")
    name = f"ModelDeployment {deployment.name!r}"
    if router.comparator is None:
        yield doc.problem(
            path,
            f"{name}: rollout.traffic.shadow mirrors live requests to the comparator, and "
            f"Router {router.name!r} declares none (spec.comparator)",
        )
    shadow = deployment.rollout.traffic.shadow if deployment.rollout.traffic else None
    sequence_model = _declares_sequences(deployment)
    if sequence_model and shadow is not None and not shadow.whole_sequences:
        yield doc.problem(
            path,
            f"{name}: a sequence model is shadowed only by whole sequences: its requests "
            "carry state that single copies would corrupt; set shadow.sequences: whole (and "
            "share: 100%), or use rollout.traffic.mirror or verify.shadow instead",
        )
    elif sequence_model and shadow is not None and shadow.share < WEIGHT_SCALE:
        yield doc.problem(
            (*path, "share"),
            f"{name}: shadow.sequences: whole needs share: 100% (the router mirrors each "
            f"request on its own: at {share_text(shadow.share)} a sequence would reach the "
            "comparator in pieces; the comparator samples whole sequences itself)",
        )
    if (
        shadow is not None
        and not deployment.serving_probes.enabled
        and not shadow.allow_side_effects
    ):
        yield doc.problem(
            path,
            f"{name}: servingProbes.enabled is false (a model with side effects): each "
            "shadowed request would run three more times; set shadow.allowSideEffects: true "
            "if that is safe",
        )


# Below this probe latency a model passes on the probes alone: a warning names the bound
# when it is lower (most models on a GPU answer in tens of milliseconds, large ones slower).
SLOW_MODEL_SECONDS = 0.1


def evidence_warnings(deployments: Iterable[tuple[Document, ModelDeployment]]) -> list[Problem]:
    """A warning for each analysis whose ``minEvidence`` the probes alone reach only for a
    model faster than SLOW_MODEL_SECONDS: with no client traffic (a canary before its
    share, a quiet hour), a slower good version ends inconclusive and is reverted. A probe
    slot sends one probe per ``latency / maxShare`` (and at most ``rate`` a second), over the
    time the evidence is counted: ``duration``, or a traffic rollout's phases together."""
    warnings = []
    for doc, deployment in deployments:
        analysis = deployment.analysis
        if analysis is None or analysis.min_evidence <= 0:
            continue
        probes = analysis.probes
        if not probes.enabled:
            continue
        watched = _evidence_time(deployment)
        fastest = watched * probes.rate * probes.concurrency
        slowest = watched * probes.max_share * probes.concurrency / analysis.min_evidence
        path = ("spec", "verify", "analysis")
        if fastest < analysis.min_evidence:
            warnings.append(
                doc.problem(
                    path,
                    f"minEvidence {analysis.min_evidence}: the probes send at most "
                    f"{fastest:.0f} in {watched:g}s (probes.rate {probes.rate:g}/s); with no "
                    "client traffic no version can pass: raise duration or lower minEvidence",
                )
            )
        elif slowest < SLOW_MODEL_SECONDS:
            warnings.append(
                doc.problem(
                    path,
                    f"minEvidence {analysis.min_evidence}: with no client traffic the probes "
                    f"reach it in {watched:g}s only for a model that answers within "
                    f"{slowest * 1e3:.0f}ms (duration x probes.maxShare {probes.max_share:g} / "
                    "minEvidence); a slower good version would end inconclusive: raise "
                    "duration or probes.maxShare, or lower minEvidence",
                )
            )
    return warnings


def _declares_sequences(deployment: ModelDeployment) -> bool:
    """Whether the manifest says the model is a sequence model (the plan knows it from the
    repository's config as well)."""
    return deployment.sequence is not None or "sequence_batching" in deployment.config


def _evidence_time(deployment: ModelDeployment) -> float:
    """The seconds over which an analysis's evidence is counted: its ``duration``, or, in a
    traffic rollout, every phase's watch (the probe-only phase, the mirror, each step)."""
    analysis = deployment.analysis
    assert analysis is not None
    traffic = deployment.rollout.traffic
    if traffic is None:
        return analysis.duration
    steps = len(traffic.steps) * analysis.duration
    if traffic.mirror:
        return analysis.duration + steps
    if not analysis.probes.enabled:
        return steps
    # The probe-only phase: one interval for a canary, the whole duration for blue-green.
    first = analysis.duration if traffic.strategy is Strategy.BLUE_GREEN else analysis.interval
    return first + steps


def stream_case_problems(deployments: Iterable[tuple[Document, ModelDeployment]]) -> list[Problem]:
    """A smoke case that expects a stream (``stream:``) where spec.config declares the model
    does not (a ``model_transaction_policy`` without ``decoupled: true``): Triton answers such
    a model with one response, which ``stream`` cannot judge. Where spec.config does not say,
    the plan decides from the config it knows (``core/plan/stream_cases.py``)."""
    problems = []
    for doc, deployment in deployments:
        if "model_transaction_policy" not in deployment.config or streams(deployment.config):
            continue
        for index, case in enumerate(deployment.smoke):
            if case.stream is not None:
                problems.append(
                    doc.problem(
                        ("spec", "verify", "smoke", index, "stream"),
                        f"ModelDeployment {deployment.name!r}: smoke case {case.name!r} expects "
                        "a stream, but spec.config declares a model that does not stream "
                        "(model_transaction_policy without decoupled: true): Triton answers it "
                        "with one response; remove stream: or declare decoupled: true",
                    )
                )
    return problems
