"""The serving truth as a Kubernetes readiness gate (adapters/pod_readiness.py) against
recorded Pod shapes, served from a loopback HTTP server (``ApiServer`` of test_gateway.py).

No Kubernetes API server runs here. ``recorded/pod/`` holds a Pod as an API server returns
it (a Deployment's pod with the readiness gate declared, its condition False, the kubelet's
own conditions beside it) and the ``Status`` objects of a 403 and a 404, written after the
API's schema, not captured from a live server. The tests assert what the adapter sends
(method, path, query, content type, body) and the problem line it returns for each failure.
"""

from __future__ import annotations

import copy
import datetime
import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from reconciler.adapters.pod_readiness import CONDITION, PodReadinessGate, host_of
from reconciler.core.serving_truth import ServingTruth
from tests.adapters.test_gateway import ApiServer, Request, api, client_for, refused_url

__all__ = ["api"]  # the fixture, used by name

RECORDED = Path(__file__).parent / "recorded" / "pod"
PODS = "/api/v1/namespaces/triton/pods"
STATUS = f"{PODS}/triton-7d9c6b5f4-x2kqp/status"
NOW = datetime.datetime(2026, 12, 5, 21, 0, 0, tzinfo=datetime.UTC)
SERVING = ServingTruth("fleet/10.244.1.23", True)
RESTARTED = ServingTruth("fleet/10.244.1.23", False, ("model echo: version(s) 2 not READY",))


def recorded(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((RECORDED / name).read_text())
    return loaded


def pod_list(*pods: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "184470"},
            "items": list(pods)}  # fmt: skip


class Names:
    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers

    def resolve(self, name: str) -> list[str]:
        return self.answers[name]


def gate(api: ApiServer, **names: list[str]) -> PodReadinessGate:
    return PodReadinessGate("triton", client_for(api.url), Names(names), clock=lambda: NOW)


def answering(pod: dict[str, Any], patch: tuple[int, dict[str, Any]] | None = None) -> Any:
    def answer(request: Request) -> tuple[int, dict[str, Any]]:
        if request.method == "GET":
            return 200, pod_list(pod)
        return patch or (200, pod)

    return answer


def test_a_pod_that_serves_now_gets_its_condition_true_by_a_strategic_merge_patch(
    api: ApiServer,
) -> None:
    api.answer = answering(recorded("pod.json"))
    assert gate(api).publish(SERVING, "10.244.1.23:8001") is None
    listed, patched = api.requests
    assert (listed.method, listed.path) == ("GET", PODS)
    assert parse_qs(listed.query)["fieldSelector"] == ["status.podIP=10.244.1.23"]
    assert (patched.method, patched.path) == ("PATCH", STATUS)
    assert patched.headers["content-type"] == "application/strategic-merge-patch+json"
    # Only this condition: the kubelet's own are left to the merge (keyed by type).
    assert patched.body == {"status": {"conditions": [{
        "type": CONDITION, "status": "True", "reason": "Serving",
        "message": "serves every version declared", "lastProbeTime": None,
        "lastTransitionTime": "2026-12-05T21:00:00Z",
    }]}}  # fmt: skip


def test_a_condition_that_already_says_so_is_not_written_again(api: ApiServer) -> None:
    api.answer = answering(recorded("pod.json"))  # False, with RESTARTED's message
    assert gate(api).publish(RESTARTED, "10.244.1.23:8001") is None
    assert [r.method for r in api.requests] == ["GET"]


def test_a_new_reason_keeps_the_time_the_status_began(api: ApiServer) -> None:
    api.answer = answering(recorded("pod.json"))
    other = ServingTruth(RESTARTED.server, False, ("model echo: drained for its swap",))
    assert gate(api).publish(other, "10.244.1.23:8001") is None
    (condition,) = api.requests[1].body["status"]["conditions"]
    assert condition["status"] == "False" and condition["reason"] == "NotServing"
    assert condition["message"] == "model echo: drained for its swap"
    assert condition["lastTransitionTime"] == "2026-12-05T20:01:20Z"


def test_a_fixed_server_is_found_by_the_address_its_name_resolves_to(api: ApiServer) -> None:
    api.answer = answering(recorded("pod.json"))
    named = gate(api, **{"triton-0.triton.triton.svc": ["10.244.1.23"]})
    assert named.publish(SERVING, "triton-0.triton.triton.svc:8001") is None
    assert parse_qs(api.requests[0].query)["fieldSelector"] == ["status.podIP=10.244.1.23"]
    assert host_of("[fd00::7]:8001") == "fd00::7" and host_of("10.0.0.1:8001") == "10.0.0.1"


def test_a_pod_without_the_readiness_gate_is_reported_and_left_alone(api: ApiServer) -> None:
    pod = copy.deepcopy(recorded("pod.json"))
    del pod["spec"]["readinessGates"]
    api.answer = answering(pod)
    problem = gate(api).publish(SERVING, "10.244.1.23:8001")
    assert problem == (
        "server fleet/10.244.1.23: pod triton/triton-7d9c6b5f4-x2kqp declares no readiness "
        "gate triton-gitops.dev/serving (spec.readinessGates): its readiness ignores what it "
        "serves"
    )
    assert [r.method for r in api.requests] == ["GET"]


def test_a_pod_gone_before_the_list_or_the_patch_is_reported(api: ApiServer) -> None:
    api.answer = lambda request: (200, pod_list())
    assert gate(api).publish(SERVING, "10.244.1.23:8001") == (
        "server fleet/10.244.1.23: no pod in namespace triton has address 10.244.1.23"
    )
    # A pod that ended keeps its IP on record: not the pod to patch.
    done = copy.deepcopy(recorded("pod.json"))
    done["status"]["phase"] = "Succeeded"
    api.answer = lambda request: (200, pod_list(done))
    assert "no pod in namespace triton" in (gate(api).publish(SERVING, "10.244.1.23") or "")
    api.answer = answering(recorded("pod.json"), (404, recorded("status-404.json")))
    assert gate(api).publish(SERVING, "10.244.1.23:8001") == (
        "server fleet/10.244.1.23: the pod vanished before its condition was set (404)"
    )


def test_a_forbidden_patch_says_which_permission_is_missing(api: ApiServer) -> None:
    api.answer = answering(recorded("pod.json"), (403, recorded("status-403.json")))
    assert gate(api).publish(SERVING, "10.244.1.23:8001") == (
        "server fleet/10.244.1.23: the Kubernetes API refused (403): the reconciler's role "
        "needs get, list on pods and patch on pods/status in namespace triton"
    )


def test_an_unreachable_api_server_is_reported_not_raised() -> None:
    problem = PodReadinessGate("triton", client_for(refused_url())).publish(
        SERVING, "10.244.1.23:8001"
    )
    assert problem is not None and problem.startswith(
        "server fleet/10.244.1.23: Kubernetes API unreachable"
    ), problem


def test_an_api_server_that_hangs_is_given_up_on_within_the_timeout(api: ApiServer) -> None:
    def hang(request: Request) -> tuple[int, dict[str, Any]]:
        time.sleep(1.5)
        return 200, pod_list(recorded("pod.json"))

    api.answer = hang
    slow = PodReadinessGate("triton", client_for(api.url), Names({}), timeout=0.2)
    started = time.monotonic()
    problem = slow.publish(SERVING, "10.244.1.23:8001")
    took = time.monotonic() - started
    assert problem is not None and "Kubernetes API unreachable" in problem, problem
    assert took < 1.4, f"held {took:.1f}s by a hung API server"
