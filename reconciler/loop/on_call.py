"""The on-call verbs on the state store, written once for both ways of giving them: the command
line's local mode (``triton-gitops suspend --state ...``) and the service's HTTP API
(``POST /v1/<verb>``). Each returns what it did, or why it did nothing, as a value; the command
line words it as text, the service as JSON with an HTTP status. ``undo`` (a commit, not a
record) is ``loop.undo``.
"""

from __future__ import annotations

from dataclasses import dataclass

from reconciler.model.history import (
    ALL_DEPLOYMENTS,
    Hold,
    OperatorAction,
    OperatorOrder,
    OrderKind,
    Suspension,
)
from reconciler.ports import OnCallRecord

# Those after which a pass should run at once: what they lift or ask for waits on one.
_ASK_FOR_A_PASS = frozenset({"resume", "retry", "reconcile"})


@dataclass(frozen=True)
class VerbDone:
    """One verb's outcome. ``refused`` says why nothing was done (the target is not suspended,
    not held, has no rollout in progress); the other fields are what a reply names."""

    verb: str
    target: str
    by: str
    record: Suspension | Hold | OperatorOrder | OperatorAction | None
    refused: str = ""
    # resume: the suspensions left; retry refused: the deployments held; an order refused:
    # the rollouts in progress.
    still_suspended: tuple[Suspension, ...] = ()
    held: tuple[str, ...] = ()
    in_progress: tuple[str, ...] = ()

    @property
    def asks_for_a_pass(self) -> bool:
        return not self.refused and self.verb in _ASK_FOR_A_PASS

    @property
    def what(self) -> str:
        """The target in words: "ModelDeployment X" or "every ModelDeployment"."""
        if self.target == ALL_DEPLOYMENTS:
            return "every ModelDeployment"
        return f"ModelDeployment {self.target}"


def give(
    store: OnCallRecord, verb: str, deployment: str | None, by: str, reason: str = ""
) -> VerbDone:
    """Apply ``verb`` (suspend, resume, retry, reconcile, or an ``OrderKind``: abort,
    promote, promote-full) to ``deployment``, or to every ModelDeployment when None."""
    target = deployment or ALL_DEPLOYMENTS
    if verb in set(OrderKind):
        order = store.give_order(OrderKind(verb), target, by, reason)
        if order is None:
            return VerbDone(verb, target, by, None, refused="no rollout in progress",
                            in_progress=tuple(sorted(store.in_progress())))  # fmt: skip
        return VerbDone(verb, target, by, order)
    if verb == "suspend":
        return VerbDone(verb, target, by, store.suspend(target, by, reason))
    if verb == "resume":
        lifted = store.resume(target, by)
        remaining = tuple(store.suspensions())
        refused = "" if lifted is not None else "not suspended"
        return VerbDone(verb, target, by, lifted, refused, still_suspended=remaining)
    if verb == "retry":
        hold = store.retry(target, by)
        if hold is None:
            held = tuple(sorted(store.history().holds))
            return VerbDone(verb, target, by, None, refused="not held", held=held)
        return VerbDone(verb, target, by, hold)
    if verb == "reconcile":
        return VerbDone(
            verb, ALL_DEPLOYMENTS, by, store.record_action(verb, ALL_DEPLOYMENTS, by, reason)
        )
    raise ValueError(f"not an on-call verb on the state store: {verb!r}")


def never_applied(store: OnCallRecord, deployment: str) -> bool:
    """No pass has applied, held or been told anything about ``deployment``: most often a
    typo in its name (the verb is still recorded: a suspension may come before the first
    apply)."""
    known = set(store.history().holds) | {a.target for a in store.operator_actions()}
    return deployment not in known | set(store.applied_deployments())
