"""The on-call verbs' client: one POST to a running service's operator API
(``service/operator.py``), authenticated with a bearer token."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from reconciler.model.errors import ReconcileError

TIMEOUT = 30.0  # the verbs only write a row and ask for a pass


def ask_service(
    url: str,
    token: str,
    verb: str,
    deployment: str | None,
    reason: str = "",
    extra: Mapping[str, Any] | None = None,
) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON reply) of one verb (``extra``: more fields of its body, e.g.
    undo's ``toRevision``); ReconcileError when the service cannot be reached or does not
    answer JSON."""
    path = f"/v1/deployments/{deployment}/{verb}" if deployment else f"/v1/{verb}"
    body = json.dumps({**({"reason": reason} if reason else {}), **(extra or {})}).encode()
    return _call(url, token, path, body)


def last_pass(url: str, token: str) -> tuple[int, dict[str, Any]]:
    """(HTTP status, the service's last pass outcome)."""
    return _call(url, token, "/v1/passes/last", None)


def live_status(url: str, token: str) -> dict[str, Any]:
    """The service's GET /status: the rollouts in progress and the last pass."""
    status, reply = _call(url, token, "/status", None)
    if status != 200:
        raise ReconcileError(f"service {url} answered {status}: {reply.get('error', reply)}")
    return reply


def wait_for_pass(
    url: str,
    token: str,
    after: int,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """The outcome of the first pass numbered above ``after``; ReconcileError when none has
    finished within ``timeout`` seconds."""
    deadline = clock() + timeout
    while True:
        status, outcome = last_pass(url, token)
        if status != 200:
            raise ReconcileError(f"service {url} answered {status}: {outcome.get('error')}")
        if int(outcome.get("number", 0)) > after:
            return outcome
        if clock() >= deadline:
            raise ReconcileError(
                f"no pass finished within {timeout:g}s (the service may be in a long rollout; "
                "its log says)"
            )
        sleep(0.25)


def _call(url: str, token: str, path: str, body: bytes | None) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url.rstrip("/") + path,
        data=body,
        method="POST" if body is not None else "GET",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            status, text = answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        raise ReconcileError(f"service {url} did not answer: {exc}") from None
    try:
        reply = json.loads(text)
    except ValueError:
        raise ReconcileError(f"service {url} answered {status} with no JSON") from None
    return status, reply if isinstance(reply, dict) else {"reply": reply}
