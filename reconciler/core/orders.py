"""Which operator order a rollout in progress obeys now (``abort``, ``promote``): pure, so
the rule is one place and tested without a clock. The engine asks it between steps, while a
load is awaited and while an analysis watches (``engine/orders.py`` reads the orders).

An order applies only to a rollout that was already running when it was given: one given
before this apply began is stale (it was meant for a rollout that has ended), unless this
apply resumes a rollout an earlier pass left in flight (``resumed_since``). ``abort``
stops every step of the rollout after it; ``promote`` ends the analyses that were running
when it was given (a later step's analysis runs in full); ``promote --full`` ends every
analysis left in the rollout. An abort wins over a promote given at the same time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from reconciler.model.history import History, OperatorOrder, OrderKind
from reconciler.model.spec import DesiredState


def resumed_since(history: History, desired: DesiredState) -> Mapping[str, float]:
    """ModelDeployment -> when the orders to its rollout begin, for each rollout this pass
    resumes (an in-flight record of its current spec, left by a pass that was stopped or
    cut a load off): every order given since the last pass on record ended. An order is
    accepted only while such a record exists, so one given then (to the stopped pass, or
    while no reconciler ran) was meant for that rollout, which is this one."""
    since = history.last_pass_at if history.last_pass_at is not None else 0.0
    return {
        name: since
        for name, record in history.staged.items()
        if name in desired.deployments
        and desired.deployments[name].fingerprint == record.fingerprint
    }


def standing(
    orders: Iterable[OperatorOrder], rollout_started: float, analysis_started: float | None
) -> OperatorOrder | None:
    """The order to obey now, if any. ``rollout_started``: when this apply began (wall
    clock); ``analysis_started``: when the running analysis began, None between steps (only
    an abort applies there)."""
    current = [o for o in orders if o.at_epoch >= rollout_started]
    abort = next((o for o in current if o.kind is OrderKind.ABORT), None)
    if abort is not None or analysis_started is None:
        return abort
    for order in current:
        if order.kind is OrderKind.PROMOTE_FULL:
            return order
        if order.kind is OrderKind.PROMOTE and order.at_epoch >= analysis_started:
            return order
    return None
