"""A ModelDeployment's Kubernetes-style conditions: ``Ready``, ``Reconciling``, ``Stalled``.

Pure functions, called by ``loop.status`` (for ``status --output json``) and by the pass's
``record`` phase (which remembers when each condition's status last changed, so that
``lastTransitionTime`` survives from one pass to the next). The clock is passed in.

The three types follow Flux's use of kstatus: ``Ready`` says whether what is served is what
the manifest declares; ``Reconciling`` is True while the reconciler still has work to do on it
(a planned change, a failed step the next pass tries again); ``Stalled`` is True when it has
stopped and will not go on until someone acts (a hold after a failed rollout, a spec the plan
cannot carry out). A ModelDeployment placed on several servers gets one set: each condition
takes the worst of its placements, and says which servers it is about.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from reconciler.core.placement import pass_states, placement_state
from reconciler.model.reports import Condition, PassReport
from reconciler.model.spec import DesiredState

CONDITION_TYPES = ("Ready", "Reconciling", "Stalled")

TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"


@dataclass(frozen=True)
class PlacementState:
    """What one server shows of a ModelDeployment, in ``status``'s words."""

    server: str
    # in-sync | pending | held | suspended | problem | unreachable, or failed: a change that
    # failed in this pass and is tried again by the next (a transient failure)
    state: str
    detail: str = ""
    verdict: str | None = None  # the analysis verdict of its last rollout, where one ran


# state -> (Ready, Reconciling, Stalled) statuses; the reason is chosen by ``_reason``.
_STATUSES: Mapping[str, tuple[str, str, str]] = {
    "in-sync": (TRUE, FALSE, FALSE),
    "pending": (FALSE, TRUE, FALSE),
    "failed": (FALSE, TRUE, FALSE),
    "held": (FALSE, FALSE, TRUE),
    "problem": (FALSE, FALSE, TRUE),
    "suspended": (UNKNOWN, FALSE, FALSE),
    "unreachable": (UNKNOWN, FALSE, FALSE),
}

# Which placement speaks for a condition when several share its status: the worst first.
_SEVERITY = ("held", "problem", "failed", "unreachable", "pending", "suspended", "in-sync")

_MESSAGES = {
    "in-sync": "serving as declared",
    "pending": "a change is planned",
    "failed": "a step failed; the next pass tries again",
}


def _reason(placement: PlacementState, condition: str) -> str:
    state = placement.state
    if state == "held":
        # Ready says what it is (held at the old versions); Stalled says why it stopped.
        if condition != "Stalled":
            return "Held"
        return {"failed": "AnalysisFailed", "aborted": "Aborted"}.get(
            placement.verdict or "", "RolloutFailed"
        )
    return {
        "in-sync": "RolloutSucceeded",
        "pending": "Progressing",
        "failed": "RetryingFailedStep",
        "problem": "PlanFailed",
        "suspended": "Suspended",
        "unreachable": "ServerUnreachable",
    }[state]


def _aggregate(condition: str, statuses: list[str]) -> str:
    if condition == "Ready":
        if all(s == TRUE for s in statuses):
            return TRUE
        return FALSE if FALSE in statuses else UNKNOWN
    if TRUE in statuses:
        return TRUE
    return UNKNOWN if UNKNOWN in statuses else FALSE


def conditions(
    deployment: str,
    placements: Iterable[PlacementState],
    remembered: Mapping[tuple[str, str], tuple[str, str]],
    now: str,
) -> tuple[Condition, ...]:
    """The deployment's three conditions (``placements``: at least one). ``remembered``:
    (deployment, type) -> (status, since) from the last pass; a status that differs from it
    changed ``now``."""
    ordered = sorted(placements, key=lambda p: (_SEVERITY.index(p.state), p.server))
    assert ordered, f"{deployment}: conditions of a ModelDeployment placed nowhere"
    found = []
    for index, condition in enumerate(CONDITION_TYPES):
        status = _aggregate(condition, [_STATUSES[p.state][index] for p in ordered])
        speaking = [p for p in ordered if _STATUSES[p.state][index] == status]
        # A staged rollout held by one server's failure: that server says why (the others'
        # last analyses passed before they were put back).
        first = next((p for p in speaking if p.verdict in ("failed", "aborted")), speaking[0])
        message = "; ".join(
            f"{p.server}: {p.detail or _MESSAGES.get(p.state, p.state)}" for p in speaking[:3]
        )
        if len(speaking) > 3:
            message += f"; and {len(speaking) - 3} more server(s)"
        was, since = remembered.get((deployment, condition), (None, now))
        found.append(
            Condition(
                condition,
                status,
                _reason(first, condition),
                message,
                since if was == status else now,
            )
        )
    return tuple(found)


def transitions_of(
    found: Mapping[str, tuple[Condition, ...]],
) -> dict[tuple[str, str], tuple[str, str]]:
    """What the state store remembers of these conditions: each one's status and since when."""
    return {
        (deployment, c.type): (c.status, c.last_transition_time)
        for deployment, listed in found.items()
        for c in listed
    }


def pass_placements(report: PassReport, desired: DesiredState) -> dict[str, list[PlacementState]]:
    """Each declared ModelDeployment's placements in ``PlacementState.state``'s words after the
    pass (the holds it wrote among them: ``PassReport.held``): what ``status`` run right after
    it would say, as both decide by ``placement_state``, so that the two agree on each
    condition's status (and ``lastTransitionTime`` moves only when the status does)."""
    states = pass_states(report)
    down = report.down_when_planned
    found: dict[str, list[PlacementState]] = {}
    for server, placements in sorted(desired.placements.items()):
        for model, placement in sorted(placements.items()):
            # One the pass did not see: its server did not answer, or nothing was planned
            # for it yet.
            state = states.get((server, model)) or placement_state(
                unreachable=server in down, planned=True
            )
            found.setdefault(placement.deployment.name, []).append(PlacementState(server, state))
    return found


def pass_transitions(
    report: PassReport,
    desired: DesiredState,
    remembered: Mapping[tuple[str, str], tuple[str, str]],
    now: str,
) -> dict[tuple[str, str], tuple[str, str]]:
    """What the pass leaves in the state store: every declared ModelDeployment's condition
    statuses after it, each with the time it took that status (kept from ``remembered``
    while unchanged)."""
    return transitions_of(
        {
            name: conditions(name, placements, remembered, now)
            for name, placements in pass_placements(report, desired).items()
        }
    )
