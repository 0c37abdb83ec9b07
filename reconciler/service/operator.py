"""The on-call verbs through the running service's HTTP API (issue 15): which requests are
verbs, who sends them (a named bearer token from ``--operator-tokens-file``), and what each
does to the state store the passes read.

Routes, matched exactly (a path is the client's to choose):
    POST /v1/suspend                              every ModelDeployment
    POST /v1/resume
    POST /v1/deployments/<name>/suspend|resume|retry|undo
    POST /v1/deployments/<name>/abort|promote|promote-full    a rollout in progress
    POST /v1/reconcile                            a pass now; answers the pass to wait for
    GET  /v1/passes/last                          the last pass's outcome, numbered
    GET  /status                                  the rollouts in progress, live (JSON)
with an optional JSON body ``{"reason": "..."}`` (undo's also ``"toRevision": "<sha>"`` and
``"dryRun": true``). Without a configured token file, or with a token not in it, every verb
is refused (401): there is no anonymous verb. The verb is recorded in the state store's
history under the token's name; resume, retry and undo ask for a pass at once, so they take
effect without waiting for the schedule.
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Mapping
from typing import Any

from reconciler.engine.orders import ORDERS_EVERY
from reconciler.loop.on_call import VerbDone
from reconciler.model.history import Hold, OrderKind

_DEPLOYMENT = r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?"  # a Kubernetes object name (DNS-1123)
_ROUTE = re.compile(
    rf"/v1/(?:deployments/(?P<name>{_DEPLOYMENT})/)?"
    r"(?P<verb>suspend|resume|retry|undo|reconcile|abort|promote-full|promote)"
)
# The verbs that only make sense for one ModelDeployment.
_NAMED = frozenset({"retry", "undo", "abort", "promote", "promote-full"})
LAST_PASS = "/v1/passes/last"  # GET: the outcome of the last pass, numbered
LIVE_STATUS = "/status"  # GET: the rollouts of the pass in progress (status --watch)
TOKENS_LINE = re.compile(r"(?P<name>[A-Za-z0-9_.@-]{1,64})\s*:\s*(?P<token>\S{16,})")


class OperatorTokensError(ValueError):
    """A token file that cannot be read as ``name: token`` lines."""


def parse_tokens(text: str, source: str) -> dict[str, str]:
    """``name: token`` per line (``#`` comments and blank lines skipped), each token at least
    16 characters and used once; the error names the file and the line."""
    tokens: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        found = TOKENS_LINE.fullmatch(stripped)
        if found is None:
            raise OperatorTokensError(
                f"{source}:{number}: expected 'name: token' (a name of letters, digits and "
                "._@-, a token of 16 or more characters with no space)"
            )
        name, token = found["name"], found["token"]
        if name in tokens or token in tokens.values():
            raise OperatorTokensError(f"{source}:{number}: name or token {name!r} given twice")
        tokens[name] = token
    return tokens


def route(path: str) -> tuple[str, str | None] | None:
    """(verb, deployment or None for every one) of an operator path; None if it is not one.
    ``retry``, ``undo``, ``abort`` and ``promote`` need a deployment; ``reconcile`` (a pass now, for
    everything) takes none."""
    found = _ROUTE.fullmatch(path)
    if found is None or (found["verb"] in _NAMED and found["name"] is None):
        return None
    if found["verb"] == "reconcile" and found["name"] is not None:
        return None
    return found["verb"], found["name"]


def caller(tokens: Mapping[str, str], headers: Mapping[str, str]) -> str | None:
    """The name of the token the request carries (``Authorization: Bearer``), else None.
    Every configured token is compared, in constant time, whichever matches."""
    given = headers.get("authorization", "")
    matched = None
    for name, token in tokens.items():
        if hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            matched = name
    return matched


def reason_of(body: bytes) -> str:
    """The ``reason`` of a JSON body (empty, or a JSON object); ValueError otherwise."""
    if not body.strip():
        return ""
    data: Any = json.loads(body)
    if not isinstance(data, dict) or not isinstance(data.get("reason", ""), str):
        raise ValueError('the body must be a JSON object, e.g. {"reason": "incident 42"}')
    return str(data.get("reason", ""))[:500]


_REVISION = re.compile(r"[0-9a-f]{4,40}")


def undo_of(body: bytes) -> tuple[str | None, bool]:
    """(``toRevision``, ``dryRun``) of an undo's JSON body (already read by ``reason_of``):
    a revision is a commit's SHA or a prefix of it, 4 to 40 hex digits; ValueError otherwise."""
    data: Any = json.loads(body) if body.strip() else {}
    revision, dry_run = data.get("toRevision"), data.get("dryRun", False)
    if revision is not None and not (isinstance(revision, str) and _REVISION.fullmatch(revision)):
        raise ValueError("toRevision must be a commit SHA (4 to 40 lowercase hex digits)")
    if not isinstance(dry_run, bool):
        raise ValueError("dryRun must be true or false")
    return revision, dry_run


def verb_detail(done: VerbDone) -> str:
    """What a verb did, as its reply's ``detail`` says it."""
    if isinstance(done.record, Hold):
        return done.record.reason
    return str(done.record)


def verb_takes_effect(verb: str) -> str:
    """When what a verb did takes effect, as its reply's ``pass`` says it."""
    if verb in set(OrderKind):
        return f"the rollout in progress obeys within {ORDERS_EVERY:g} s"
    return "the next pass honours it" if verb == "suspend" else "requested"
