"""One reconcile pass as a straight run of named phases.

    fetch    Git ref -> Revision (sha, manifest files)
    spec     Revision -> DesiredState               (ValidationError: nothing is applied)
    guard    refuse a revision that would empty a server that serves declared models
    observe  each server -> ServerState              (concurrently; unreachable is data)
    plan     (desired, serving, history) -> Plan     (pure)
    apply    Plan -> ApplyResult                     (only in apply mode)
    record   the models now managed per server, and the pass, into the state store

``reconcile`` is what the CLI's ``plan`` and ``apply`` call; it raises only ReconcileError
subclasses, and returns a PassReport for everything else, failures of single models included.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from reconciler.adapters.git import GitSource, Revision
from reconciler.adapters.state import StateStore
from reconciler.adapters.triton import TritonServerClient
from reconciler.apply import ApplyResult, Outcome, Progress, StepResult, apply
from reconciler.errors import UnsafeRevision, ValidationError
from reconciler.plan import History, Plan, emptied_servers, plan
from reconciler.serving import ServerState
from reconciler.spec import DesiredState, load_desired_state


@dataclass(frozen=True)
class Source:
    repo: str
    ref: str = "HEAD"
    path: str = ""


@dataclass(frozen=True)
class Settings:
    cache_dir: Path
    state_path: Path
    allow_empty: bool = False
    max_parallel: int = 8
    load_timeout: float = 600.0
    call_timeout: float = 10.0


@dataclass(frozen=True)
class PassReport:
    revision: str
    plan: Plan
    result: ApplyResult | None = None

    @property
    def ok(self) -> bool:
        return not self.plan.problems and (self.result is None or self.result.ok)


def _quiet(_: StepResult) -> None:
    pass


def fetch(source: Source, settings: Settings) -> Revision:
    return GitSource(source.repo, settings.cache_dir).revision(source.ref, source.path)


def guard(desired: DesiredState, history: History, allow_empty: bool) -> None:
    emptied = emptied_servers(desired, history)
    if emptied and not allow_empty:
        raise UnsafeRevision(
            f"refusing revision: it leaves server(s) {', '.join(emptied)} with no declared "
            "models where the last applied revision had some (an empty or broken checkout "
            "must not unload production); pass --allow-empty if this is intended"
        )


def observe(
    clients: Mapping[str, TritonServerClient],
    desired: DesiredState,
    history: History,
    max_parallel: int,
) -> dict[str, ServerState]:
    def one(server: str) -> ServerState:
        models = set(desired.placements[server]) | set(history.managed.get(server, ()))
        return clients[server].observe(sorted(models))

    with ThreadPoolExecutor(max_workers=max(1, max_parallel)) as pool:
        return dict(zip(clients, pool.map(one, clients), strict=True))


def next_managed(
    desired: DesiredState, history: History, plan_: Plan, result: ApplyResult | None
) -> dict[str, frozenset[str]]:
    """The models each server counts as ours after this pass.

    Declared models, plus removed ones whose unload did not go through (so a later pass
    retries it); a server we could not observe keeps what it had as well.
    """
    pending_removal: dict[str, set[str]] = {}
    removed_ok = {
        (c.change.server, c.change.model)
        for c in (result.changes if result else ())
        if c.change.deployment is None and c.outcome is Outcome.CONVERGED
    }
    for change in plan_.changes:
        if change.deployment is None and (change.server, change.model) not in removed_ok:
            pending_removal.setdefault(change.server, set()).add(change.model)
    unobserved = {p.server for p in plan_.problems if p.model is None}
    managed: dict[str, frozenset[str]] = {}
    for server, placements in desired.placements.items():
        models = set(placements) | pending_removal.get(server, set())
        if server in unobserved:
            models |= history.managed.get(server, frozenset())
        managed[server] = frozenset(models)
    for server in history.managed:
        managed.setdefault(server, frozenset())  # no longer declared: no longer ours
    return managed


def reconcile(
    source: Source, settings: Settings, *, apply_changes: bool, progress: Progress | None = None
) -> PassReport:
    revision = fetch(source, settings)
    try:
        desired = load_desired_state(revision.files)
    except ValidationError as exc:
        raise ValidationError(exc.problems, revision.sha) from None
    state = StateStore(settings.state_path)
    try:
        history = state.history()
        guard(desired, history, settings.allow_empty)
        clients = {
            name: TritonServerClient.for_server(
                server, load_timeout=settings.load_timeout, call_timeout=settings.call_timeout
            )
            for name, server in desired.servers.items()
        }
        try:
            serving = observe(clients, desired, history, settings.max_parallel)
            plan_ = plan(desired, serving, history, revision.sha)
            if not apply_changes:
                return PassReport(revision.sha, plan_)
            result = apply(
                plan_, clients, max_parallel=settings.max_parallel, progress=progress or _quiet
            )
        finally:
            for client in clients.values():
                client.close()
        report = PassReport(revision.sha, plan_, result)
        state.record_pass(
            revision.sha,
            next_managed(desired, history, plan_, result),
            report.ok,
            {
                "changes": [
                    {"server": c.change.server, "model": c.change.model, "outcome": c.outcome}
                    for c in result.changes
                ],
                "problems": [str(p) for p in plan_.problems],
            },
        )
        return report
    finally:
        state.close()
