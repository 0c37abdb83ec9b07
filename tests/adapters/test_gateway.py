"""The Gateway API router against recorded API shapes, served from a loopback HTTP server.

No Kubernetes API server runs here. The JSON files of ``recorded/gateway/`` were written
after the Gateway API v1 GRPCRoute schema (with the defaults an API server fills in) and the
Kubernetes ``Status`` objects of a 403, 404 and 409; they were not captured from a live
server. A ``ThreadingHTTPServer`` on 127.0.0.1 answers the official client's requests from a
script and records each one, so the tests assert what the adapter sends: method, path,
content type and body.
"""

from __future__ import annotations

import copy
import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from kubernetes import client as kube
from ruamel.yaml import YAML

from reconciler.adapters.gateway import GatewayRouter
from reconciler.model.errors import RouterUnavailable
from reconciler.model.traffic import GatewayRoute, Pool, RouterSpec, SequenceAffinity

RECORDED = Path(__file__).parent / "recorded" / "gateway"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "deploy" / "gateway-api"
PATH = "/apis/gateway.networking.k8s.io/v1/namespaces/serving/grpcroutes/triton"

POOLS = (
    Pool("triton-stable", server_names=("stable-0", "stable-1"), port=8001),
    Pool("triton-canary", server_names=("canary-0",), port=8001),
)


def recorded(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((RECORDED / name).read_text())
    return loaded


def spec(
    rule: int = 0, pools: tuple[Pool, ...] = POOLS, kubeconfig: str | None = None
) -> RouterSpec:
    return RouterSpec("edge", pools, gateway=GatewayRoute("serving", "triton", rule, kubeconfig))


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any


class ApiServer:
    """A loopback HTTP server answering from a script of (status, JSON body), in order (or,
    when ``answer`` is set, from what it answers each request), and recording every
    request it was sent."""

    def __init__(self) -> None:
        self.script: list[tuple[int, dict[str, Any]]] = []
        self.answer: Callable[[Request], tuple[int, dict[str, Any]]] | None = None
        self.requests: list[Request] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                url = urlsplit(self.path)
                request = Request(
                    self.command,
                    url.path,
                    url.query,
                    {k.lower(): v for k, v in self.headers.items()},
                    json.loads(raw) if raw else None,
                )
                server.requests.append(request)
                if server.answer is not None:
                    status, body = server.answer(request)
                else:
                    status, body = server.script.pop(0) if server.script else (500, {})
                out = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_PUT = do_PATCH = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_port}"
        self.thread = threading.Thread(target=self.http.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.thread.join()


@pytest.fixture
def api() -> Iterator[ApiServer]:
    server = ApiServer()
    yield server
    server.close()


def client_for(url: str) -> kube.ApiClient:
    return kube.ApiClient(kube.Configuration(host=url))


def router(api: ApiServer, **kw: Any) -> GatewayRouter:
    return GatewayRouter(spec(**kw), api_client=client_for(api.url))


def refused_url() -> str:
    """The URL of a loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def updated(route: dict[str, Any], version: str) -> dict[str, Any]:
    answer = copy.deepcopy(route)
    answer["metadata"]["resourceVersion"] = version
    return answer


# -- observe -----------------------------------------------------------------------------------


def test_observe_reads_the_rule_weights_and_the_mirror_to_a_pool(api: ApiServer) -> None:
    api.script = [(200, recorded("grpcroute.json"))]
    state = router(api).observe()
    assert state.reachable, state.error
    assert state.router == "edge"
    assert dict(state.weights) == {"triton-stable": 9000, "triton-canary": 1000}
    # percent 5 to the canary; the mirror to request-log is no pool's and is not reported.
    assert dict(state.mirror) == {"triton-stable": 0, "triton-canary": 500}
    assert state.share("triton-canary") == 1000
    (request,) = api.requests
    assert (request.method, request.path, request.body) == ("GET", PATH, None)
    assert request.headers["accept"] == "application/json"


def test_observe_a_backendref_without_weight_weighs_1_and_a_fraction_mirror(
    api: ApiServer,
) -> None:
    route = recorded("grpcroute.json")
    rule = route["spec"]["rules"][0]
    for ref in rule["backendRefs"]:
        del ref["weight"]
    rule["filters"][2]["requestMirror"] = {
        "backendRef": {"name": "triton-canary", "port": 8001},
        "fraction": {"numerator": 1, "denominator": 400},  # 0.25%
    }
    api.script = [(200, route)]
    state = router(api).observe()
    assert state.reachable, state.error
    assert dict(state.weights) == {"triton-stable": 1, "triton-canary": 1}
    assert state.share("triton-stable") == 5000
    assert state.mirror["triton-canary"] == 25


def test_observe_a_fraction_without_denominator_is_out_of_100(api: ApiServer) -> None:
    route = recorded("grpcroute.json")
    route["spec"]["rules"][0]["filters"][2]["requestMirror"] = {
        "backendRef": {"name": "triton-canary", "port": 8001},
        "fraction": {"numerator": 3},
    }
    api.script = [(200, route)]
    assert router(api).observe().mirror["triton-canary"] == 300


def test_observe_a_route_that_does_not_exist_is_unreachable_and_says_so(api: ApiServer) -> None:
    api.script = [(404, recorded("status-404.json"))]
    state = router(api).observe()
    assert not state.reachable
    assert state.weights == {}
    assert state.error is not None
    assert state.error.startswith("router edge: GRPCRoute serving/triton does not exist")
    assert '"triton" not found' in state.error  # the API server's own message


def test_observe_an_api_server_that_refuses_connections_is_unreachable() -> None:
    url = refused_url()
    state = GatewayRouter(spec(), api_client=client_for(url)).observe()
    assert not state.reachable
    assert state.error is not None
    assert "router edge: GRPCRoute serving/triton: cannot reach the Kubernetes API" in state.error
    assert "Connection refused" in state.error


def test_observe_a_pool_missing_from_the_backendrefs_is_an_error_naming_it(
    api: ApiServer,
) -> None:
    pools = (*POOLS, Pool("triton-green", server_names=("green-0",), port=8001))
    api.script = [(200, recorded("grpcroute.json"))]
    state = router(api, pools=pools).observe()
    assert not state.reachable
    assert state.error is not None
    assert "rule 0 has no backendRef for pool triton-green port 8001" in state.error
    assert "triton-stable:8001, triton-canary:8001" in state.error


def test_observe_a_pool_on_another_port_is_missing(api: ApiServer) -> None:
    pools = (POOLS[0], Pool("triton-canary", server_names=("canary-0",), port=9001))
    api.script = [(200, recorded("grpcroute.json"))]
    state = router(api, pools=pools).observe()
    assert not state.reachable
    assert state.error is not None
    assert "no backendRef for pool triton-canary port 9001" in state.error


def test_observe_a_rule_the_route_lacks_is_an_error(api: ApiServer) -> None:
    api.script = [(200, recorded("grpcroute.json"))]
    state = router(api, rule=2).observe()
    assert not state.reachable
    assert state.error == "router edge: GRPCRoute serving/triton has no rule 2 (it has 2 rules)"


def test_observe_a_backendref_that_is_no_pool_and_takes_traffic_is_an_error(
    api: ApiServer,
) -> None:
    # Rule 1 sends to triton-stable only: with one pool the canary backendRef is no pool.
    api.script = [(200, recorded("grpcroute.json"))]
    state = router(api, pools=POOLS[:1]).observe()
    assert not state.reachable
    assert state.error is not None
    assert "also sends traffic to triton-canary, which is no pool" in state.error


def test_observe_a_weight_that_is_no_number_is_unreachable_not_raised(api: ApiServer) -> None:
    route = recorded("grpcroute.json")
    route["spec"]["rules"][0]["backendRefs"][0]["weight"] = "heavy"
    api.script = [(200, route), (200, route), (200, updated(route, "48214"))]
    state = router(api).observe()
    assert not state.reachable
    assert state.error is not None
    assert state.error.startswith("router edge: GRPCRoute serving/triton: unreadable rule 0")
    # route() writes every pool's weight, this one included.
    router(api).route({"triton-stable": 10000, "triton-canary": 0}, {})
    assert [r.method for r in api.requests] == ["GET", "GET", "PUT"]
    refs = api.requests[2].body["spec"]["rules"][0]["backendRefs"]
    assert [r["weight"] for r in refs] == [10000, 0]


def test_observe_through_a_kubeconfig_sends_its_token(api: ApiServer, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        f"""
apiVersion: v1
kind: Config
clusters:
  - name: loopback
    cluster: {{server: "{api.url}"}}
users:
  - name: reconciler
    user: {{token: recorded-token}}
contexts:
  - name: loopback
    context: {{cluster: loopback, user: reconciler}}
current-context: loopback
"""
    )
    api.script = [(200, recorded("grpcroute.json"))]
    gateway = GatewayRouter(spec(kubeconfig=str(kubeconfig)))
    state = gateway.observe()
    gateway.close()
    assert state.reachable, state.error
    (request,) = api.requests
    assert request.path == PATH
    assert request.headers["authorization"] == "Bearer recorded-token"


def test_observe_without_a_readable_kubeconfig_is_unreachable(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-kubeconfig"
    state = GatewayRouter(spec(kubeconfig=str(missing))).observe()
    assert not state.reachable
    assert state.error is not None
    assert f"no Kubernetes API client from {missing}" in state.error


def test_figures_is_none() -> None:
    assert GatewayRouter(spec(), api_client=client_for(refused_url())).figures(["x"]) is None


# -- route -------------------------------------------------------------------------------------


def test_route_puts_the_route_read_with_new_weights_and_mirror_filters(api: ApiServer) -> None:
    route = recorded("grpcroute.json")
    api.script = [(200, route), (200, updated(route, "48214"))]
    router(api).route({"triton-stable": 9950, "triton-canary": 50}, {"triton-canary": 250})
    get, put = api.requests
    assert (get.method, get.path) == ("GET", PATH)
    assert (put.method, put.path, put.query) == ("PUT", PATH, "fieldManager=triton-gitops")
    assert put.headers["content-type"] == "application/json"
    body = put.body
    # The object as read, with only rule 0's weights and pool mirror filters changed.
    assert body["metadata"]["resourceVersion"] == "48213"
    expected = copy.deepcopy(route)
    rule = expected["spec"]["rules"][0]
    rule["backendRefs"][0]["weight"] = 9950
    rule["backendRefs"][1]["weight"] = 50
    rule["filters"] = [
        route["spec"]["rules"][0]["filters"][0],  # RequestHeaderModifier, kept
        route["spec"]["rules"][0]["filters"][1],  # the mirror to request-log, kept
        {
            "type": "RequestMirror",
            "requestMirror": {
                "backendRef": {
                    "group": "",
                    "kind": "Service",
                    "name": "triton-canary",
                    "port": 8001,
                },
                # 250 basis points is no whole percent: a fraction over 10000.
                "fraction": {"numerator": 250, "denominator": 10000},
            },
        },
    ]
    assert body == expected
    assert body["spec"]["rules"][1] == route["spec"]["rules"][1]
    assert (
        body["spec"]["rules"][0]["backendRefs"][1]["filters"][0]["type"] == "RequestHeaderModifier"
    )


def test_route_writes_a_whole_percent_as_percent_and_drops_a_zero_mirror(api: ApiServer) -> None:
    route = recorded("grpcroute.json")
    api.script = [(200, route), (200, updated(route, "48214"))]
    router(api).route({"triton-stable": 0, "triton-canary": 10000}, {"triton-stable": 1000})
    put = api.requests[1]
    rule = put.body["spec"]["rules"][0]
    assert [r["weight"] for r in rule["backendRefs"]] == [0, 10000]
    mirrors = [f["requestMirror"] for f in rule["filters"] if f["type"] == "RequestMirror"]
    # request-log's kept; the canary's (5%) gone, its share now 0; stable's at 10%.
    assert mirrors == [
        route["spec"]["rules"][0]["filters"][1]["requestMirror"],
        {
            "backendRef": {"group": "", "kind": "Service", "name": "triton-stable", "port": 8001},
            "percent": 10,
        },
    ]


def test_route_with_no_mirror_on_a_rule_without_filters_adds_none(api: ApiServer) -> None:
    route = recorded("grpcroute.json")
    del route["spec"]["rules"][0]["filters"]
    api.script = [(200, route), (200, updated(route, "48214"))]
    router(api).route({"triton-stable": 10000, "triton-canary": 0}, {})
    rule = api.requests[1].body["spec"]["rules"][0]
    assert "filters" not in rule
    assert [r["weight"] for r in rule["backendRefs"]] == [10000, 0]


def test_route_on_a_conflict_reads_again_and_retries(api: ApiServer) -> None:
    first = recorded("grpcroute.json")
    # Someone else changed the route between the read and the write.
    second = updated(first, "48220")
    second["spec"]["rules"][0]["matches"][0]["method"]["method"] = "ModelInfer"
    api.script = [
        (200, first),
        (409, recorded("status-409.json")),
        (200, second),
        (200, updated(second, "48221")),
    ]
    router(api).route({"triton-stable": 5000, "triton-canary": 5000}, {})
    assert [r.method for r in api.requests] == ["GET", "PUT", "GET", "PUT"]
    first_put, retry = api.requests[1], api.requests[3]
    assert first_put.body["metadata"]["resourceVersion"] == "48213"
    assert retry.body["metadata"]["resourceVersion"] == "48220"
    # The retry is made from the route read again: the other writer's change is kept.
    assert retry.body["spec"]["rules"][0]["matches"][0]["method"]["method"] == "ModelInfer"
    assert [r["weight"] for r in retry.body["spec"]["rules"][0]["backendRefs"]] == [5000, 5000]


def test_route_gives_up_after_three_conflict_retries(api: ApiServer) -> None:
    route = recorded("grpcroute.json")
    api.script = [(200, route), (409, recorded("status-409.json"))] * 4
    with pytest.raises(RouterUnavailable) as caught:
        router(api).route({"triton-stable": 10000, "triton-canary": 0}, {})
    assert [r.method for r in api.requests] == ["GET", "PUT"] * 4
    assert "(attempt 4): 409 Conflict: Operation cannot be fulfilled" in str(caught.value)


def test_route_refused_by_the_api_server_raises_its_answer(api: ApiServer) -> None:
    route = recorded("grpcroute.json")
    api.script = [(200, route), (403, recorded("status-403.json"))]
    with pytest.raises(RouterUnavailable) as caught:
        router(api).route({"triton-stable": 10000, "triton-canary": 0}, {})
    message = str(caught.value)
    assert message.startswith("router edge: GRPCRoute serving/triton: the Kubernetes API refused")
    assert 'cannot update resource \\"grpcroutes\\"' not in message  # decoded, not raw JSON
    assert 'cannot update resource "grpcroutes"' in message
    assert len(api.requests) == 2  # a refusal is not retried


def test_route_on_an_api_server_that_refuses_connections_raises() -> None:
    gateway = GatewayRouter(spec(), api_client=client_for(refused_url()))
    with pytest.raises(RouterUnavailable, match="router edge: GRPCRoute serving/triton: cannot"):
        gateway.route({"triton-stable": 10000, "triton-canary": 0}, {})


def test_route_to_a_route_missing_a_pool_raises_naming_it_and_writes_nothing(
    api: ApiServer,
) -> None:
    pools = (*POOLS, Pool("triton-green", server_names=("green-0",), port=8001))
    api.script = [(200, recorded("grpcroute.json"))]
    with pytest.raises(RouterUnavailable, match="no backendRef for pool triton-green"):
        router(api, pools=pools).route(
            {"triton-stable": 10000, "triton-canary": 0, "triton-green": 0}, {}
        )
    assert [r.method for r in api.requests] == ["GET"]


def test_route_without_every_pool_is_a_caller_error(api: ApiServer) -> None:
    with pytest.raises(ValueError, match="its pools are"):
        router(api).route({"triton-stable": 10000}, {})
    assert api.requests == []


# -- the deployment example --------------------------------------------------------------------


def example_documents() -> list[dict[str, Any]]:
    paths = sorted(EXAMPLES.glob("*.yaml"))
    assert paths, EXAMPLES
    documents = [
        doc for path in paths for doc in YAML(typ="safe").load_all(path.read_text()) if doc
    ]
    assert all(isinstance(d, dict) and d.get("kind") for d in documents)
    return documents


def only(documents: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [d for d in documents if d["kind"] == kind]
    return found


def test_the_example_route_s_backendrefs_are_the_router_s_pools(api: ApiServer) -> None:
    documents = example_documents()
    manifest = only(documents, "Router")
    grpcroute = only(documents, "GRPCRoute")
    gateway_api = manifest["spec"]["gatewayAPI"]
    assert manifest["apiVersion"] == "triton-gitops.dev/v1alpha1"
    assert (gateway_api["namespace"], gateway_api["grpcRoute"]) == (
        grpcroute["metadata"]["namespace"],
        grpcroute["metadata"]["name"],
    )
    rule = grpcroute["spec"]["rules"][gateway_api["rule"]]
    assert rule["matches"][0]["method"]["service"] == "inference.GRPCInferenceService"
    refs = [(r["name"], r["port"]) for r in rule["backendRefs"]]
    pools = [(p["name"], p["port"]) for p in manifest["spec"]["pools"]]
    assert refs == pools == [("triton-stable", 8001), ("triton-canary", 8001)]
    services = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Service"}
    for name, port in refs:
        assert services[name]["metadata"]["namespace"] == gateway_api["namespace"]
        assert port in [p["port"] for p in services[name]["spec"]["ports"]]
    gateway = only(documents, "Gateway")
    assert grpcroute["spec"]["parentRefs"][0]["name"] == gateway["metadata"]["name"]
    # The RBAC example grants what the adapter does: get and update on this route.
    role = only(documents, "Role")
    assert role["metadata"]["namespace"] == gateway_api["namespace"]
    (grant,) = role["rules"]
    assert grant["apiGroups"] == ["gateway.networking.k8s.io"]
    assert grant["resources"] == ["grpcroutes"]
    assert grant["resourceNames"] == [gateway_api["grpcRoute"]]
    assert sorted(grant["verbs"]) == ["get", "update"]
    binding = only(documents, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]

    # And the adapter reads the example route as the Router says: all traffic to stable.
    router_spec = RouterSpec(
        manifest["metadata"]["name"],
        tuple(
            Pool(p["name"], tuple(p["servers"]), port=p["port"]) for p in manifest["spec"]["pools"]
        ),
        gateway=GatewayRoute(
            gateway_api["namespace"], gateway_api["grpcRoute"], gateway_api["rule"]
        ),
    )
    api.script = [
        (200, {**grpcroute, "metadata": {**grpcroute["metadata"], "resourceVersion": "1"}})
    ]
    state = GatewayRouter(router_spec, api_client=client_for(api.url)).observe()
    assert state.reachable, state.error
    assert dict(state.weights) == {"triton-stable": 10000, "triton-canary": 0}
    assert dict(state.mirror) == {"triton-stable": 0, "triton-canary": 0}


def test_observe_outside_a_cluster_without_a_kubeconfig_is_unreachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    state = GatewayRouter(spec()).observe()
    assert not state.reachable
    assert state.error is not None
    assert "no Kubernetes API client from the in-cluster service account" in state.error


def test_the_comparator_is_mirrored_to_as_its_service_read_back_and_removed(
    api: ApiServer,
) -> None:
    # Live shadow traffic (issue 31): a RequestMirror filter to the comparator's Service,
    # which is no pool and takes no weight.
    with_comparator = RouterSpec(
        "edge",
        POOLS,
        gateway=GatewayRoute("serving", "triton"),
        comparator="triton-gitops-comparator",
        comparator_port=8011,
        comparator_namespace="triton",  # the reconciler's, beside a ReferenceGrant
    )
    route = recorded("grpcroute.json")
    api.script = [(200, route), (200, updated(route, "48214"))]
    shadowing = GatewayRouter(with_comparator, api_client=client_for(api.url))
    shadowing.route(
        {"triton-stable": 10000, "triton-canary": 0}, {"triton-gitops-comparator": 1000}
    )
    written = api.requests[1].body
    mirrors = [
        f["requestMirror"]
        for f in written["spec"]["rules"][0]["filters"]
        if f["type"] == "RequestMirror"
    ]
    assert mirrors[-1] == {
        "backendRef": {"name": "triton-gitops-comparator", "port": 8011, "namespace": "triton"},
        "percent": 10,
    }
    # Read back: the comparator's share is reported beside the pools'.
    api.script = [(200, written)]
    assert shadowing.observe().mirror == {
        "triton-stable": 0,
        "triton-canary": 0,  # its 5% filter went: the route mirrors what it was given
        "triton-gitops-comparator": 1000,
    }
    # Set back to nothing mirrored: the comparator's filter goes.
    api.script = [(200, written), (200, updated(written, "48215"))]
    shadowing.route(
        {"triton-stable": 10000, "triton-canary": 0},
        {"triton-stable": 0, "triton-canary": 0, "triton-gitops-comparator": 0},
    )
    rule = api.requests[-1].body["spec"]["rules"][0]
    names = [
        f["requestMirror"]["backendRef"]["name"]
        for f in rule["filters"]
        if f["type"] == "RequestMirror"
    ]
    assert "triton-gitops-comparator" not in names and "triton-canary" not in names


# -- sequence affinity: the rule's sessionPersistence (experimental channel) ------------------

HEADER = "x-sequence-id"


def affine(api: ApiServer) -> GatewayRouter:
    sequenced = replace(spec(), sequence_affinity=SequenceAffinity(HEADER))
    return GatewayRouter(sequenced, api_client=client_for(api.url))


def test_a_rule_without_session_persistence_is_affinity_drift_and_is_written(
    api: ApiServer,
) -> None:
    """Issue 44, point 1 for the Gateway API: a Router with sequenceAffinity reads a rule
    without sessionPersistence as drift, and keep_affinity PUTs the route as read with the
    rule's sessionPersistence (type Header, named by the header), then reads it back."""
    route = recorded("grpcroute.json")
    api.script = [(200, route)]
    state = affine(api).observe()
    assert state.reachable and state.affinity_drift == (
        f"rule 0 has no sessionPersistence (sessionName {HEADER}, type Header)",
    ), state
    kept = updated(route, "48214")
    kept["spec"]["rules"][0]["sessionPersistence"] = {"type": "Header", "sessionName": HEADER}
    api.script = [(200, route), (200, kept), (200, kept)]
    affine(api).keep_affinity()
    _, get, put, back = api.requests
    assert [get.method, put.method, back.method] == ["GET", "PUT", "GET"], api.requests
    expected = copy.deepcopy(route)
    expected["spec"]["rules"][0]["sessionPersistence"] = {"type": "Header", "sessionName": HEADER}
    assert put.body == expected  # nothing else of the route changed
    api.script = [(200, kept)]
    assert affine(api).observe().affinity_drift == ()
    # Without sequenceAffinity the rule's session persistence is nobody's business here.
    api.script = [(200, route)]
    assert router(api).observe().affinity_drift == ()


def test_keep_affinity_keeps_the_rules_timeouts_and_mends_its_type(api: ApiServer) -> None:
    route = recorded("grpcroute.json")
    route["spec"]["rules"][0]["sessionPersistence"] = {"type": "Cookie", "idleTimeout": "30s"}
    api.script = [(200, route)]
    (drift,) = affine(api).observe().affinity_drift
    assert "sessionPersistence is idleTimeout 30s, type Cookie, not" in drift, drift
    wanted = {"type": "Header", "sessionName": HEADER, "idleTimeout": "30s"}
    kept = updated(route, "48214")
    kept["spec"]["rules"][0]["sessionPersistence"] = wanted
    api.script = [(200, route), (200, kept), (200, kept)]
    affine(api).keep_affinity()
    assert api.requests[2].body["spec"]["rules"][0]["sessionPersistence"] == wanted


def test_a_standard_channel_crd_that_drops_session_persistence_is_said_not_written_again(
    api: ApiServer,
) -> None:
    """The API server of a cluster with the standard channel's GRPCRoute CRD prunes the
    field it does not know: the PUT succeeds, the read-back lacks it. That is an error
    naming the cause, not a drift the next pass writes again."""
    route = recorded("grpcroute.json")
    api.script = [(200, route), (200, updated(route, "48214")), (200, updated(route, "48214"))]
    with pytest.raises(RouterUnavailable, match="standard channel") as caught:
        affine(api).keep_affinity()
    assert "dropped the rule's sessionPersistence" in str(caught.value)
