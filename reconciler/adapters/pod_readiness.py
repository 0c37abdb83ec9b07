"""The serving truth (``core/serving_truth.py``) as a Kubernetes readiness gate: each Triton
pod's condition ``triton-gitops.dev/serving``, set through the official client's pod status
patch. A pod that lists the condition in ``spec.readinessGates`` is Ready for its Services
only while the condition is True, so a pod loading a model beside the old one stays in, and
a restarted pod stays out until the reconciler has loaded what it served.

A server is found by its address: a discovered instance's is the pod's IP; a fixed server's
host name is resolved first (a StatefulSet pod's DNS name). The pod is the one in the
namespace with that IP (``status.podIP``). The condition is written only when its status or
message changes; ``lastTransitionTime`` moves only with the status.

What goes wrong is returned as a problem line (the service logs it and alerts), never
raised: a pod without the gate declared, a pod that vanished between discovery and the
patch, a 403 (the role lacks ``patch`` on ``pods/status``). The other pods are unaffected.

No API server runs on the test machines: tests/adapters/test_pod_readiness.py checks the
requests this sends against recorded Pod shapes (docs/guarantees.md says what was not run).
"""

from __future__ import annotations

import datetime
import ipaddress
from typing import Any

from kubernetes import client as kube
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from reconciler.adapters.discovery import Resolver, SystemResolver
from reconciler.core.serving_truth import ServingTruth
from reconciler.model.errors import DiscoveryFailed

CONDITION = "triton-gitops.dev/serving"
# The pod status patch is a strategic merge: the conditions list merges by ``type``, so this
# condition is written without touching the kubelet's own. The client's default for a patch
# would be a JSON patch, which needs the list's index.
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
# Kubernetes caps a condition's message at 32768 bytes; a truth naming every model of a big
# server stays far below, but a message is cut rather than refused.
MESSAGE_LIMIT = 4096


_ENDED = ("Succeeded", "Failed")
_TIME = "%Y-%m-%dT%H:%M:%SZ"  # a condition's time, as the API server writes it (seconds, UTC)


def host_of(address: str) -> str:
    """The host of a gRPC address (``host:port``, ``[v6]:port``)."""
    if address.startswith("["):
        return address[1 : address.index("]")]
    return address.rsplit(":", 1)[0] if address.count(":") == 1 else address


class PodReadinessGate:
    """Sets the serving condition on the pods of one namespace."""

    def __init__(
        self,
        namespace: str,
        api_client: kube.ApiClient,
        resolver: Resolver | None = None,
        clock: Any = None,
        timeout: float = 5.0,
    ) -> None:
        self.namespace = namespace
        # Each API call's own limit: the board publishes from the watch and from apply's
        # worker threads (a drain), which a hung API server must not hold.
        self.timeout = timeout
        self._core = kube.CoreV1Api(api_client)
        self._resolver = resolver or SystemResolver()
        self._clock = clock or (lambda: datetime.datetime.now(datetime.UTC))

    def publish(self, truth: ServingTruth, address: str) -> str | None:
        """Set ``truth`` on the pod of the server at ``address``; a problem line, or None."""
        where = f"server {truth.server}"
        try:
            ip = self._ip(host_of(address))
            pod = self._pod(ip)
            if pod is None:
                return f"{where}: no pod in namespace {self.namespace} has address {ip}"
            name = pod.metadata.name
            gates = [g.condition_type for g in (pod.spec.readiness_gates or [])]
            if CONDITION not in gates:
                return (
                    f"{where}: pod {self.namespace}/{name} declares no readiness gate "
                    f"{CONDITION} (spec.readinessGates): its readiness ignores what it serves"
                )
            condition = self._condition(pod, truth)
            if condition is None:
                return None  # already says so
            self._core.patch_namespaced_pod_status(
                name,
                self.namespace,
                {"status": {"conditions": [condition]}},
                _content_type=STRATEGIC_MERGE,
                _request_timeout=self.timeout,
            )
            return None
        except DiscoveryFailed as exc:
            return f"{where}: {exc}"
        except ApiException as exc:
            return f"{where}: {self._refusal(exc)}"
        except (HTTPError, OSError) as exc:
            return f"{where}: Kubernetes API unreachable: {exc}"

    def _ip(self, host: str) -> str:
        try:
            return str(ipaddress.ip_address(host))
        except ValueError:
            found = self._resolver.resolve(host)
            if not found:
                raise DiscoveryFailed(f"{host} resolves to no address") from None
            return found[0]

    def _pod(self, ip: str) -> Any:
        pods = self._core.list_namespaced_pod(
            self.namespace, field_selector=f"status.podIP={ip}", _request_timeout=self.timeout
        ).items
        # A finished pod may keep its IP on record beside the one now running there.
        live = [p for p in pods if p.status is None or p.status.phase not in _ENDED]
        return live[0] if live else None

    def _condition(self, pod: Any, truth: ServingTruth) -> dict[str, Any] | None:
        status = "True" if truth.serving else "False"
        message = truth.message[:MESSAGE_LIMIT]
        current = next((c for c in (pod.status.conditions or []) if c.type == CONDITION), None)
        if current is not None and current.status == status and current.message == message:
            return None
        if current is None or current.status != status or current.last_transition_time is None:
            since = self._clock().strftime(_TIME)
        else:
            since = _time(current)
        return {
            "type": CONDITION,
            "status": status,
            "reason": "Serving" if truth.serving else "NotServing",
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": since,
        }

    def _refusal(self, exc: ApiException) -> str:
        if exc.status == 403:
            return (
                f"the Kubernetes API refused (403): the reconciler's role needs get, list on "
                f"pods and patch on pods/status in namespace {self.namespace}"
            )
        if exc.status == 404:
            return "the pod vanished before its condition was set (404)"
        return f"the Kubernetes API answered {exc.status} {exc.reason}"


def _time(condition: Any) -> str:
    moment = condition.last_transition_time
    if isinstance(moment, datetime.datetime):
        return moment.strftime(_TIME)
    return str(moment)
