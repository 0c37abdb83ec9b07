"""The manifest kinds as frozen dataclasses: what the planner reads, never raw YAML."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from reconciler.model.analysis import AnalysisSpec
from reconciler.model.gate import GateSpec
from reconciler.model.problems import Problem
from reconciler.model.servers import Discovery, Location, TritonServer
from reconciler.model.traffic import RouterSpec, TrafficSpec


@dataclass(frozen=True)
class Tensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: tuple[Any, ...]


@dataclass(frozen=True)
class Expectation:
    name: str
    data: tuple[Any, ...]
    shape: tuple[int, ...] | None = None
    tolerance: float = 0.0


@dataclass(frozen=True)
class StreamExpectation:
    """A smoke case's ``stream``: what a streaming model's stream must hold beside the
    reassembled answer ``expect`` judges. Defaults are the schema's."""

    min_responses: int | None = None  # None: no lower bound
    max_responses: int | None = None  # None: no upper bound
    each: tuple[tuple[Expectation, ...], ...] = ()  # per response, in order
    deadline: float = 30.0  # the final flag by then
    cap: int = 4096  # more responses than this: cut, failed
    # The first response by then, else the case fails: the one figure of a stream's speed a
    # smoke case can hold a version to by itself (a client's promise, not a comparison), the
    # check of a slow first response when the analysis's probes are off.
    first_response: float | None = None


@dataclass(frozen=True)
class SmokeCase:
    name: str
    inputs: tuple[Tensor, ...]
    expect: tuple[Expectation, ...] = ()
    stream: StreamExpectation | None = None
    # The answer by then (seconds), else the case fails; None: the reconciler's call timeout.
    # A streaming case's is its stream's deadline.
    timeout: float | None = None


@dataclass(frozen=True)
class ShadowSpec:
    """Recorded requests replayed against old and new versions, and how close they must be."""

    requests_file: str  # in the manifest repository, relative to the manifests' folder
    tolerance: float = 0.0  # absolute, per floating-point output element
    min_agreement: float = 1.0  # beyond the serving version's disagreement with itself
    max_latency_increase: float | None = None  # p95 of the interleaved calls
    requests: tuple[tuple[Tensor, ...], ...] = ()  # read from the file at the revision
    location: Location = Location("<memory>", 0)
    relative_tolerance: float = 0.0
    top_k: Mapping[str, int] = field(default_factory=dict)  # classification outputs


@dataclass(frozen=True)
class SequencePolicy:
    """How to swap a sequence model: drain each server first, one server at a time."""

    drain_timeout: float = 300.0
    idle: float = 10.0
    drain_webhook: str | None = None


@dataclass(frozen=True)
class BackendSpec:
    """The backend shared library a model runs on, and how a new revision reaches a host."""

    name: str
    revision: str
    command: tuple[str, ...] | None = None
    webhook: str | None = None


@dataclass(frozen=True)
class RolloutSpec:
    """How a change moves through the servers: preview servers first, then production in
    steps (counts, or percentages as "50%"), at most ``max_parallel`` at once per step."""

    steps: tuple[int | str, ...] = ()
    max_parallel: int | str | None = None
    preview_names: tuple[str, ...] | None = None
    preview_labels: Mapping[str, str] | None = None
    pre_step: str | None = None
    post_step: str | None = None
    # Traffic moved through a Router (``model/traffic.py``) instead of whole servers.
    traffic: TrafficSpec | None = None

    def previews(self, server: TritonServer) -> bool:
        if self.preview_names is not None:
            return (server.instance_of or server.name) in self.preview_names
        if self.preview_labels is not None:
            return all(server.labels.get(k) == v for k, v in self.preview_labels.items())
        return False

    @property
    def staged(self) -> bool:
        return bool(
            self.steps
            or self.max_parallel is not None
            or self.preview_names is not None
            or self.preview_labels is not None
            or self.pre_step
            or self.post_step
            or self.traffic is not None
        )


@dataclass(frozen=True)
class ServingProbes:
    """The service's probes of the versions a deployment serves, between rollouts
    (``spec.servingProbes``; defaults are the schema's)."""

    enabled: bool = True
    interval: float = 10.0  # seconds between two probes of one version
    failures: int = 3  # failed in a row after answering: out of service, reloaded in place
    timeout: float = 2.0  # a probe not answered by then failed


@dataclass(frozen=True)
class ModelDeployment:
    name: str
    model: str
    versions: tuple[int, ...]
    server_names: tuple[str, ...] | None = None
    match_labels: Mapping[str, str] | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    smoke: tuple[SmokeCase, ...] = ()
    verify_timeout: float = 120.0
    analysis: AnalysisSpec | None = None
    suspend: bool = False
    digests: Mapping[int, str] = field(default_factory=dict)  # version -> "sha256:..."
    depends_on: tuple[str, ...] = ()  # ModelDeployment names
    sequence: SequencePolicy | None = None  # declared; also detected from the config
    backend: BackendSpec | None = None
    memory_per_version: int | None = None  # bytes one loaded version needs
    allow_interface_change: bool = False
    serving_probes: ServingProbes = field(default_factory=lambda: ServingProbes())
    when_no_headroom: str = "refuse"  # refuse | replace
    rollout: RolloutSpec = field(default_factory=RolloutSpec)
    shadow: ShadowSpec | None = None
    gate: GateSpec | None = None  # verify.gate: the pre-merge load test's bounds
    location: Location = Location("<memory>", 0)
    analysis_location: Location | None = None
    # Lines of the document's keys a report points at ("versions", "config.output",
    # "verify.gate.maxLatencyIncrease"...): those the document has.
    lines: tuple[tuple[str, int], ...] = ()
    # A digest of the whole spec: a hold on a failed spec lasts until this changes.
    fingerprint: str = ""

    @property
    def composing_models(self) -> tuple[str, ...]:
        """Models an ensemble's spec.config names in its steps (others come from the base
        config, known only once a server's repository or loaded config is read)."""
        steps = self.config.get("ensemble_scheduling", {}).get("step", [])
        return tuple(sorted({str(step["model_name"]) for step in steps if "model_name" in step}))

    def line(self, *keys: str) -> int:
        """The line of the first of ``keys`` the document has (dotted, as in ``lines``),
        else the document's first line."""
        found = dict(self.lines)
        for key in keys:
            if key in found:
                return found[key]
        return self.location.line

    def selects(self, server: TritonServer) -> bool:
        if self.server_names is not None:
            return server.name in self.server_names
        assert self.match_labels is not None
        return all(server.labels.get(k) == v for k, v in self.match_labels.items())


@dataclass(frozen=True)
class Placement:
    """One model that one server must serve, and the deployment that asked for it."""

    server: str
    deployment: ModelDeployment

    @property
    def model(self) -> str:
        return self.deployment.model


@dataclass(frozen=True)
class DesiredState:
    """Everything the manifests at one revision ask for."""

    servers: Mapping[str, TritonServer]
    deployments: Mapping[str, ModelDeployment]
    # server name -> model name -> placement; every server appears, possibly with no models.
    placements: Mapping[str, Mapping[str, Placement]]
    routers: Mapping[str, RouterSpec] = field(default_factory=dict)

    @staticmethod
    def build(
        servers: list[TritonServer],
        deployments: list[ModelDeployment],
        routers: Sequence[RouterSpec] = (),
    ) -> DesiredState:
        placements: dict[str, dict[str, Placement]] = {s.name: {} for s in servers}
        for deployment in deployments:
            for server in servers:
                if deployment.selects(server):
                    placements[server.name][deployment.model] = Placement(server.name, deployment)
        return DesiredState(
            servers={s.name: s for s in servers},
            deployments={d.name: d for d in deployments},
            placements=placements,
            routers={r.name: r for r in routers},
        )

    @property
    def discovered(self) -> dict[str, Discovery]:
        """Declared servers whose instances come from DNS."""
        return {n: s.discovery for n, s in self.servers.items() if s.discovery is not None}

    def with_instances(self, addresses: Mapping[str, Sequence[str]]) -> DesiredState:
        """Each discovered server replaced by one server per address, named
        ``<server>/<address>``, placed with what the declared server is placed with."""
        servers: dict[str, TritonServer] = {}
        placements: dict[str, Mapping[str, Placement]] = {}
        for name, server in self.servers.items():
            if server.discovery is None:
                servers[name] = server
                placements[name] = self.placements[name]
                continue
            for address in addresses.get(name, ()):
                host = f"[{address}]" if ":" in address else address
                instance = f"{name}/{address}"
                port, http = server.discovery.metrics_port, server.discovery.http_port
                servers[instance] = replace(
                    server,
                    name=instance,
                    grpc=f"{host}:{server.discovery.grpc_port}",
                    http=f"{host}:{http}" if http else "",
                    metrics=f"http://{host}:{port}/metrics" if port else None,
                    discovery=None,
                    instance_of=name,
                )
                placements[instance] = {
                    model: Placement(instance, p.deployment)
                    for model, p in self.placements[name].items()
                }
        return DesiredState(servers, self.deployments, placements, self.routers)


@dataclass(frozen=True)
class ManifestReading:
    """What the manifests at one revision give, every stage run on what could be built
    (``core.spec.desired.read_manifests``): the desired state of the documents that passed,
    every problem (sorted by file and line), warnings, and the documents left alone.

    ``desired`` is what the pass may act on only when ``problems`` is empty.
    """

    desired: DesiredState
    problems: tuple[Problem, ...]
    warnings: tuple[Problem, ...] = ()
    # file -> the apiVersion of each document of another tool in it ("none" when it has none)
    ignored: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    documents: int = 0  # documents of this reconciler's apiVersion read

    @property
    def ignored_count(self) -> int:
        return sum(len(v) for v in self.ignored.values())
