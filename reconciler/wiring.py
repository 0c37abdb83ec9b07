"""Settings to concrete adapters: the only module that names them.

``ports(settings, source)`` is the ``Ports`` value a pass is given (the CLI's ``plan``,
``apply`` and ``status``, and the service, call it); ``review_manifests`` is what ``diff``
and ``gate`` read; ``isolated_server`` is the gate's tritonserver with its load generator.
The other functions build one adapter each, for those and for the service's watch.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler.adapters.aiperf import AIPerf
from reconciler.adapters.alerts import (
    Alerter,
    AlertmanagerAlerter,
    FanOut,
    LogAlerter,
    WebhookAlerter,
)
from reconciler.adapters.comparator import LiveComparator
from reconciler.adapters.config_memory import ConfigMemory, memory_path
from reconciler.adapters.discovery import HostsFileResolver, Resolver, SystemResolver
from reconciler.adapters.envoy import EnvoyRouter
from reconciler.adapters.git import GitManifests, GitSource, GitWriter, folder_in_repository
from reconciler.adapters.hooks import HttpStepHooks
from reconciler.adapters.local_triton import LocalTriton, is_remote_repository
from reconciler.adapters.metrics import metrics_reader
from reconciler.adapters.model_repository import read_model, version_digests
from reconciler.adapters.perf_analyzer import PerfAnalyzer
from reconciler.adapters.reconciler_lock import Locks, StateLockFile, lock_path
from reconciler.adapters.shadow_session import Observer
from reconciler.adapters.state import StateStore
from reconciler.adapters.triton import TritonServerClient
from reconciler.adapters.triton_load import GrpcLoadTester
from reconciler.core.records import rfc3339
from reconciler.core.triton_config import parse_pbtxt
from reconciler.loop.gate import GATE_SERVER, BaseConfig, IsolatedServer
from reconciler.model.errors import ReconcileError
from reconciler.model.repository import parse_repository
from reconciler.model.servers import TritonServer
from reconciler.model.settings import Settings
from reconciler.model.source import GitCredentials, Source
from reconciler.model.traffic import RouterSpec
from reconciler.ports import (
    FiguresSource,
    LoadTester,
    LockHolder,
    NoPassHooks,
    PassHooks,
    Ports,
    ReconcilerLock,
    ServerConnection,
    TrafficRouter,
)

if TYPE_CHECKING:
    from reconciler.adapters.pod_readiness import PodReadinessGate

# KUBERNETES_LATE: the adapters that speak to a Kubernetes API (a Lease, a readiness gate, a
# Gateway API route) are imported where one is configured, not with this module: the
# kubernetes client library takes about 0.17 s to import, paid by every command (a
# pull request's validate and plan, issue 46) that never asks a Kubernetes API.


def new_client(
    server: TritonServer, settings: Settings, memory: ConfigMemory | None = None
) -> TritonServerClient:
    return TritonServerClient.for_server(
        server,
        load_timeout=settings.triton.load_timeout,
        call_timeout=settings.triton.call_timeout,
        config_recheck=settings.triton.config_recheck,
        config_memory=memory,
    )


def config_memory(state_path: Path) -> ConfigMemory | None:
    """The configs remembered beside the state store (adapters/config_memory.py), one for
    the clients of a pass (the file is read once, at the first of them); None where the
    state store's folder does not exist (a plan in CI that keeps nothing)."""
    return ConfigMemory(memory_path(state_path)) if state_path.parent.is_dir() else None


def watch_client(server: str, address: str) -> TritonServerClient:
    """A client for the watch between passes: it only asks what a server serves, and gives
    up after 2 s (a server that slow is left to the next pass and the backoff)."""
    return TritonServerClient(server, address, call_timeout=2.0)


def watch_connection(server: str, address: str) -> ServerConnection:
    """The watch's connection to a server, kept from one reading to the next
    (service/connections.py): the index calls of ``watch_client``, over a connection that
    stays open without calls, so that its drop says the server ended or restarted."""
    return TritonServerClient(server, address, call_timeout=2.0, keep_connection=True)


def git_source(source: Source, settings: Settings) -> GitSource:
    return GitSource(
        source.repo, settings.cache_dir, settings.git.fetch_timeout, settings.git.credentials
    )


def resolver(settings: Settings) -> Resolver:
    return (
        HostsFileResolver(settings.triton.hosts_file)
        if settings.triton.hosts_file
        else SystemResolver()
    )


def alerter(settings: Settings) -> FanOut:
    alerters: list[Alerter] = [LogAlerter(logging.getLogger("triton_gitops.alerts"))]
    if settings.alerts.alertmanager_url:
        alerters.append(AlertmanagerAlerter(settings.alerts.alertmanager_url))
    if settings.alerts.webhook:
        alerters.append(WebhookAlerter(settings.alerts.webhook))
    return FanOut(alerters)


def revert_writer(source: Source, settings: Settings) -> GitWriter:
    # No fetch timeout given: the write-back has always used GitWriter's default (120 s).
    return GitWriter(
        source.repo,
        settings.cache_dir,
        settings.revert.author,
        credentials=settings.git.credentials,
    )


def open_state_store(path: Path, *, read_only: bool = False) -> StateStore:
    """The state store at ``path``, for a caller that keeps it open and closes it itself
    (the service's webhook memory). ``state_store`` for a block."""
    return StateStore(path, read_only=read_only)


@contextmanager
def state_store(path: Path, *, read_only: bool = False) -> Iterator[StateStore]:
    """The state store at ``path`` for one block, closed after it: the on-call verbs,
    history and the live view (a pass opens its own through ``ports``)."""
    store = open_state_store(path, read_only=read_only)
    try:
        yield store
    finally:
        store.close()


_COMPARATORS: dict[str, LiveComparator] = {}
_COMPARATORS_LOCK = threading.Lock()


def comparator(
    listen: str | None, observer: Observer | None = None, http_listen: str | None = None
) -> LiveComparator | None:
    """The comparator at ``listen`` (with its HTTP listener for SSE copies at
    ``http_listen``), one per address for the process (it listens only while a shadow phase
    runs); ``observer`` counts its outcomes (the service's ``/metrics``)."""
    if listen is None:
        return None
    with _COMPARATORS_LOCK:
        found = _COMPARATORS.get(listen)
        if found is None:  # once per address, not once per pass
            found = _COMPARATORS[listen] = LiveComparator(listen, http_listen=http_listen)
        if observer is not None:
            found.observe(observer)
        return found


def ports(
    settings: Settings,
    source: Source,
    hooks: PassHooks | None = None,
    shadow_observer: Observer | None = None,
) -> Ports:
    """The adapters one pass over ``source`` uses, as ``settings`` configure them. Cheap:
    nothing is opened until the pass asks (the state store and alerter once per pass)."""

    def metrics(server: TritonServer) -> FiguresSource | None:
        return metrics_reader(settings.analysis.prometheus_url, server.metrics)

    manifests = GitManifests(git_source(source, settings), settings.cache_dir / "gpg")
    memory = config_memory(settings.state_path)
    return Ports(
        manifests=manifests,
        approval=manifests,
        open_state=lambda: StateStore(settings.state_path, history_days=settings.history_days),
        read_state=lambda: StateStore(settings.state_path, read_only=True),
        open_alerts=lambda: alerter(settings),
        triton=lambda server: new_client(server, settings, memory),
        metrics=metrics,
        reverts=revert_writer(source, settings),
        resolver=resolver(settings),
        digests=version_digests,
        hooks=hooks or NoPassHooks(),
        step_hooks=HttpStepHooks(),
        routers=router_client,
        comparator=comparator(
            settings.analysis.comparator_listen,
            shadow_observer,
            settings.analysis.comparator_http_listen,
        ),
    )


def lock_holder(state_path: Path) -> LockHolder | None:
    """Who holds the reconciler lock of the state store at ``state_path`` now (None:
    nobody: no apply, undo or run works on it)."""
    me = LockHolder(os.getpid(), "status", rfc3339(time.time()), socket.gethostname())
    return StateLockFile(lock_path(state_path), me).holder()


def reconciler_lock(settings: Settings, command: str) -> ReconcilerLock:
    """The lock ``command`` (apply, undo, run) holds while it runs: the file next to the
    state store, then, with ``settings.leader_lease``, the Kubernetes Lease."""
    me = LockHolder(os.getpid(), command, rfc3339(time.time()), socket.gethostname())
    file_lock = StateLockFile(lock_path(settings.state_path), me)
    if settings.leader_lease is None:
        return file_lock
    namespace, _, name = settings.leader_lease.partition("/")
    if not namespace or not name:
        raise ReconcileError(
            f"--leader-lease {settings.leader_lease!r}: expected NAMESPACE/NAME of a Lease"
        )
    from reconciler.adapters.leader_lease import LeaderLease, lease_api  # late: see KUBERNETES_LATE

    return Locks(
        (file_lock, LeaderLease(namespace, name, me, lease_api(os.environ.get("KUBECONFIG"))))
    )


def readiness_gate(settings: Settings, namespace: str) -> PodReadinessGate:
    """The serving truth as each Triton pod's readiness-gate condition, in ``namespace``
    (``run --readiness-gate``): through $KUBECONFIG, else the pod's service account."""
    from reconciler.adapters.leader_lease import lease_api  # late: see KUBERNETES_LATE
    from reconciler.adapters.pod_readiness import PodReadinessGate

    return PodReadinessGate(namespace, lease_api(os.environ.get("KUBECONFIG")), resolver(settings))


def router_client(spec: RouterSpec) -> TrafficRouter:
    """The client of one Router manifest: Envoy's admin API, or the Kubernetes API for a
    Gateway API GRPCRoute."""
    if spec.envoy is not None:
        return EnvoyRouter(spec)
    from reconciler.adapters.gateway import GatewayRouter  # late: see KUBERNETES_LATE

    return GatewayRouter(spec)


def review_manifests(
    repo: str, cache_dir: Path, credentials: GitCredentials | None = None
) -> GitManifests:
    """The manifests ``diff`` compares. A local checkout (a CI job) is read in place, so
    its remote-tracking refs (origin/main) resolve as they do there; others are mirrored."""
    local = "://" not in repo and Path(repo).exists()
    source = GitSource(repo, cache_dir, credentials=credentials)
    return GitManifests(source, cache_dir / "gpg", in_place=local)


def base_configs(
    manifests: GitManifests,
    repo: str,
    revision: str,
    model_repository: str,
    models: Iterable[str],
    base_model_repository: str | None = None,
) -> dict[str, BaseConfig]:
    """Each model's config.pbtxt at the base ref ``revision``, which the gate brings the old
    versions up with: from ``base_model_repository`` (the model repository as it is at the
    base ref) when given, else from the manifests' repository when ``model_repository`` is a
    folder of its local checkout (read while ``revision`` is the commit ``manifests`` last
    read). No entry for a model when neither tells; a file that does not parse reads as none,
    as the reconciler reads it at apply time."""
    found: dict[str, BaseConfig] = {}
    if base_model_repository is not None:
        for model in models:
            found[model] = BaseConfig(read_model(base_model_repository, model).config)
        return found
    if parse_repository(model_repository).remote:
        return found  # a bucket has no history: --base-model-repository gives the base's
    folder = folder_in_repository(repo, Path(model_repository))
    if folder is None:
        return found
    for model in models:
        text = manifests.read_file(revision, f"{folder}/{model}/config.pbtxt".lstrip("/"))
        try:
            found[model] = BaseConfig(parse_pbtxt(text.decode()) if text is not None else None)
        except (ValueError, UnicodeDecodeError):
            found[model] = BaseConfig(None)
    return found


@contextmanager
def isolated_server(
    model_repository: str | Path,
    workdir: Path,
    *,
    tritonserver: Path | None = None,
    perf_analyzer: str | None = None,
    aiperf: str | None = None,
    load_timeout: float = 600.0,
) -> Iterator[IsolatedServer]:
    """A tritonserver of its own on loopback over ``model_repository`` (EXPLICIT mode,
    nothing loaded), with the gate's load generator: ``perf_analyzer`` (its binary) when
    given, else the built-in one; and for streaming models AIPerf (``aiperf``: its binary)
    when given, over the server's HTTP port. Stopped by its pid on exit (killed at once,
    with its process group, when interrupted)."""
    workdir.mkdir(parents=True, exist_ok=True)
    # A bucket is read by the isolated server directly, with the credentials in this
    # environment: the bytes the fleet will load, without a copy of every model first.
    where = (
        model_repository
        if is_remote_repository(model_repository)
        else Path(model_repository).resolve()
    )
    server = LocalTriton(
        where,
        binary=tritonserver,
        log_file=workdir / "tritonserver.log",
    )
    client: TritonServerClient | None = None
    try:
        server.start()
        client = TritonServerClient(
            GATE_SERVER,
            server.grpc_address,
            load_timeout=load_timeout,
            model_repository=str(where),
        )
        tester: LoadTester = (
            PerfAnalyzer(perf_analyzer, server.grpc_address, workdir)
            if perf_analyzer
            else GrpcLoadTester(server.grpc_address)
        )
        streams: LoadTester | None = (
            AIPerf(aiperf, server.http_address, workdir / "aiperf") if aiperf else None
        )
        yield IsolatedServer(
            control=client,
            load_tester=tester,
            memory=server,
            digests=version_digests,
            address=server.grpc_address,
            model_repository=str(where),
            stream_load_tester=streams,
        )
    except KeyboardInterrupt:
        # Interrupted (Ctrl-C, or SIGTERM as the gate command takes it), maybe while it
        # started: ended at once, its stubs and shared memory with it; nothing to unload.
        server.kill()
        raise
    finally:
        if client is not None:
            client.close()
        server.stop()
