"""What the planner reads from history and the servers before it
plans: emptied servers, loads still in progress, interrupted work, and the settle key that
lets the service skip a server whose last plan had nothing to do.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from reconciler.model.history import ALL_DEPLOYMENTS, History
from reconciler.model.plan import Action, ModelChange, PlanProblem
from reconciler.model.serving import ModelState, ServerState
from reconciler.model.spec import DesiredState, ModelDeployment


def emptied_servers(
    desired: DesiredState, history: History, discovered: Iterable[str] = ()
) -> list[str]:
    """Servers that served declared models at the last applied revision and would get none.

    A discovered instance that DNS no longer lists is gone, not emptied (``<server>/<addr>``
    of a server that is still declared).
    """
    instances_of = set(discovered) | {
        s.instance_of for s in desired.servers.values() if s.instance_of
    }
    return sorted(
        server
        for server, models in history.managed.items()
        if models
        and not desired.placements.get(server)
        and server.partition("/")[0] not in instances_of
    )


def as_before_the_stop(
    observed: ServerState, deployment: ModelDeployment, history: History
) -> ServerState:
    """A server a stopped staged rollout was in the middle of: seen as it served before,
    so its verify and analysis run again (loading what is already loaded is no reload)."""
    record = history.staged.get(deployment.name)
    if record is None or record.fingerprint != deployment.fingerprint:
        return observed
    before = record.started.get(observed.server)
    if before is None or observed.server in record.completed:
        return observed
    model = observed.model(deployment.model)
    versions = tuple(
        v if v.version in before or v.state != "READY" else replace(v, state="LOADING")
        for v in model.versions
    )
    return replace(
        observed, models={**observed.models, model.name: replace(model, versions=versions)}
    )


def await_load_in_progress(
    outcome: ModelChange | PlanProblem | None, model: ModelState
) -> ModelChange | PlanProblem | None:
    """Never start a second load of a model Triton is still loading (an earlier pass's load,
    cut off by its load timeout, goes on on the server): a second one would queue behind it
    and hold this pass as long. The verify step waits for it instead."""
    loading = frozenset(v.version for v in model.versions if v.state == "LOADING")
    if not loading or not isinstance(outcome, ModelChange):
        return outcome
    loads = [s for s in outcome.steps if s.action is Action.LOAD]
    if any(not set(s.versions) <= model.ready | loading for s in loads):
        return PlanProblem(
            outcome.server,
            outcome.model,
            f"version(s) {', '.join(map(str, sorted(loading)))} still LOADING on the server "
            "(a load started earlier goes on); no other load of this model starts until it ends",
        )
    note = f"; the load already running on the server ({', '.join(map(str, sorted(loading)))} "
    steps = tuple(
        replace(s, reason=s.reason + note + "LOADING) is waited for, not started again")
        if s.action is Action.VERIFY
        else s
        for s in outcome.steps
        if s.action is not Action.LOAD
    )
    return replace(outcome, steps=steps)


def settle_key(
    server: str, desired: DesiredState, observed: ServerState | None, history: History
) -> tuple[Any, ...] | None:
    """Everything ``plan`` reads to plan ``server``, as one comparable value; None when that
    cannot be told (an observation without a token, a deployment without a fingerprint).

    Two passes with equal keys plan the server alike: a server that had nothing to do in the
    first has nothing to do in the second (see ``plan``'s ``settled``).
    """
    if observed is None or observed.token is None or not observed.reachable:
        return None
    placements = desired.placements.get(server, {})
    deployments = [p.deployment for _, p in sorted(placements.items())]
    if any(not d.fingerprint for d in deployments):
        return None
    names = {d.name for d in deployments}
    return (
        observed.token,
        repr(desired.servers.get(server)),
        tuple((d.model, d.name, d.fingerprint) for d in deployments),
        history.managed.get(server, frozenset()),
        tuple(
            (n, h.fingerprint, h.previous.get(server), repr(h.configs.get(server)))
            for n, h in sorted(history.holds.items())
            if n in names
        ),
        tuple(sorted((n, r) for n, r in history.backends.items() if n in names)),
        tuple(
            (n, r.fingerprint, server in r.completed, r.started.get(server))
            for n, r in sorted(history.staged.items())
            if n in names
        ),
        # An operator's suspend or resume plans the server anew.
        tuple(sorted(t for t in history.suspended if t in names or t == ALL_DEPLOYMENTS)),
    )
