"""What failed in a pass that did not fully succeed: one ``PassFailure`` per server, model or
router the pass did not bring where the manifests ask, with the step, the failure kind and
the reason. Pure, from the PassReport alone; ``pass_failures(report)`` is empty exactly when
``report.ok``.

Called by ``loop/pass_log.py`` (which logs one event each, for the service and the one-shot
``plan`` and ``apply`` alike) and by the service's answer to ``GET /v1/passes/last``.
"""

from __future__ import annotations

from reconciler.core.records import checks_json
from reconciler.model.plan import Action, PlanProblem
from reconciler.model.reports import PassFailure, PassReport
from reconciler.model.results import ApplyResult, ChangeResult, FailureKind, Outcome, StepResult
from reconciler.model.traffic import RouteUpdate

# Plan problems a person must see to at once: the model repository does not hold what the
# manifests pin (alerted as critical, like a failed rollout).
_SEVERE_PROBLEMS = frozenset({"artifact-mismatch"})


def pass_failures(report: PassReport) -> tuple[PassFailure, ...]:
    """The plan's problems first, in the plan's order, then each change that did not
    converge, then each router not set back."""
    failures = [_problem(p, report.revision) for p in report.plan.problems]
    result = report.result
    if result is not None:
        failures += [
            _change(c, result) for c in result.changes if c.outcome is not Outcome.CONVERGED
        ]
        # apply makes one route result per planned route, in the plan's order (not strict:
        # were they ever out of step, the rest of the failures must still be reported)
        routes = zip(report.plan.routes, result.routes, strict=False)
        failures += [_route(u, r, result.revision) for u, r in routes if not r.ok]
    return tuple(failures)


def _problem(problem: PlanProblem, revision: str) -> PassFailure:
    # A problem without a model is a server the pass could not observe (or was told to
    # leave alone while it backs off): nothing on it was planned.
    kind = "unreachable" if problem.model is None else problem.kind
    return PassFailure(
        revision,
        kind,
        problem.message,
        server=problem.server,
        model=problem.model,
        severe=kind in _SEVERE_PROBLEMS,
    )


def _change(change: ChangeResult, result: ApplyResult) -> PassFailure:
    planned = change.change
    failed = next((r for r in change.steps if not r.ok), None)
    revert_failed = next((r for r in change.revert if not r.ok), None)
    if change.outcome is Outcome.SKIPPED:
        kind = "skipped"
        reason = "not attempted: " + (
            failed.error
            if failed is not None and failed.error
            else _why_skipped(planned.server, result)
        )
    else:
        kind = str(failed.failure) if failed is not None and failed.failure else str(change.outcome)
        reason = (failed.error if failed is not None else None) or change.error or kind
    analysis = failed if failed is not None and failed.step.action is Action.ANALYZE else None
    last = analysis.evaluations[-1] if analysis is not None and analysis.evaluations else None
    return PassFailure(
        result.revision,
        kind,
        reason,
        server=planned.server,
        model=planned.model,
        deployment=planned.deployment,
        step=str(failed.step.action) if failed is not None else None,
        outcome=str(change.outcome),
        versions=planned.desired,
        revert_error=(revert_failed.error or "failed") if revert_failed is not None else None,
        checks=checks_json(last),
        # Held (only a commit or ``retry`` releases it), or the old versions could not be
        # put back: what serves is not what anyone planned. Every other kind is retried by
        # the next pass, or left the old versions serving as before.
        severe=kind == FailureKind.AGAINST_VERSIONS.value or revert_failed is not None,
    )


def _why_skipped(server: str, result: ApplyResult) -> str:
    lost = any(
        c.change.server == server and c.failure is FailureKind.SERVER_LOST for c in result.changes
    )
    return "the server was lost earlier in this pass" if lost else "shutdown began"


def _route(update: RouteUpdate, step: StepResult, revision: str) -> PassFailure:
    return PassFailure(
        revision,
        str(step.failure) if step.failure else "failed",
        step.error or "failed",
        router=update.router,
        step=str(step.step.action),
    )
