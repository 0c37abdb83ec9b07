"""``status``: per server and model, what the manifests ask for, what is
served, and why not. Called by the CLI with the ports ``wiring.ports`` builds.
"""

from __future__ import annotations

from reconciler.core.plan.planner import plan
from reconciler.core.spec.desired import load_desired_state
from reconciler.loop.observation import instances, observe_servers
from reconciler.model.history import Rollout
from reconciler.model.reports import ModelStatus, StatusReport
from reconciler.model.settings import Settings
from reconciler.model.source import Source
from reconciler.ports import Ports


def status(source: Source, settings: Settings, ports: Ports) -> StatusReport:
    """Per server and model: what the manifests ask for, what is served, and why not."""
    manifests = ports.manifests
    revision = manifests.read(manifests.fetch(source.ref), source.path)
    desired, _ = instances(load_desired_state(revision.files), ports.resolver)
    state = ports.open_state()
    try:
        history = state.history()
        clients = {name: ports.triton(server) for name, server in desired.servers.items()}
        try:
            serving = observe_servers(
                clients, desired, history, settings.triton.max_parallel, ports.digests
            )
        finally:
            for client in clients.values():
                client.close()
        plan_ = plan(desired, serving, history, revision.sha)
        last: dict[tuple[str, str], Rollout] = {}
        for rollout in state.rollouts(limit=1000):
            last.setdefault((rollout.server, rollout.model), rollout)
        last_pass = state.last_pass()
    finally:
        state.close()

    def served(server: str, model: str) -> tuple[int, ...]:
        observed = serving.get(server)
        return tuple(sorted(observed.model(model).ready)) if observed else ()

    models: list[ModelStatus] = []
    changes = {(c.server, c.model): c for c in plan_.changes}
    problems = {(p.server, p.model): p.message for p in plan_.problems}
    held = {(h.server, h.model): h for h in plan_.held}
    for server, placements in sorted(desired.placements.items()):
        for model, placement in sorted(placements.items()):
            key = (server, model)
            deployment = placement.deployment
            if (server, None) in problems:
                kind, detail = "unreachable", problems[(server, None)]
            elif key in problems:
                kind, detail = "problem", problems[key]
            elif deployment.suspend:
                kind, detail = "suspended", "spec.suspend is true"
            elif key in held:
                hold = held[key]
                kind = "held"
                detail = f"revision {hold.revision[:12]} failed: {hold.reason.splitlines()[0]}"
            elif key in changes:
                steps = ", ".join(f"{s.action} {list(s.versions)}" for s in changes[key].steps)
                kind, detail = "pending", steps
            else:
                kind, detail = "in-sync", ""
            record = history.staged.get(deployment.name)
            if record is not None and record.fingerprint == deployment.fingerprint:
                # A staged rollout that stopped before its end: say how far it got.
                where = (
                    "its stage passed"
                    if server in record.completed
                    else "its stage was cut short"
                    if server in record.started
                    else "not reached yet"
                )
                midway = (
                    f"staged rollout stopped midway ({len(record.completed)} server(s) "
                    f"passed); this server: {where}; the next pass resumes it"
                )
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
    )
