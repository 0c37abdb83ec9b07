"""A Router's sequence affinity as Envoy configuration: what the route configuration must
hold for ``spec.sequenceAffinity`` (mechanism ``session``, docs/sequence-affinity.md), what
a live configuration (Envoy's ``/config_dump``) lacks of it, and the route configuration
with it restored. Pure functions over JSON values; ``adapters/envoy.py`` reads the dump,
calls them and writes the result to the Router's ``routesFile``.

The pieces, all in the RouteConfiguration that holds the weighted route (the route whose
``weighted_clusters`` read ``<weightPrefix>.<pool>``), so that one file Envoy reads by RDS
carries them and the reconciler can write them back:

- on the weighted route's virtual host, the stateful session filter's per-route config:
  header-based session state keyed by ``header``, strict (a request naming a server that
  is not in the cluster its route picked fails with 503, rather than reach a server that
  never saw its START);
- on each pool's weighted cluster, ``response_headers_to_add`` of ``poolHeader: <pool>``,
  so that the START's answer tells the client its pool;
- in front of the weighted route, one route per pool (``ROUTE_PREFIX<pool>``) matching
  ``poolHeader: <pool>`` with ``header`` present, to that pool's cluster whatever its
  weight, with the weighted route's other fields (timeout, mirror policies): a sequence's
  later requests stay in their pool and in its statistics.

The listener's HTTP connection manager must list the filter (``STATEFUL_SESSION``, any or
no session state of its own: the virtual host's config overrides it); the listener is the
user's, so its lack is reported, not written.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any

from reconciler.model.traffic import RouterSpec, SequenceAffinity

STATEFUL_SESSION = "envoy.filters.http.stateful_session"
_API = "type.googleapis.com/envoy.extensions"
_PER_ROUTE = f"{_API}.filters.http.stateful_session.v3.StatefulSessionPerRoute"
_HEADER_STATE = "envoy.http.stateful_session.header"
_HEADER_STATE_TYPE = f"{_API}.http.stateful_session.header.v3.HeaderBasedSessionState"
ROUTE_PREFIX = "triton-gitops-sequences-"  # the name of each pool's route, then the pool's
ROUTE_CONFIGURATION = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"


def session_config(affinity: SequenceAffinity) -> dict[str, Any]:
    """The stateful session filter's per-route config for ``affinity``."""
    return {
        "@type": _PER_ROUTE,
        "stateful_session": {
            "session_state": {
                "name": _HEADER_STATE,
                "typed_config": {"@type": _HEADER_STATE_TYPE, "name": affinity.header},
            },
            "strict": True,
        },
    }


def _pool_header(affinity: SequenceAffinity, pool: str) -> dict[str, Any]:
    return {
        "header": {"key": affinity.pool_header, "value": pool},
        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
    }


def pool_route(affinity: SequenceAffinity, pool: str, action: Mapping[str, Any]) -> dict[str, Any]:
    """The route of the later requests of sequences that started in ``pool``: the weighted
    route's ``action`` to the pool's cluster alone."""
    return {
        "match": {
            "prefix": "/",
            "headers": [
                {"name": affinity.pool_header, "string_match": {"exact": pool}},
                {"name": affinity.header, "present_match": True},
            ],
        },
        "route": {
            "cluster": pool,
            **{k: v for k, v in action.items() if k not in ("weighted_clusters", "hash_policy")},
        },
        "name": f"{ROUTE_PREFIX}{pool}",
    }


def _weighted_index(host: Mapping[str, Any], prefix: str) -> int | None:
    for index, route in enumerate(host.get("routes", ())):
        weighted = route.get("route", {}).get("weighted_clusters", {})
        if weighted.get("runtime_key_prefix") == prefix:
            return index
    return None


def with_affinity(route_config: Mapping[str, Any], router: RouterSpec) -> dict[str, Any]:
    """``route_config`` (a RouteConfiguration as JSON) with ``router``'s sequence affinity:
    every piece of it written anew, everything else as it was."""
    affinity, envoy = router.sequence_affinity, router.envoy
    assert affinity is not None and envoy is not None
    config = copy.deepcopy(dict(route_config))
    pools = {p.name for p in router.pools}
    for host in config.get("virtual_hosts", ()):
        index = _weighted_index(host, envoy.weight_prefix)
        if index is None:
            continue
        routes = host["routes"]
        weighted = routes[index]
        for cluster in weighted["route"]["weighted_clusters"].get("clusters", ()):
            if cluster.get("name") in pools:
                kept = [
                    h
                    for h in cluster.get("response_headers_to_add", ())
                    if h.get("header", {}).get("key") != affinity.pool_header
                ]
                cluster["response_headers_to_add"] = [
                    *kept,
                    _pool_header(affinity, cluster["name"]),
                ]
        ours = [r for r in routes if not r.get("name", "").startswith(ROUTE_PREFIX)]
        at = ours.index(weighted)
        action = weighted["route"]
        host["routes"] = [
            *ours[:at],
            *(pool_route(affinity, p.name, action) for p in router.pools),
            *ours[at:],
        ]
        host.setdefault("typed_per_filter_config", {})[STATEFUL_SESSION] = session_config(affinity)
    return config


def walk(node: Any) -> Iterator[dict[str, Any]]:
    """Every JSON object in ``node``, itself first, depth first."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def weighted_route_config(dump: Mapping[str, Any], prefix: str) -> tuple[dict[str, Any], bool]:
    """The RouteConfiguration in ``dump`` (a ``/config_dump``) that holds the weighted route
    with ``prefix``, and whether Envoy took it by RDS (a dynamic route configuration, which
    a file can replace) rather than from its static config. KeyError when none has it."""
    for config in dump.get("configs", ()):
        for entry in config.get("dynamic_route_configs", ()):
            route_config = entry.get("route_config", {})
            if any(_weighted_index(h, prefix) is not None for h in _hosts(route_config)):
                return route_config, True
    for node in walk(dump):
        if "virtual_hosts" in node and any(
            _weighted_index(h, prefix) is not None for h in _hosts(node)
        ):
            return node, False
    raise KeyError(prefix)


def _hosts(route_config: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(route_config.get("virtual_hosts", ()))


def _filter_listed(dump: Mapping[str, Any]) -> bool:
    """Whether a listener's HTTP connection manager lists the stateful session filter."""
    return any(
        f.get("name") == STATEFUL_SESSION
        for node in walk(dump)
        if isinstance(node.get("http_filters"), list)
        for f in node["http_filters"]
    )


def affinity_drift(dump: Mapping[str, Any], router: RouterSpec) -> tuple[tuple[str, ...], bool]:
    """What Envoy's live configuration (``dump``) lacks of ``router``'s sequence affinity,
    one line each, and whether writing the route configuration (``with_affinity``) can
    restore all of it (not when the filter is missing from the listener, or the route is
    static)."""
    affinity, envoy = router.sequence_affinity, router.envoy
    assert affinity is not None and envoy is not None
    drift: list[str] = []
    writable = True
    if not _filter_listed(dump):
        drift.append(
            f"no listener lists the HTTP filter {STATEFUL_SESSION} (add it before the "
            "router filter; examples/envoy/envoy.yaml)"
        )
        writable = False
    try:
        live, dynamic = weighted_route_config(dump, envoy.weight_prefix)
    except KeyError:
        return (*drift, f"no route has weighted_clusters under {envoy.weight_prefix!r}"), False
    if not dynamic:
        drift.append(
            f"the weighted route is in Envoy's static configuration; serve route "
            f"configuration {live.get('name', '')!r} by RDS from spec.envoy.routesFile "
            "so that the reconciler can keep its sequence affinity"
        )
        writable = False
    wanted = with_affinity(live, router)
    for have, want in zip(_hosts(live), _hosts(wanted), strict=True):
        if _weighted_index(want, envoy.weight_prefix) is None:
            continue
        host = want.get("name", "")
        if have.get("typed_per_filter_config", {}).get(STATEFUL_SESSION) != session_config(
            affinity
        ):
            drift.append(
                f"virtual host {host!r}: no stateful session keyed by header "
                f"{affinity.header!r} (strict)"
            )
        wanted_routes = {r.get("name"): r for r in want["routes"]}
        for pool in router.pools:
            name = f"{ROUTE_PREFIX}{pool.name}"
            if name not in {r.get("name") for r in have["routes"]}:
                drift.append(f"virtual host {host!r}: no route {name!r} for pool {pool.name}")
            elif next(r for r in have["routes"] if r.get("name") == name) != wanted_routes[name]:
                drift.append(f"virtual host {host!r}: route {name!r} differs from the one written")
        if [r.get("name") for r in have["routes"]] != [r.get("name") for r in want["routes"]]:
            drift.append(
                f"virtual host {host!r}: the pools' routes are not right in front of the "
                "weighted route"
            )
        weighted_have = have["routes"][_weighted_index(have, envoy.weight_prefix) or 0]
        weighted_want = want["routes"][_weighted_index(want, envoy.weight_prefix) or 0]
        if weighted_have != weighted_want:
            drift.append(
                f"virtual host {host!r}: the weighted clusters do not all answer with "
                f"{affinity.pool_header}: <pool>"
            )
    return tuple(dict.fromkeys(drift)), writable


def discovery_response(route_config: Mapping[str, Any], version: str) -> dict[str, Any]:
    """The file Envoy's filesystem RDS subscription reads: one RouteConfiguration."""
    return {
        "version_info": version,
        "resources": [{**route_config, "@type": ROUTE_CONFIGURATION}],
    }
