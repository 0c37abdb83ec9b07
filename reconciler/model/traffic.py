"""Traffic through a router in front of Triton pools: what the manifests declare (a
``Router`` and a ModelDeployment's ``rollout.traffic``), what a router reports (its weights
and mirror shares, its per-pool statistics) and what a plan asks of it (values only; the
planning is in ``core/plan/traffic.py``, the execution in ``engine/traffic.py``, the routers
in ``adapters/envoy.py`` and ``adapters/gateway.py``).

Shares are integers out of ``WEIGHT_SCALE`` (basis points): 100 is 1% of the route's
requests, 10,000 all of them. Envoy's weighted clusters take them as relative weights and
its mirror fractions as a numerator over TEN_THOUSAND; Gateway API backendRefs weights are
relative too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from reconciler.model.servers import Location, TritonServer
from reconciler.model.shadow import LiveShadow, ShadowTarget

WEIGHT_SCALE = 10_000
NOWHERE = Location("<memory>", 0)


def share_text(share: int) -> str:
    """A share as people write it: ``1%``, ``0.5%``, ``100%``."""
    return f"{share / 100:g}%"


@dataclass(frozen=True)
class Pool:
    """A group of Triton servers behind one of the router's destinations (an Envoy cluster,
    a Gateway API backendRef), by server name or by labels."""

    name: str  # the Envoy cluster, or the GRPCRoute backendRef's Service name
    server_names: tuple[str, ...] | None = None
    match_labels: Mapping[str, str] | None = None
    port: int | None = None  # Gateway API: the backendRef's port

    def holds(self, server: TritonServer) -> bool:
        if self.server_names is not None:
            return (server.instance_of or server.name) in self.server_names
        assert self.match_labels is not None
        return all(server.labels.get(k) == v for k, v in self.match_labels.items())


@dataclass(frozen=True)
class EnvoyRoute:
    """An Envoy whose route's weighted clusters and request mirror policies read runtime
    keys, changed through the admin API (``POST /runtime_modify``)."""

    admin: str  # http://host:port of Envoy's admin listener
    weight_prefix: str  # runtime_key_prefix of the route's weighted_clusters
    mirror_prefix: str  # each pool's mirror share is the runtime key <mirror_prefix>.<pool>
    # The route configuration file Envoy reads by RDS (``path_config_source``, its directory
    # watched) and the reconciler rewrites to keep the route's sequence affinity.
    routes_file: str | None = None


@dataclass(frozen=True)
class GatewayRoute:
    """A Gateway API ``GRPCRoute`` whose rule's backendRefs weights (and RequestMirror
    filter) the reconciler sets through the Kubernetes API."""

    namespace: str
    name: str
    rule: int = 0  # which of spec.rules
    kubeconfig: str | None = None  # none: in-cluster config


class AffinityMechanism(StrEnum):
    # Envoy's stateful sessions (header-based, strict) with a route per pool in front of the
    # weighted route: measured to break no sequence across weight changes
    # (docs/sequence-affinity.md). Consistent hashing broke the share of in-flight sequences
    # each change moves, so it is not offered.
    SESSION = "session"


POOL_HEADER = "x-triton-pool"


@dataclass(frozen=True)
class SequenceAffinity:
    """A Router's ``spec.sequenceAffinity``: how the router keeps each client sequence on
    the server that answered its START while the weights move. ``header``: the request
    header that carries a sequence's session (the router writes the server into it on the
    START's answer, the client sends it back with each later request of the sequence);
    ``pool_header``: the same for the pool the weighted route picked."""

    header: str
    pool_header: str = POOL_HEADER
    mechanism: AffinityMechanism = AffinityMechanism.SESSION
    location: Location = NOWHERE


@dataclass(frozen=True)
class RouterSpec:
    """A ``Router`` manifest: how traffic reaches the Triton pools."""

    name: str
    pools: tuple[Pool, ...]
    envoy: EnvoyRoute | None = None
    gateway: GatewayRoute | None = None
    location: Location = NOWHERE
    # Where live shadow traffic is mirrored (``spec.comparator``): the Envoy cluster, or the
    # Service (and its port) of a RequestMirror backendRef, that reaches the comparator.
    comparator: str | None = None
    comparator_port: int | None = None
    comparator_namespace: str | None = None  # Gateway API: the Service's, if not the route's
    sequence_affinity: SequenceAffinity | None = None

    @property
    def mirror_targets(self) -> tuple[str, ...]:
        """Everything the route may mirror to: each pool, and the comparator."""
        pools = tuple(p.name for p in self.pools)
        return pools + ((self.comparator,) if self.comparator else ())

    def pool(self, name: str) -> Pool:
        return next(p for p in self.pools if p.name == name)

    def pool_of(self, server: TritonServer) -> str | None:
        return next((p.name for p in self.pools if p.holds(server)), None)


class Strategy(StrEnum):
    CANARY = "canary"  # a share of the stable pool's traffic to the canary pool, step by step
    BLUE_GREEN = "blueGreen"  # the idle pool takes the new versions, then all the traffic


@dataclass(frozen=True)
class TrafficSpec:
    """A ModelDeployment's ``rollout.traffic``: which router and pools, how traffic moves."""

    router: str
    strategy: Strategy
    pools: tuple[str, str]  # canary: (stable, canary); blueGreen: (blue, green)
    steps: tuple[int, ...]  # shares of the new pool, in order (the last may be below 100%)
    mirror: int = 0  # share of live requests mirrored to the new pool before it takes any
    keep_old: float = 0.0  # blueGreen: the analysis after the switch lasts at least this
    location: Location = NOWHERE
    shadow: LiveShadow | None = None  # live requests mirrored to the comparator, first
    # A sequence model's clients keep each sequence on one server themselves (one gRPC
    # stream per sequence, say): its rollout may move traffic through a Router that
    # declares no sequenceAffinity (``allowWithoutSequenceAffinity``).
    allow_without_affinity: bool = False


@dataclass(frozen=True)
class RouteState:
    """What a router reports: per pool, its weight and the share mirrored to it."""

    router: str
    reachable: bool
    weights: Mapping[str, int] = field(default_factory=dict)
    mirror: Mapping[str, int] = field(default_factory=dict)
    error: str | None = None
    # What the router's live configuration lacks of its declared sequence affinity, one
    # line each (empty: as declared, or none declared).
    affinity_drift: tuple[str, ...] = ()

    def share(self, pool: str) -> int:
        """The pool's share of the route's requests, out of WEIGHT_SCALE."""
        total = sum(self.weights.values())
        return round(self.weights.get(pool, 0) * WEIGHT_SCALE / total) if total else 0

    def __str__(self) -> str:
        parts = [f"{p} {share_text(self.share(p))}" for p in sorted(self.weights)]
        parts += [f"mirror to {p} {share_text(s)}" for p, s in sorted(self.mirror.items()) if s]
        return ", ".join(parts) or "no pools"


@dataclass(frozen=True)
class RouteUpdate:
    """A planned router change: the weights and mirror shares to set, and why."""

    router: str
    weights: Mapping[str, int]
    mirror: Mapping[str, int]
    reason: str
    # Write the router's sequence affinity configuration back first (it drifted); with no
    # weights, that alone (a rollout moves the route this pass).
    affinity: bool = False


@dataclass(frozen=True)
class TrafficPhase:
    """One setting of the route in a traffic rollout, and whether the new pool's analysis
    runs under it (for at least ``watch`` seconds: the analysis's duration, or blueGreen's
    keepOld when longer)."""

    name: str  # "mirror 10%", "step 2 of 4: canary 5%", "switch: green 100%"
    weights: Mapping[str, int]
    mirror: Mapping[str, int]
    watch: float  # seconds the analysis runs under this setting; 0: none
    # The comparator compares the old and the new versions' answers to the requests the
    # router mirrors to it under this setting (its checks join the analysis).
    shadow: ShadowTarget | None = None


@dataclass(frozen=True)
class TrafficPlan:
    """How a staged rollout moves traffic through its router: the new pool's servers take
    the new versions at ``restore`` (no traffic), then each phase sets the route and the
    analysis watches, then the old pool's servers take the new versions and the route is
    set to ``final``. Any failure sets ``restore`` in one router update first."""

    router: str
    strategy: Strategy
    old_pool: str  # canary: the stable pool; blueGreen: the pool with the traffic now
    new_pool: str  # canary: the canary pool; blueGreen: the idle pool
    phases: tuple[TrafficPhase, ...]
    restore: RouteUpdate  # every request to the old pool, nothing mirrored
    final: RouteUpdate  # canary: back to the stable pool; blueGreen: all on the new pool
    # New-pool servers whose old versions are unloaded before the first phase that sends
    # the pool any request (after a no-traffic probe phase, which still compares with them):
    # their new versions are below the old, and Triton sends unversioned requests to the
    # highest READY version, so beside the old they would take none of the pool's share.
    drop_old_first: tuple[str, ...] = ()
    # The old pool's server where the later phases probe the old versions for those servers,
    # which no longer have them: its interface read, the synthesized requests tried and the
    # old side of every comparison there. None: no server of the old pool serves them all.
    old_probed_on: str | None = None
    # A sequence model (its config's sequence_batching, or spec.sequence) through a router
    # without sequence affinity, which the deployment allows
    # (``allowWithoutSequenceAffinity``: its clients keep a sequence on one server): the
    # router picks a pool per request. Shown by plan.
    splits_sequences: bool = False
