"""The reconciler lock as a Kubernetes Lease (the official client's leader election) against
recorded API shapes, served from a loopback HTTP server.

No Kubernetes API server runs here. ``recorded/lease/`` holds a ``coordination.k8s.io/v1``
Lease as an API server returns it (metadata with a resourceVersion, MicroTime times) and the
``Status`` objects of a 404 and a 409, written after the API's schema, not captured from a
live server. The tests assert what the adapter sends (method, path, body) and what it makes
of the answers: a free Lease created, a held one refused naming its holder, an unrenewed one
taken over after its duration, a lost one reported, a released one cleared.
"""

from __future__ import annotations

import copy
import datetime
import json
import time
from pathlib import Path
from typing import Any

from reconciler.adapters.leader_lease import LeaderLease
from reconciler.ports import LockHolder
from tests.adapters.test_gateway import ApiServer, Request, api, client_for

__all__ = ["api"]  # the fixture, used by name

RECORDED = Path(__file__).parent / "recorded" / "lease"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/triton/leases"
LEASE = f"{LEASES}/triton-gitops"
ME = LockHolder(31, "run", "2026-12-01T22:00:00Z", "triton-gitops-7c9f8d-b8m2z")
IDENTITY = "triton-gitops-7c9f8d-b8m2z pid 31 (run) since 2026-12-01T22:00:00Z"
# Short periods where a test waits on them (the election wants lease > renew > 1.2 retry).
SHORT = {"lease_duration": 2, "renew_deadline": 1.5, "retry_period": 1}


def recorded(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((RECORDED / name).read_text())
    return loaded


def lease(
    holder: str, renewed: datetime.datetime | None = None, duration: int = 15
) -> dict[str, Any]:
    """The recorded Lease, held by ``holder`` and renewed at ``renewed`` (default now)."""
    answer = copy.deepcopy(recorded("lease.json"))
    when = (renewed or datetime.datetime.now(datetime.UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    answer["spec"].update(holderIdentity=holder, renewTime=when, leaseDurationSeconds=duration)
    return answer


def election(api: ApiServer, **periods: Any) -> LeaderLease:
    return LeaderLease("triton", "triton-gitops", ME, client_for(api.url), **periods)


def sent(api: ApiServer) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in api.requests]


def near_now(text: str) -> bool:
    moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return abs((moment - datetime.datetime.now(datetime.UTC)).total_seconds()) < 30


def test_a_missing_lease_is_created_held_by_this_reconciler_and_cleared_on_release(
    api: ApiServer,
) -> None:
    created: list[dict[str, Any]] = []

    def answer(request: Request) -> tuple[int, dict[str, Any]]:
        if request.method == "GET":
            return (200, lease(IDENTITY)) if created else (404, recorded("status-404.json"))
        created.append(request.body)
        return (201 if request.method == "POST" else 200), lease(IDENTITY)

    api.answer = answer
    lock = election(api)
    assert lock.where == "Lease triton/triton-gitops"
    assert lock.acquire(0) and lock.held()
    assert sent(api) == [("GET", LEASE), ("POST", LEASES)]
    body = api.requests[1].body
    assert body["metadata"] == {"name": "triton-gitops"}
    spec = body["spec"]
    assert spec["holderIdentity"] == IDENTITY
    assert spec["leaseDurationSeconds"] == 15  # client-go's default
    assert near_now(spec["acquireTime"]) and near_now(spec["renewTime"])

    lock.release()
    assert not lock.held()
    # (renewals may come between, on a slow machine): the release reads, then writes
    assert sent(api)[-2:] == [("GET", LEASE), ("PUT", LEASE)]
    cleared = api.requests[-1].body
    # Written back with the resourceVersion just read, and no holder: a waiting replica
    # takes it at its next try instead of after the lease duration.
    assert cleared["metadata"]["resourceVersion"] == "918273"
    assert cleared["spec"]["holderIdentity"] == ""
    assert cleared["spec"]["leaseDurationSeconds"] == 1


def test_a_lease_another_replica_renews_is_refused_and_names_its_holder(api: ApiServer) -> None:
    other = "triton-gitops-7c9f8d-x2k4q pid 1 (run) since 2026-12-01T21:00:00Z"
    api.answer = lambda request: (200, lease(other))
    lock = election(api)
    assert not lock.acquire(0) and not lock.held()
    assert {method for method, _ in sent(api)} == {"GET"}  # nothing written
    assert lock.holder() == LockHolder(
        1, "run", "2026-12-01T21:00:00Z", "triton-gitops-7c9f8d-x2k4q"
    )
    lock.release()  # not held: nothing sent
    assert {method for method, _ in sent(api)} == {"GET"}


def test_a_lease_left_unrenewed_is_taken_over_after_its_duration(api: ApiServer) -> None:
    stale = lease("crashed-pod pid 9 (run) since 2026-12-01T20:00:00Z", duration=2)
    puts: list[Request] = []

    def answer(request: Request) -> tuple[int, dict[str, Any]]:
        if request.method == "PUT":
            puts.append(request)
            return 200, request.body
        return 200, stale  # the same record every time: nobody renews it

    api.answer = answer
    lock = election(api, **SHORT)
    began = time.monotonic()
    assert lock.acquire(10)
    # The election counts the duration from when it first saw the record unchanged (its
    # own clock, not the Lease's renewTime: clocks of pods differ).
    assert time.monotonic() - began >= 2
    spec = puts[0].body["spec"]
    assert puts[0].path == LEASE and puts[0].body["metadata"]["resourceVersion"] == "918273"
    assert spec["holderIdentity"] == IDENTITY and spec["leaseDurationSeconds"] == 2
    lock.release()  # the Lease read back names another holder: left as it is
    assert len(puts) == 1


def test_a_lease_that_cannot_be_renewed_is_lost_and_not_cleared(api: ApiServer) -> None:
    api.script = [(404, recorded("status-404.json")), (201, lease(IDENTITY))]
    lock = election(api, **SHORT)
    assert lock.acquire(0)
    # Another replica took it meanwhile (it says so with a 409 to every write).
    api.answer = lambda request: (
        (409, recorded("status-409.json")) if request.method == "PUT" else (200, lease(IDENTITY))
    )
    deadline = time.monotonic() + 10
    while lock.held():
        assert time.monotonic() < deadline, "the lost Lease is still reported held"
        time.sleep(0.05)
    puts_before = sum(method == "PUT" for method, _ in sent(api))
    assert puts_before >= 1
    lock.release()
    assert sum(method == "PUT" for method, _ in sent(api)) == puts_before  # not ours to clear
