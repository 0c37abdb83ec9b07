"""Which state one placement (a model a ModelDeployment puts on one server) is in: decided
once, by ``placement_state``, for ``status`` (``loop/status.py``), for the conditions a pass
records (``core/conditions.py``) and for the service's ``triton_gitops_model_state`` metric
(``model_states``), so that all three say the same after the same pass: a rollout this pass
held reads ``held`` in each, not ``failed`` in the metric until the next pass.

Pure, from what the plan found and what the pass did (``PassReport``).
"""

from __future__ import annotations

from collections.abc import Mapping

from reconciler.model.history import Held
from reconciler.model.reports import PassReport
from reconciler.model.results import Outcome

# What an applied change left its placement in; any other outcome failed (reverted, held
# or not, or not put back).
_AFTER = {
    Outcome.CONVERGED: "in-sync",
    Outcome.SKIPPED: "pending",  # not attempted: a later pass does it
    Outcome.INTERRUPTED: "pending",  # put back at shutdown: the next pass does it
}

# The metric's words for ``placement_state``'s (its label values are part of the shipped
# alert rules): a problem fails the model there too; an unreachable server's models leave
# the metric (``triton_gitops_server_reachable`` says it).
_METRIC: Mapping[str, str | None] = {
    "in-sync": "in-sync",
    "pending": "progressing",
    "failed": "failed",
    "held": "held",
    "problem": "failed",
    "suspended": "suspended",
    "unreachable": None,
}


def placement_state(
    *,
    unreachable: bool = False,
    problem: bool = False,
    suspended: bool = False,
    held: bool = False,
    outcome: Outcome | None = None,
    planned: bool = False,
) -> str:
    """One placement's state, in ``status``'s words: ``unreachable`` (its server did not
    answer), ``problem`` (the plan cannot carry out its spec), ``suspended``, ``held`` (a
    hold keeps it at its old versions), ``failed`` (its change failed this pass; the next
    tries again), ``pending`` (a change planned and not done) or ``in-sync``. The first that
    applies, in that order; ``outcome``: what this pass's change did there, if it ran one."""
    if unreachable:
        return "unreachable"
    if problem:
        return "problem"
    if suspended:
        return "suspended"
    if held:
        return "held"
    if outcome is not None:
        return _AFTER.get(outcome, "failed")
    return "pending" if planned else "in-sync"


def held_after(report: PassReport) -> tuple[Held, ...]:
    """Every placement a hold keeps after the pass (the plan's, of earlier passes, and
    those the pass wrote), where ``placement_state`` says held: a person must act (a commit,
    ``retry`` or ``undo``)."""
    states = pass_states(report)
    found = {(h.server, h.model): h for h in (*report.plan.held, *report.held)}
    return tuple(h for key, h in sorted(found.items()) if states.get(key) == "held")


def pass_states(report: PassReport) -> dict[tuple[str, str], str]:
    """Each (server, model) of a ModelDeployment the pass saw, in ``placement_state``'s
    words. A model being removed is not one: no manifest declares it any more."""
    plan = report.plan
    changes = report.result.changes if report.result else ()
    outcomes = {
        (c.change.server, c.change.model): c.outcome
        for c in changes
        if c.change.deployment is not None
    }
    planned = {(c.server, c.model) for c in plan.changes if c.deployment is not None}
    problems = {(p.server, p.model) for p in plan.problems if p.model is not None}
    held = {(h.server, h.model) for h in (*plan.held, *report.held)}
    suspended = set(plan.suspended)
    down = report.down_when_planned
    seen = set(plan.in_sync) | planned | set(outcomes) | problems | held | suspended
    return {
        key: placement_state(
            unreachable=key[0] in down,
            problem=key in problems,
            suspended=key in suspended,
            held=key in held,
            outcome=outcomes.get(key),
            planned=key in planned,
        )
        for key in seen
    }


def model_states(report: PassReport) -> dict[tuple[str, str], str]:
    """Each (server, model) the pass saw, for the service's metric: ``in-sync``,
    ``progressing``, ``held``, ``suspended`` or ``failed`` (see ``_METRIC``)."""
    return {
        key: word
        for key, state in pass_states(report).items()
        if (word := _METRIC[state]) is not None
    }
