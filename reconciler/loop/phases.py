"""One reconcile pass as a straight run of named phases.

    fetch    Git ref -> Revision (sha, manifest files)
    spec     Revision -> DesiredState               (ValidationError: nothing is applied)
    guard    refuse a revision that would empty a server that serves declared models
    observe  each server -> ServerState              (concurrently; unreachable is data)
    plan     (desired, serving, history) -> Plan     (pure; holds keep failed specs out)
    apply    Plan -> ApplyResult                     (only in apply mode; analysis included)
    record   managed models, rollouts, holds, applied specs -> the state store
    revert   write the failed ModelDeployments back to Git  (--revert-mode commit|branch)
    alert    failed rollouts and loads; resolve them when a later rollout succeeds

``reconcile`` is what the CLI's ``plan`` and ``apply`` call; it raises only ReconcileError
subclasses, and returns a PassReport for everything else, failures of single models included.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import git

from reconciler.adapters.alerts import Alerter
from reconciler.adapters.artifacts import version_digests
from reconciler.adapters.git import GitSource
from reconciler.adapters.triton import TritonServerClient
from reconciler.core.plan.settle import emptied_servers
from reconciler.core.spec.desired import load_desired_state
from reconciler.core.spec.rules import analysis_source_problems
from reconciler.core.spec.shadow import attach_shadow_requests
from reconciler.model.errors import UnsafeRevision, ValidationError
from reconciler.model.history import AlertEvent, History
from reconciler.model.serving import ServerState
from reconciler.model.settings import Settings
from reconciler.model.source import Source
from reconciler.model.spec import DesiredState
from reconciler.ports import FiguresSource
from reconciler.wiring import resolver


def discover(
    desired: DesiredState, settings: Settings
) -> tuple[DesiredState, dict[str, tuple[str, float, tuple[str, ...]]]]:
    """Replace each server found through DNS by its instances; a name that does not resolve
    is an error naming it (nothing is applied: its instances would all look vanished)."""
    names = resolver(settings)
    found: dict[str, tuple[str, float, tuple[str, ...]]] = {}
    for name, discovery in sorted(desired.discovered.items()):
        addresses = tuple(names.resolve(discovery.dns))
        found[name] = (discovery.dns, discovery.refresh, addresses)
    expanded = desired.with_instances({n: f[2] for n, f in found.items()})
    return expanded, found


def guard(
    desired: DesiredState, history: History, allow_empty: bool, discovered: Iterable[str] = ()
) -> None:
    emptied = emptied_servers(desired, history, discovered)
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
    """Each server's state: Triton's index and configs; the digests of pinned version folders
    (when the model repository is readable)."""

    def one(server: str) -> ServerState:
        models = set(desired.placements[server]) | set(history.managed.get(server, ()))
        state = clients[server].observe(sorted(models))
        if not state.reachable:
            return state
        repository = desired.servers[server].model_repository
        if repository:
            enriched = dict(state.models)
            digests = []
            for model, placement in desired.placements[server].items():
                pinned = placement.deployment.digests
                if pinned and model in enriched:
                    found = version_digests(repository, model, pinned)
                    enriched[model] = replace(enriched[model], repository_digests=found)
                    digests.append((model, tuple(sorted(found.items()))))
            token = None if state.token is None else (*state.token, tuple(digests))
            state = replace(state, models=enriched, token=token)
        return state

    with ThreadPoolExecutor(max_workers=max(1, max_parallel)) as pool:
        return dict(zip(clients, pool.map(one, clients), strict=True))


def with_free_memory(
    serving: Mapping[str, ServerState],
    readers: Mapping[str, FiguresSource],
    max_parallel: int,
) -> dict[str, ServerState]:
    """``serving`` with the free memory of each server in ``readers`` (from its metrics),
    which the planner weighs before loading new versions beside the old."""

    def one(server: str) -> ServerState:
        state = serving[server]
        reader = readers.get(server)
        if reader is None or not state.reachable:
            return state
        figures = reader.figures("", ())
        if figures.memory_total_bytes is None or figures.memory_bytes is None:
            return state
        return replace(state, memory_free=figures.memory_total_bytes - figures.memory_bytes)

    with ThreadPoolExecutor(max_workers=max(1, max_parallel)) as pool:
        return dict(zip(serving, pool.map(one, serving), strict=True))


def check_analysis_sources(desired: DesiredState, settings: Settings) -> None:
    problems = analysis_source_problems(desired, prometheus=settings.prometheus_url is not None)
    if problems:
        raise ValidationError(problems)


def read_desired(
    repository: GitSource,
    commit: git.Commit,
    source: Source,
    settings: Settings,
    alerts: Alerter,
    apply_changes: bool,
) -> DesiredState:
    """The manifests at ``commit``, validated, with the shadow request files they name;
    invalid manifests raise (and, when applying, alert): nothing is applied."""
    revision = repository.read(commit, source.path)
    try:
        desired = attach_shadow_requests(
            load_desired_state(revision.files),
            lambda name: repository.read_file(commit, f"{source.path.strip('/')}/{name}"),
        )
        check_analysis_sources(desired, settings)
    except ValidationError as exc:
        if apply_changes:
            alerts.send(
                AlertEvent(
                    "validation-failed",
                    "warning",
                    f"the manifests at {revision.sha[:12]} are invalid; nothing applied",
                    revision.sha,
                    details={"problems": "\n".join(str(p) for p in exc.problems)},
                )
            )
        raise ValidationError(exc.problems, revision.sha) from None
    return desired
