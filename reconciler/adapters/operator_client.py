"""The on-call verbs' client: one POST to a running service's operator API
(``service/operator.py``), authenticated with a bearer token."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from reconciler.model.errors import ReconcileError

TIMEOUT = 30.0  # the verbs only write a row and ask for a pass


def ask_service(
    url: str, token: str, verb: str, deployment: str | None, reason: str = ""
) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON reply) of one verb; ReconcileError when the service cannot be
    reached or does not answer JSON."""
    path = f"/v1/deployments/{deployment}/{verb}" if deployment else f"/v1/{verb}"
    body = json.dumps({"reason": reason} if reason else {}).encode()
    request = urllib.request.Request(
        url.rstrip("/") + path,
        data=body,
        method="POST",
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
