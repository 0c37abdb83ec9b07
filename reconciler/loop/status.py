"""``status``: per server and model, what the manifests ask for, what is
served, and why not. Called by the CLI with the ports ``wiring.ports`` builds.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.core.conditions import PlacementState, conditions
from reconciler.core.placement import placement_state
from reconciler.core.plan.planner import plan
from reconciler.core.records import rfc3339
from reconciler.core.spec.desired import load_desired_state
from reconciler.core.triton_config import merge, streams
from reconciler.loop.binding import check_bound
from reconciler.loop.observation import instances, observe_routers, observe_servers
from reconciler.model.errors import ValidationError
from reconciler.model.history import Held, History, Rollout
from reconciler.model.plan import ModelChange, Plan
from reconciler.model.problems import Problem
from reconciler.model.reports import Condition, ModelStatus, StatusReport
from reconciler.model.settings import Settings
from reconciler.model.source import Source
from reconciler.model.spec import ModelDeployment
from reconciler.ports import Ports


def status(source: Source, settings: Settings, ports: Ports) -> StatusReport:
    """Per server and model: what the manifests ask for, what is served, and why not."""
    manifests = ports.manifests
    revision = manifests.read(manifests.fetch(source.ref), source.path)
    invalid: tuple[Problem, ...] = ()
    declared_at: str | None = None
    try:
        declared = load_desired_state(revision.files)
    except ValidationError as exc:
        # What serves is still worth seeing: as the last applied revision declares it,
        # with the head's problems beside it. Nothing applied yet: the problems alone.
        declared_at = _last_applied(ports, settings, source)
        if declared_at is None:
            raise
        invalid = tuple(exc.problems)
        try:
            declared = load_desired_state(
                manifests.read(manifests.fetch(declared_at), source.path).files
            )
        except ValidationError:
            raise exc from None
    desired, _ = instances(declared, ports.resolver)
    state = ports.read_state()
    try:
        # Another repository's record would read as this one's history.
        check_bound(state, manifests.location, source.path, str(settings.state_path))
        history = state.history()
        clients = {name: ports.triton(server) for name, server in desired.servers.items()}
        try:
            serving = observe_servers(
                clients, desired, history, settings.triton.max_parallel, ports.digests
            )
        finally:
            for client in clients.values():
                client.close()
        routers, routes = observe_routers(desired, ports.routers)
        for router in routers.values():
            router.close()
        plan_ = plan(desired, serving, history, revision.sha, routes=routes)
        last: dict[tuple[str, str], Rollout] = {}
        for rollout in state.rollouts(limit=1000):
            last.setdefault((rollout.server, rollout.model), rollout)
        last_pass = state.last_pass()
    finally:
        state.close()

    def served(server: str, model: str) -> tuple[int, ...]:
        observed = serving.get(server)
        return tuple(sorted(observed.model(model).ready)) if observed else ()

    def streaming(server: str, model: str, declared: Mapping[str, Any]) -> bool:
        observed = serving.get(server)
        state = observed.model(model) if observed else None
        if state is not None and state.loaded_config is not None:
            return streams(state.loaded_config)
        base = state.repository_config if state is not None else None
        return streams(merge(base or {}, declared))

    models: list[ModelStatus] = []
    planned = _Planned.of(plan_)
    for server, placements in sorted(desired.placements.items()):
        for model, placement in sorted(placements.items()):
            key = (server, model)
            deployment = placement.deployment
            kind, detail = _kind(planned, server, model, deployment, history)
            midway = _staged_midway(history, deployment, server)
            if midway:
                detail = f"{detail}; {midway}" if detail else midway
            models.append(
                ModelStatus(
                    server,
                    model,
                    deployment.name,
                    deployment.versions,
                    served(server, model),
                    kind,
                    detail,
                    last.get(key),
                    streaming(server, model, deployment.config),
                )
            )
    for change in plan_.changes:
        if change.deployment is None:
            models.append(
                ModelStatus(
                    change.server,
                    change.model,
                    None,
                    (),
                    change.serving,
                    "removing",
                    "no ModelDeployment places it here any more",
                    last.get((change.server, change.model)),
                )
            )
    return StatusReport(
        revision.sha,
        history.revision,
        tuple(models),
        {p.server: p.message for p in plan_.problems if p.model is None},
        last_pass,
        {
            name: str(route) if route.reachable else f"UNREACHABLE ({route.error})"
            for name, route in sorted(routes.items())
        },
        _conditions(models, history, rfc3339(time.time())),
        no_server_reached=bool(serving) and not any(s.reachable for s in serving.values()),
        invalid=invalid,
        declared_at=declared_at,
    )


def _last_applied(ports: Ports, settings: Settings, source: Source) -> str | None:
    """The revision the last pass applied, from the state store bound to this source."""
    state = ports.read_state()
    try:
        check_bound(state, ports.manifests.location, source.path, str(settings.state_path))
        return state.history().revision
    finally:
        state.close()


def _conditions(
    models: list[ModelStatus], history: History, now: str
) -> dict[str, tuple[Condition, ...]]:
    """Each ModelDeployment's conditions from its models' states; a status the last pass
    left differently changed ``now`` (the next pass records it)."""
    placements: dict[str, list[PlacementState]] = {}
    for m in models:
        if m.deployment is not None:
            verdict = m.last_rollout.verdict if m.last_rollout is not None else None
            placements.setdefault(m.deployment, []).append(
                PlacementState(m.server, m.state, m.detail, verdict)
            )
    return {
        name: conditions(name, found, history.transitions, now)
        for name, found in sorted(placements.items())
    }


@dataclass(frozen=True)
class _Planned:
    """The plan's findings by (server, model), made once for every model's status."""

    problems: dict[tuple[str, str | None], str]
    held: dict[tuple[str, str], Held]
    changes: dict[tuple[str, str], ModelChange]

    @classmethod
    def of(cls, plan_: Plan) -> _Planned:
        return cls(
            {(p.server, p.model): p.message for p in plan_.problems},
            {(h.server, h.model): h for h in plan_.held},
            {(c.server, c.model): c for c in plan_.changes},
        )


def _kind(
    planned: _Planned, server: str, model: str, deployment: ModelDeployment, history: History
) -> tuple[str, str]:
    """Why ``model`` on ``server`` is (or is not) as its manifest asks: (kind, detail). The
    kind is ``placement_state``'s, as the pass's conditions and metric decide it."""
    key = (server, model)
    problems, held, changes = planned.problems, planned.held, planned.changes
    suspension = history.suspension_of(deployment.name)
    kind = placement_state(
        unreachable=(server, None) in problems,
        problem=key in problems,
        suspended=deployment.suspend or suspension is not None,
        held=key in held,
        planned=key in changes,
    )
    match kind:
        case "unreachable":
            return kind, problems[(server, None)]
        case "problem":
            return kind, problems[key]
        case "suspended" if deployment.suspend:
            return kind, "spec.suspend is true"
        case "suspended":
            return kind, f"{suspension}; triton-gitops resume lifts it"
        case "held":
            hold = held[key]
            return kind, f"revision {hold.revision[:12]} failed: {hold.reason.splitlines()[0]}"
        case "pending":
            steps = changes[key].steps
            return kind, ", ".join(f"{s.action} {list(s.versions)}" for s in steps)
    return kind, ""


def _staged_midway(history: History, deployment: ModelDeployment, server: str) -> str:
    """A staged rollout that stopped before its end: how far it got ('' if none)."""
    record = history.staged.get(deployment.name)
    if record is None or record.fingerprint != deployment.fingerprint:
        return ""
    where = (
        "its stage passed"
        if server in record.completed
        else "its stage was cut short"
        if server in record.started
        else "not reached yet"
    )
    return (
        f"staged rollout stopped midway ({len(record.completed)} server(s) "
        f"passed); this server: {where}; the next pass resumes it"
    )
