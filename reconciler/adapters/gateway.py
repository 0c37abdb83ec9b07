"""Gateway API router: one rule of a ``GRPCRoute``, driven through the Kubernetes API.

A ``Router`` manifest with ``gatewayAPI`` names a GRPCRoute (namespace, name) and which of
its ``spec.rules``; each of its pools is one of that rule's backendRefs (the pool's name is
the backendRef's Service name, its port the backendRef's port). ``GatewayRouter`` reads the
route to tell the pass what it routes by (the backendRefs' weights and the rule's
RequestMirror filters, as shares out of ``WEIGHT_SCALE``) and writes both in one update of
the route when the executor moves traffic. The Gateway implementation (Envoy Gateway,
Istio, Cilium...) turns the route into its data plane's configuration; this module only
talks to the API server.

The only module that imports the official ``kubernetes`` client. Everything else in the
route is left as it was read: its matches, its other filters, the backendRefs' own fields
and filters, RequestMirror filters that mirror to no pool, the other rules. The update is a
``PUT`` of the whole object carrying the ``resourceVersion`` read, because a JSON merge
patch replaces lists whole (``spec.rules`` is a list) and would race with anyone else
editing the route; the API server answers 409 Conflict when someone did, and the update is
read and made again.

An API server that does not answer or refuses, a route that is not there, a rule or a pool
that the route lacks: ``observe`` reports the route unreachable with a message naming the
router, the route and what failed; ``route`` raises ``RouterUnavailable`` with the same.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import urllib3.exceptions
from kubernetes import client as kube
from kubernetes import config as kube_config

from reconciler.model.analysis import PoolFigures
from reconciler.model.errors import RouterUnavailable
from reconciler.model.traffic import WEIGHT_SCALE, RouterSpec, RouteState

GROUP = "gateway.networking.k8s.io"
VERSION = "v1"
PLURAL = "grpcroutes"
FIELD_MANAGER = "triton-gitops"  # who the API server records as the writer of the weights
DEFAULT_WEIGHT = 1  # Gateway API: a backendRef without a weight has weight 1
MIRROR = "RequestMirror"
_CONFLICT = 409
_NOT_FOUND = 404


class _Refused(Exception):
    """The route is not what the Router manifest says (no such rule, a pool it lacks)."""


def _answer(exc: kube.ApiException) -> str:
    """The API server's own words: the Status object's message when it sent one."""
    head = f"{exc.status} {exc.reason}".strip()
    try:
        status = json.loads(exc.body or "")
    except ValueError:
        return head
    message = status.get("message") if isinstance(status, dict) else None
    return f"{head}: {message}" if message else head


def _unanswered(exc: urllib3.exceptions.HTTPError) -> str:
    # MaxRetryError wraps the reason (connection refused, timed out) in a long sentence.
    reason = getattr(exc, "reason", None)
    return str(reason or exc)


def _said(persistence: Mapping[str, Any]) -> str:
    return ", ".join(f"{key} {value}" for key, value in sorted(persistence.items()))


def _mirror_share(mirror: Mapping[str, Any]) -> int:
    """A RequestMirror filter's share out of WEIGHT_SCALE: ``percent``, or ``fraction``
    (denominator 100 unless given), or, with neither, every request (GEP-3171)."""
    if "percent" in mirror:
        return int(mirror["percent"]) * WEIGHT_SCALE // 100
    if "fraction" in mirror:
        fraction = mirror["fraction"]
        denominator = int(fraction.get("denominator", 100))
        return round(int(fraction["numerator"]) * WEIGHT_SCALE / denominator)
    return WEIGHT_SCALE


def _mirror_filter(backend_ref: Mapping[str, Any], share: int) -> dict[str, Any]:
    """The RequestMirror filter for ``share``: ``percent`` when it is a whole percent (what
    most implementations support), a fraction over WEIGHT_SCALE otherwise."""
    mirror: dict[str, Any] = {"backendRef": dict(backend_ref)}
    if share % (WEIGHT_SCALE // 100) == 0:
        mirror["percent"] = share * 100 // WEIGHT_SCALE
    else:
        mirror["fraction"] = {"numerator": share, "denominator": WEIGHT_SCALE}
    return {"type": MIRROR, "requestMirror": mirror}


class GatewayRouter:
    """The ``TrafficRouter`` of a Router manifest whose ``gatewayAPI`` names a GRPCRoute.

    ``api_client`` is for tests (a client pointed at a loopback server); without it the
    client is made on first use from ``kubeconfig`` or, when the manifest names none, from
    the pod's service account, so that a missing kubeconfig is reported like an API server
    that does not answer rather than failing the wiring.
    """

    def __init__(
        self,
        spec: RouterSpec,
        *,
        api_client: kube.ApiClient | None = None,
        timeout: float = 10.0,
        conflict_retries: int = 3,
    ) -> None:
        if spec.gateway is None:
            raise ValueError(f"router {spec.name} names no Gateway API route")
        self.spec = spec
        self.gateway = spec.gateway
        self.timeout = timeout
        self.conflict_retries = conflict_retries
        self._client = api_client
        self._where = f"router {spec.name}: GRPCRoute {self.gateway.namespace}/{self.gateway.name}"

    def __repr__(self) -> str:
        return f"GatewayRouter({self.spec.name!r}, {self.gateway.namespace}/{self.gateway.name})"

    # -- the TrafficRouter port ----------------------------------------------------------------

    def observe(self) -> RouteState:
        try:
            rule = self._rule(self._read())
            weights = {
                pool: int(ref.get("weight", DEFAULT_WEIGHT))
                for pool, ref in self._pool_refs(rule).items()
            }
            mirror = self._mirrored(rule)
        except RouterUnavailable as exc:
            return RouteState(router=self.spec.name, reachable=False, error=str(exc))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            # A route the schema would not admit (a weight that is no number...): data too.
            return RouteState(router=self.spec.name, reachable=False, error=self._unreadable(exc))
        return RouteState(
            router=self.spec.name,
            reachable=True,
            weights=weights,
            mirror=mirror,
            affinity_drift=self._affinity_drift(rule),
        )

    def route(self, weights: Mapping[str, int], mirror: Mapping[str, int]) -> None:
        """Set every pool's weight and mirror share in one ``PUT`` of the route
        (``_replace``: read again and made again on a conflict). No identity (see
        ``identity``)."""
        pools = {p.name for p in self.spec.pools}
        if set(weights) != pools or not set(mirror) <= set(self.spec.mirror_targets):
            # A caller's mistake, not the router's: the plan always names every pool.
            raise ValueError(
                f"router {self.spec.name}: weights for {sorted(weights)} and mirror for "
                f"{sorted(mirror)}, its pools are {sorted(pools)}"
            )
        self._replace(lambda route: self._routed(route, weights, mirror))

    def keep_affinity(self) -> None:
        """The rule's ``sessionPersistence`` (Gateway API's experimental channel, GEP-1619:
        type Header, named by the Router's header) written where the route lacks it; what
        else the rule's session persistence says (timeouts) is kept. An API server whose
        GRPCRoute CRD is the standard channel's drops the field: read back, that is an
        error saying so, not a drift written again at every pass."""
        self._replace(self._persisted)
        if self._affinity_drift(self._rule(self._read())):
            raise RouterUnavailable(
                f"{self._where}: the API server dropped the rule's sessionPersistence: its "
                "GRPCRoute CRD is the Gateway API's standard channel; sequence affinity needs "
                "the experimental channel's CRDs (and a Gateway implementation that supports "
                "session persistence)"
            )

    def _replace(self, change: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        """One ``PUT`` of the route as read, changed by ``change``. A 409 Conflict (the route
        changed since it was read) is read and made again, up to ``conflict_retries``
        times."""
        for attempt in range(self.conflict_retries + 1):
            route = self._read()
            try:
                body = change(route)
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                raise RouterUnavailable(self._unreadable(exc)) from exc
            try:
                self._api().replace_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    self.gateway.namespace,
                    PLURAL,
                    self.gateway.name,
                    body,
                    field_manager=FIELD_MANAGER,
                    # The generated client (37.x) sends no Content-Type for a PUT unless told.
                    _headers={"Content-Type": "application/json"},
                    _request_timeout=self.timeout,
                )
            except kube.ApiException as exc:
                if exc.status == _CONFLICT and attempt < self.conflict_retries:
                    continue
                raise RouterUnavailable(
                    f"{self._where}: the Kubernetes API refused the update "
                    f"(attempt {attempt + 1}): {_answer(exc)}"
                ) from exc
            except urllib3.exceptions.HTTPError as exc:
                raise RouterUnavailable(
                    f"{self._where}: cannot reach the Kubernetes API to update it: "
                    f"{_unanswered(exc)}"
                ) from exc
            return

    def _persistence(self) -> dict[str, str] | None:
        """What the rule's sessionPersistence must say for the Router's sequence affinity."""
        affinity = self.spec.sequence_affinity
        return None if affinity is None else {"type": "Header", "sessionName": affinity.header}

    def _affinity_drift(self, rule: Mapping[str, Any]) -> tuple[str, ...]:
        wanted = self._persistence()
        if wanted is None:
            return ()
        found = rule.get("sessionPersistence")
        if not isinstance(found, Mapping):
            return (f"rule {self.gateway.rule} has no sessionPersistence ({_said(wanted)})",)
        if any(found.get(key) != value for key, value in wanted.items()):
            return (f"rule {self.gateway.rule}'s sessionPersistence is {_said(found)}, not "
                    f"{_said(wanted)}",)  # fmt: skip
        return ()

    def _persisted(self, route: Mapping[str, Any]) -> dict[str, Any]:
        body = copy.deepcopy(dict(route))
        rule = self._rule(body)
        found = rule.get("sessionPersistence")
        rule["sessionPersistence"] = {
            **(found if isinstance(found, Mapping) else {}),
            **(self._persistence() or {}),
        }
        return body

    def identity(self) -> None:
        """None: no identity check applies. The weights live in the route object, which
        the API server keeps; a restart of the Gateway's controller or data plane reads
        the same object again and routes by it, so no restart undoes a phase's route here
        (Envoy's runtime, by contrast, is lost with its process). A change to the route by
        someone else during a phase is what the read-back after the phase catches."""
        return None

    def figures(self, pools: Iterable[str]) -> Mapping[str, PoolFigures] | None:
        """None: the API server holds a route's configuration, not its traffic. Requests
        and their outcomes per backend are counted by the Gateway's data plane (its proxies'
        statistics, scraped by Prometheus), which is read there, not here."""
        return None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def _unreadable(self, exc: Exception) -> str:
        return f"{self._where}: unreadable rule {self.gateway.rule}: {type(exc).__name__}: {exc}"

    # -- reading the route ---------------------------------------------------------------------

    def _api(self) -> kube.CustomObjectsApi:
        if self._client is None:
            try:
                if self.gateway.kubeconfig is not None:
                    self._client = kube_config.new_client_from_config(
                        config_file=self.gateway.kubeconfig
                    )
                else:
                    configuration = kube.Configuration()
                    kube_config.load_incluster_config(client_configuration=configuration)
                    self._client = kube.ApiClient(configuration)
            except (kube_config.ConfigException, OSError, ValueError) as exc:
                source = self.gateway.kubeconfig or "the in-cluster service account"
                raise RouterUnavailable(
                    f"{self._where}: no Kubernetes API client from {source}: {exc}"
                ) from exc
        return kube.CustomObjectsApi(self._client)

    def _read(self) -> dict[str, Any]:
        try:
            route = self._api().get_namespaced_custom_object(
                GROUP,
                VERSION,
                self.gateway.namespace,
                PLURAL,
                self.gateway.name,
                _request_timeout=self.timeout,
            )
        except kube.ApiException as exc:
            if exc.status == _NOT_FOUND:
                raise RouterUnavailable(
                    f"{self._where} does not exist (the Kubernetes API answered {_answer(exc)})"
                ) from exc
            raise RouterUnavailable(
                f"{self._where}: the Kubernetes API refused to read it: {_answer(exc)}"
            ) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise RouterUnavailable(
                f"{self._where}: cannot reach the Kubernetes API: {_unanswered(exc)}"
            ) from exc
        if not isinstance(route, dict):
            raise RouterUnavailable(f"{self._where}: the Kubernetes API sent no object")
        return route

    def _rule(self, route: Mapping[str, Any]) -> dict[str, Any]:
        rules = (route.get("spec") or {}).get("rules") or []
        index = self.gateway.rule
        if not 0 <= index < len(rules) or not isinstance(rules[index], dict):
            raise RouterUnavailable(
                f"{self._where} has no rule {index} (it has {len(rules)} rules)"
            )
        rule: dict[str, Any] = rules[index]
        return rule

    def _pool_refs(self, rule: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """Each pool's backendRef in the rule (the same dicts, to be edited in place), by the
        Service name and, when the pool gives one, the port."""
        refs = [r for r in rule.get("backendRefs") or [] if isinstance(r, dict)]
        found: dict[str, dict[str, Any]] = {}
        for pool in self.spec.pools:
            matching = [
                r
                for r in refs
                if r.get("name") == pool.name and (pool.port is None or r.get("port") == pool.port)
            ]
            if len(matching) != 1:
                port = f" port {pool.port}" if pool.port is not None else ""
                names = ", ".join(f"{r.get('name')}:{r.get('port')}" for r in refs) or "none"
                which = "no backendRef" if not matching else f"{len(matching)} backendRefs"
                raise RouterUnavailable(
                    f"{self._where} rule {self.gateway.rule} has {which} for pool "
                    f"{pool.name}{port} (its backendRefs: {names})"
                )
            found[pool.name] = matching[0]
        # A backendRef that is no pool would take a share the pass does not know of.
        taking = [
            r.get("name")
            for r in refs
            if not any(r is ref for ref in found.values())
            and int(r.get("weight", DEFAULT_WEIGHT)) > 0
        ]
        if taking:
            raise RouterUnavailable(
                f"{self._where} rule {self.gateway.rule} also sends traffic to "
                f"{', '.join(map(str, taking))}, which is no pool of the router"
            )
        return found

    def _pool_of(self, backend_ref: Mapping[str, Any]) -> str | None:
        for pool in self.spec.pools:
            if backend_ref.get("name") == pool.name and (
                pool.port is None or backend_ref.get("port") == pool.port
            ):
                return pool.name
        return None

    def _mirror_target(self, backend_ref: Mapping[str, Any]) -> str | None:
        """The pool a RequestMirror's backendRef reaches, or the comparator."""
        ref = self._comparator_ref()
        if ref and all(backend_ref.get(k) == v for k, v in ref.items()):
            return self.spec.comparator
        return self._pool_of(backend_ref)

    def _comparator_ref(self) -> dict[str, Any]:
        """The backendRef of the comparator's Service (empty: the router declares none)."""
        spec = self.spec
        if not spec.comparator:
            return {}
        ref: dict[str, Any] = {"name": spec.comparator, "port": spec.comparator_port}
        if spec.comparator_namespace:
            ref["namespace"] = spec.comparator_namespace
        return ref

    def _mirrored(self, rule: Mapping[str, Any]) -> dict[str, int]:
        mirror = dict.fromkeys(self.spec.mirror_targets, 0)
        for f in rule.get("filters") or []:
            if not isinstance(f, dict) or f.get("type") != MIRROR:
                continue
            request_mirror = f.get("requestMirror") or {}
            pool = self._mirror_target(request_mirror.get("backendRef") or {})
            if pool is not None:
                try:
                    mirror[pool] += _mirror_share(request_mirror)
                except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
                    raise RouterUnavailable(
                        f"{self._where} rule {self.gateway.rule}: unreadable RequestMirror "
                        f"filter to {pool}: {request_mirror!r}"
                    ) from exc
        return mirror

    # -- writing it ----------------------------------------------------------------------------

    def _routed(
        self, route: Mapping[str, Any], weights: Mapping[str, int], mirror: Mapping[str, int]
    ) -> dict[str, Any]:
        """The route as read, with the rule's pool weights and its RequestMirror filters to
        the pools set; everything else, ``metadata.resourceVersion`` included, as read."""
        body = copy.deepcopy(dict(route))
        rule = self._rule(body)
        refs = self._pool_refs(rule)
        for pool, ref in refs.items():
            ref["weight"] = int(weights[pool])
        kept = [
            f
            for f in rule.get("filters") or []
            if not (
                isinstance(f, dict)
                and f.get("type") == MIRROR
                and self._mirror_target((f.get("requestMirror") or {}).get("backendRef") or {})
            )
        ]
        mirrors = []
        for name, ref in refs.items():
            share = int(mirror.get(name, 0))
            if share > 0:
                # The mirror goes to the same Service and port as the pool's backendRef.
                target: dict[str, Any] = {
                    k: ref[k] for k in ("group", "kind", "name", "namespace", "port") if k in ref
                }
                mirrors.append(_mirror_filter(target, share))
        comparator = self.spec.comparator
        if comparator and int(mirror.get(comparator, 0)) > 0:
            # Live shadow traffic: to the comparator's Service.
            mirrors.append(_mirror_filter(self._comparator_ref(), int(mirror[comparator])))
        if "filters" in rule or mirrors:
            rule["filters"] = kept + mirrors
        return body
