"""What the service's ``GET /v1/passes/last`` answers about a pass: its result, what it could
not bring where the manifests ask, and what a hold keeps at its old versions after it.
"""

from __future__ import annotations

from typing import Any

from reconciler.core.failures import pass_failures
from reconciler.core.placement import held_after
from reconciler.core.records import rfc3339
from reconciler.model.reports import PassReport


def pass_outcome(
    number: int,
    trigger: str,
    result: str,
    seconds: float,
    report: PassReport | None,
    finished: float,
) -> dict[str, Any]:
    """What ``GET /v1/passes/last`` answers about one pass: whether it fully succeeded,
    each server or model it could not bring where the manifests ask (with the reason), and
    each model a hold keeps at its old versions after it (written by this pass or an earlier
    one: Stalled until a person acts, which ``reconcile --service`` fails on). ``finished``:
    when the pass ended (wall clock)."""
    failed = [
        {
            "server": f.server if f.server is not None else f"router {f.router}",
            "model": f.model,
            "deployment": f.deployment,
            "kind": f.kind,
            "reason": f.reason,
        }
        for f in (pass_failures(report) if report is not None else ())
    ]
    return {
        "number": number,
        "trigger": trigger,
        "result": result,
        "ok": result == "ok",
        "revision": report.revision if report else None,
        "seconds": round(seconds, 3),
        "finished_at": rfc3339(finished),
        "failed": failed,
        "held": [
            {
                "deployment": h.deployment,
                "server": h.server,
                "model": h.model,
                "revision": h.revision,
                "reason": h.reason,
            }
            for h in (held_after(report) if report is not None else ())
        ],
    }
