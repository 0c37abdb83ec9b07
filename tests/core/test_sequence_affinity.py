"""A Router's sequence affinity as Envoy route configuration (``core/sequence_affinity.py``),
on config dumps shaped as Envoy 1.40's ``/config_dump`` shows them (the real Envoy runs
in tests/adapters/test_envoy.py and tests/integration/test_sequence_affinity.py), and the
plan's restoring update (``core/plan/traffic.py``)."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from reconciler.core.plan.traffic import steady_routes
from reconciler.core.sequence_affinity import (
    ROUTE_PREFIX,
    STATEFUL_SESSION,
    affinity_drift,
    with_affinity,
)
from reconciler.model.traffic import RouteState, SequenceAffinity
from tests.core.test_traffic import ROUTER, desired

AFFINE = replace(
    ROUTER,
    sequence_affinity=SequenceAffinity("x-sequence-id"),
    envoy=replace(ROUTER.envoy, routes_file="/run/envoy/routes.json")
    if ROUTER.envoy is not None
    else None,
)


def route_config() -> dict[str, Any]:
    """The house's route without affinity (testkit.envoy.bootstrap), as config_dump shows it."""
    return {
        "@type": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
        "name": "triton",
        "virtual_hosts": [
            {
                "name": "triton",
                "domains": ["*"],
                "routes": [
                    {"match": {"prefix": "/healthz"}, "direct_response": {"status": 200}},
                    {
                        "match": {"prefix": "/"},
                        "route": {
                            "weighted_clusters": {
                                "clusters": [
                                    {"name": "stable", "weight": 10000},
                                    {"name": "canary"},
                                ],
                                "runtime_key_prefix": "routing.triton",
                            },
                            "timeout": "30s",
                            "request_mirror_policies": [
                                {"cluster": "canary", "runtime_fraction": {"runtime_key": "m"}}
                            ],
                        },
                        "name": "triton",
                    },
                ],
            }
        ],
    }


def dump(config: dict[str, Any], dynamic: bool = True, listed: bool = True) -> dict[str, Any]:
    filters = [{"name": STATEFUL_SESSION}] if listed else []
    filters.append({"name": "envoy.filters.http.router"})
    listeners = {
        "@type": "type.googleapis.com/envoy.admin.v3.ListenersConfigDump",
        "static_listeners": [{"listener": {"filter_chains": [{"filters": [
            {"typed_config": {"http_filters": filters, "rds": {"route_config_name": "triton"}}}
        ]}]}}],
    }  # fmt: skip
    routes: dict[str, Any] = {"@type": "type.googleapis.com/envoy.admin.v3.RoutesConfigDump"}
    key = "dynamic_route_configs" if dynamic else "static_route_configs"
    routes[key] = [{"route_config": config}]
    return {"configs": [listeners, routes]}


def test_the_route_configuration_gains_a_route_per_pool_in_front_and_the_session() -> None:
    config = with_affinity(route_config(), AFFINE)
    host = config["virtual_hosts"][0]
    names = [r.get("name") for r in host["routes"]]
    # The user's routes stay where they were; the pools' routes go right before the weighted.
    assert names == [None, f"{ROUTE_PREFIX}stable", f"{ROUTE_PREFIX}canary", "triton"]
    stable = host["routes"][1]
    assert stable["match"]["headers"] == [
        {"name": "x-triton-pool", "string_match": {"exact": "stable"}},
        {"name": "x-sequence-id", "present_match": True},
    ]
    # The weighted route's timeout and mirror policies, to the pool's cluster alone.
    assert stable["route"] == {
        "cluster": "stable",
        "timeout": "30s",
        "request_mirror_policies": [
            {"cluster": "canary", "runtime_fraction": {"runtime_key": "m"}}
        ],
    }
    clusters = host["routes"][3]["route"]["weighted_clusters"]["clusters"]
    assert [c["response_headers_to_add"][0]["header"] for c in clusters] == [
        {"key": "x-triton-pool", "value": "stable"},
        {"key": "x-triton-pool", "value": "canary"},
    ]
    session = host["typed_per_filter_config"][STATEFUL_SESSION]["stateful_session"]
    assert session["strict"] is True
    assert session["session_state"]["typed_config"]["name"] == "x-sequence-id"
    # Written again, nothing changes: the pieces are replaced, never repeated.
    assert with_affinity(config, AFFINE) == config


def test_drift_is_each_missing_or_changed_piece_and_none_once_written() -> None:
    drift, writable = affinity_drift(dump(route_config()), AFFINE)
    assert writable
    assert (
        "virtual host 'triton': no stateful session keyed by header 'x-sequence-id' (strict)"
        in drift
    )
    assert f"virtual host 'triton': no route '{ROUTE_PREFIX}canary' for pool canary" in drift
    assert any("do not all answer with x-triton-pool" in line for line in drift)
    written = with_affinity(route_config(), AFFINE)
    assert affinity_drift(dump(written), AFFINE) == ((), True)
    # A hand edit of one pool's route (another cluster) is drift, and so is one moved
    # behind the weighted route.
    edited = copy.deepcopy(written)
    edited["virtual_hosts"][0]["routes"][1]["route"]["cluster"] = "canary"
    (line,) = affinity_drift(dump(edited), AFFINE)[0]
    assert (
        line == f"virtual host 'triton': route '{ROUTE_PREFIX}stable' differs from the one written"
    )
    moved = copy.deepcopy(written)
    routes = moved["virtual_hosts"][0]["routes"]
    routes.append(routes.pop(1))
    (line,) = affinity_drift(dump(moved), AFFINE)[0]
    assert "not right in front of the weighted route" in line
    # Another header than declared: the session's drift.
    other = replace(AFFINE, sequence_affinity=SequenceAffinity("x-session"))
    drift, _ = affinity_drift(dump(written), other)
    assert "no stateful session keyed by header 'x-session'" in drift[0]


def test_what_a_route_file_cannot_restore_is_said() -> None:
    drift, writable = affinity_drift(dump(route_config(), listed=False), AFFINE)
    assert not writable and "no listener lists the HTTP filter" in drift[0]
    drift, writable = affinity_drift(dump(route_config(), dynamic=False), AFFINE)
    assert not writable and any("static configuration" in line for line in drift)


def test_the_plan_restores_drifted_affinity_first_even_under_a_rollout() -> None:
    state = desired(router=AFFINE)
    drifted = RouteState("edge", True, {"stable": 10_000, "canary": 0}, affinity_drift=("x",))
    (update,) = steady_routes(state, {"edge": drifted}, set())
    assert update.affinity and not update.weights
    assert update.reason == "sequence affinity restored (x)"
    # A rollout moves the router this pass: the affinity alone, before it.
    (moving,) = steady_routes(state, {"edge": drifted}, {"edge"})
    assert moving.affinity and not moving.weights
    # Off its steady route too: one update does both.
    off = replace(drifted, weights={"stable": 5_000, "canary": 5_000})
    (both,) = steady_routes(state, {"edge": off}, set())
    assert both.affinity and both.weights == {"stable": 10_000, "canary": 0}
    kept = replace(drifted, affinity_drift=())
    assert steady_routes(state, {"edge": kept}, set()) == ()
