"""What a pass writes to the log: each step as it ends (``log_step``: the service's progress,
and one-shot ``apply --log-format json``'s), and one "failure" event per server, model or
router a pass that did not fully succeed left where the manifests do not ask
(``log_failures``, from ``core/failures.py``).

``reconcile`` logs the failures itself, so the service, ``plan`` and ``apply`` report them
alike. Events are a message naming them and structured fields (``extra={"fields": ...}``),
written as text or JSON by ``adapters/logs.py``.
"""

from __future__ import annotations

import logging
from typing import Any

from reconciler.core.failures import pass_failures
from reconciler.model.problems import Problem
from reconciler.model.reports import PassFailure, PassReport
from reconciler.model.results import StepResult

log = logging.getLogger("triton_gitops.pass")


def step_fields(result: StepResult) -> dict[str, Any]:
    step = result.step
    return {
        "server": step.server,
        "model": step.model,
        "step": str(step.action),
        "versions": list(step.versions),
        "outcome": "ok" if result.ok else "failed",
        "revert": result.reverting,
        "seconds": round(result.seconds, 4),
        "error": result.error,
        "kind": str(result.failure) if result.failure else None,
    }


def log_step(result: StepResult) -> None:
    level = logging.INFO if result.ok else logging.WARNING
    log.log(level, "step", extra={"fields": step_fields(result)})


def failure_fields(failure: PassFailure) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "revision": failure.revision,
        "server": failure.server,
        "model": failure.model,
        "deployment": failure.deployment,
        "router": failure.router,
        "step": failure.step,
        "kind": failure.kind,
        "outcome": failure.outcome,
        "versions": list(failure.versions),
        "reason": failure.reason,
        "revert_error": failure.revert_error,
        "checks": [dict(c) for c in failure.checks],
    }
    # Only what applies: a plan problem has no step, outcome or versions, a model no router.
    return {k: v for k, v in fields.items() if v is not None and v != []}


def log_failures(report: PassReport) -> None:
    """One event per failure, ERROR when a person must act (the spec is held, or the old
    versions could not be put back, or the artifacts are not what the manifests pin),
    WARNING when the next pass retries it or the old versions serve on unharmed."""
    for failure in pass_failures(report):
        level = logging.ERROR if failure.severe else logging.WARNING
        log.log(level, "failure", extra={"fields": failure_fields(failure)})


def log_manifest_warnings(revision: str, warnings: tuple[Problem, ...]) -> None:
    """One event per warning about the manifests at ``revision`` (a deprecated apiVersion),
    when the pass reads them: the service reads a revision once, so it says so once."""
    for warning in warnings:
        log.warning(
            "manifest warning",
            extra={
                "fields": {
                    "revision": revision,
                    "file": warning.file,
                    "line": warning.line,
                    "reason": warning.message,
                }
            },
        )
