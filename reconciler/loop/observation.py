"""What the servers are and serve, for the pass's discover, guard and observe phases (and
``status``): DNS instances, the empty-revision guard, each server's state, free memory.

Everything outside comes in as a port (a resolver, clients, digest reader, metric readers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from reconciler.core.plan.settle import emptied_servers
from reconciler.core.readings import free_memory
from reconciler.model.errors import RepositoryUnavailable, UnsafeRevision
from reconciler.model.history import History
from reconciler.model.serving import ServerState
from reconciler.model.spec import DesiredState
from reconciler.model.traffic import RouterSpec, RouteState
from reconciler.ports import FiguresSource, Resolver, TrafficRouter, TritonClient, VersionDigests

# Per discovered server: its DNS name, how often to resolve it again, the addresses found.
Discovered = dict[str, tuple[str, float, tuple[str, ...]]]


def instances(desired: DesiredState, resolver: Resolver) -> tuple[DesiredState, Discovered]:
    """Replace each server found through DNS by its instances; a name that does not resolve
    is an error naming it (nothing is applied: its instances would all look vanished)."""
    found: Discovered = {}
    for name, discovery in sorted(desired.discovered.items()):
        addresses = tuple(resolver.resolve(discovery.dns))
        found[name] = (discovery.dns, discovery.refresh, addresses)
    expanded = desired.with_instances({n: f[2] for n, f in found.items()})
    return expanded, found


def refuse_emptying(
    desired: DesiredState, history: History, allow_empty: bool, discovered: Iterable[str] = ()
) -> None:
    """Refuse a revision that leaves a server that served declared models with none."""
    emptied = emptied_servers(desired, history, discovered)
    if emptied and not allow_empty:
        raise UnsafeRevision(
            f"refusing revision: it leaves server(s) {', '.join(emptied)} with no declared "
            "models where the last applied revision had some (an empty or broken checkout "
            "must not unload production); pass --allow-empty if this is intended"
        )


def observe_servers(
    clients: Mapping[str, TritonClient],
    desired: DesiredState,
    history: History,
    max_parallel: int,
    digests: VersionDigests,
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
            pinned_found = []
            for model, placement in desired.placements[server].items():
                pinned = placement.deployment.digests
                if pinned and model in enriched:
                    try:
                        found = digests(repository, model, pinned)
                    except RepositoryUnavailable as exc:
                        return ServerState(server, error=str(exc))  # as unreachable: wait
                    enriched[model] = replace(enriched[model], repository_digests=found)
                    pinned_found.append((model, tuple(sorted(found.items()))))
            token = None if state.token is None else (*state.token, tuple(pinned_found))
            state = replace(state, models=enriched, token=token)
        return state

    with ThreadPoolExecutor(max_workers=max(1, max_parallel)) as pool:
        return dict(zip(clients, pool.map(one, clients), strict=True))


def with_stopped_answering(
    serving: Mapping[str, ServerState], marks: Mapping[tuple[str, str], Mapping[int, str]]
) -> dict[str, ServerState]:
    """``serving`` with the versions the service's probes found no longer answering (per
    server and model: version -> the last error), for the plan to reload in place. A server
    with any is never settled (its token is dropped): Triton's index reads the same."""
    marked: dict[str, ServerState] = dict(serving)
    for (server, model), versions in marks.items():
        state = marked.get(server)
        if state is None or not state.reachable or not versions:
            continue
        found = state.model(model)
        models = {**state.models, model: replace(found, stopped_answering=dict(versions))}
        marked[server] = replace(state, models=models, token=None)
    return marked


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
        free = free_memory(figures)  # per device, not the sum: a version needs it on each
        if free is None:
            return state
        fullest = figures.fullest_device()
        where = (
            f"on {fullest[0]}, the fullest of {len(figures.gpu_used)} GPU(s)"
            if fullest is not None
            else "host"
            if figures.memory_host_wide
            else "GPU"
        )
        return replace(state, memory_free=free, memory_free_on=where)

    with ThreadPoolExecutor(max_workers=max(1, max_parallel)) as pool:
        return dict(zip(serving, pool.map(one, serving), strict=True))


def observe_routers(
    desired: DesiredState, connect: Callable[[RouterSpec], TrafficRouter] | None
) -> tuple[dict[str, TrafficRouter], dict[str, RouteState]]:
    """A client per Router manifest and what each reports now (a router that does not
    answer is data: the rollouts through it wait)."""
    routers: dict[str, TrafficRouter] = {}
    routes: dict[str, RouteState] = {}
    for name, spec in sorted(desired.routers.items()):
        if connect is None:
            routes[name] = RouteState(name, False, error=f"router {name}: no router client")
            continue
        routers[name] = connect(spec)
        routes[name] = routers[name].observe()
    return routers, routes
