"""``triton-gitops check``: the ground checked before a first pass (issue 32), one line per
check with what to do when it fails, through the ports a pass is given (``wiring.ports``).

Without Triton (``--pre``): the Git remote and its credentials (a fetch of the ref), the
manifests at that revision, the state store, Prometheus and Alertmanager where configured
(``/-/ready``), and each router's admin or API. Then per declared server, and per instance
of a discovered one: it answers, its Triton version, EXPLICIT model control (asked with an
unload of a name no repository holds: a no-op in EXPLICIT mode, refused in POLL and NONE
modes), its metrics endpoint, and its model repository where the reconciler reads it.
Changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from reconciler.core.spec.desired import load_desired_state
from reconciler.loop.binding import check_bound
from reconciler.loop.observation import instances
from reconciler.model.errors import ReconcileError, ServerUnavailable
from reconciler.model.preflight import FAIL, OK, WARN, CheckLine
from reconciler.model.settings import Settings
from reconciler.model.source import Source
from reconciler.model.spec import DesiredState
from reconciler.ports import Ports


def preflight(
    source: Source,
    settings: Settings,
    ports: Ports,
    not_ready: Callable[[str], str | None],
    servers: bool = True,
) -> tuple[CheckLine, ...]:
    """Every check, in order; ``servers``: False for ``--pre`` (no Triton asked)."""
    lines: list[CheckLine] = []
    desired = _manifests(source, ports, lines)
    _state(source, settings, ports, lines)
    for name, url, fix in (
        ("prometheus", settings.analysis.prometheus_url, "--prometheus-url: Prometheus's base URL"),
        ("alertmanager", settings.alerts.alertmanager_url, "--alertmanager-url: its base URL"),
    ):
        if url:
            why = not_ready(url)
            lines.append(CheckLine(name, FAIL if why else OK, why or f"{url} is ready", fix))
    if desired is None:
        return tuple(lines)
    for router in sorted(desired.routers.values(), key=lambda r: r.name):
        if ports.routers is None:
            break
        client = ports.routers(router)
        try:
            route = client.observe()
        finally:
            client.close()
        where = f"router {router.name}"
        lines.append(
            CheckLine(where, OK, "answers, routing " + str(route))
            if route.reachable
            else CheckLine(
                where,
                FAIL,
                f"does not answer: {route.error}",
                "check spec.envoy.admin or the GRPCRoute and the API access",
            )
        )
    if servers:
        _servers(desired, ports, lines)
    return tuple(lines)


def _manifests(source: Source, ports: Ports, lines: list[CheckLine]) -> DesiredState | None:
    try:
        revision = ports.manifests.fetch(source.ref)
    except ReconcileError as exc:
        lines.append(
            CheckLine(
                "git", FAIL, str(exc), "check --repo and --ref, and --git-token-file or the SSH key"
            )
        )
        return None
    lines.append(CheckLine("git", OK, f"{source.ref} is {revision[:12]}"))
    try:
        desired = load_desired_state(ports.manifests.read(revision, source.path).files)
    except ReconcileError as exc:
        lines.append(
            CheckLine(
                "manifests",
                FAIL,
                str(exc).splitlines()[0],
                "triton-gitops validate DIR prints every problem",
            )
        )
        return None
    lines.append(
        CheckLine(
            "manifests",
            OK,
            f"{len(desired.servers)} server(s), "
            f"{len(desired.deployments)} deployment(s) under {source.path or '.'}",
        )
    )
    return desired


def _state(source: Source, settings: Settings, ports: Ports, lines: list[CheckLine]) -> None:
    try:
        state = ports.read_state()
    except ReconcileError as exc:
        lines.append(CheckLine("state", FAIL, str(exc), "check --state (a writable folder)"))
        return
    try:
        check_bound(state, ports.manifests.location, source.path, str(settings.state_path))
        lines.append(CheckLine("state", OK, f"{settings.state_path} is readable"))
    except ReconcileError as exc:
        lines.append(CheckLine("state", FAIL, str(exc), "use the state store of this repository"))
    finally:
        state.close()


_STORE_FIX = (
    "check that the store in spec.modelRepository runs at that address and accepts the "
    "credentials (Triton's and the reconciler's environment)"
)


def _server_failure(exc: ReconcileError, address: str, fix: str = "") -> tuple[str, str]:
    """A server check's failure and its fix: the store's when the server's model repository
    cannot be read either (Triton waits on it), else Triton's (``fix``) when it did not
    answer."""
    if isinstance(exc, ServerUnavailable):
        # The line names the server already.
        return exc.reason, _STORE_FIX if exc.repository else fix
    return str(exc), fix


def _servers(desired: DesiredState, ports: Ports, lines: list[CheckLine]) -> None:
    try:
        expanded, _ = instances(desired, ports.resolver)
    except ReconcileError as exc:
        lines.append(CheckLine("discovery", FAIL, str(exc), "check spec.discovery.dns"))
        return
    for name, server in sorted(expanded.servers.items()):
        where = f"server {name}"
        client = ports.triton(server)
        try:
            try:
                version = client.server_version()
            except ReconcileError as exc:
                lines.append(
                    CheckLine(
                        where,
                        FAIL,
                        *_server_failure(
                            exc, server.grpc, f"check that tritonserver runs at {server.grpc}"
                        ),
                    )
                )
                continue
            lines.append(CheckLine(where, OK, f"Triton {version} at {server.grpc}"))
            try:
                explicit = client.explicit_model_control()
            except ReconcileError as exc:
                lines.append(
                    CheckLine(f"{where} model control", FAIL, *_server_failure(exc, server.grpc))
                )
                continue
            lines.append(
                CheckLine(f"{where} model control", OK, "EXPLICIT")
                if explicit
                else CheckLine(
                    f"{where} model control",
                    FAIL,
                    "POLL or NONE: Triton refuses the reconciler's loads and unloads",
                    "start tritonserver with --model-control-mode=explicit",
                )
            )
            placed = sorted(expanded.placements.get(name, {}))
            if server.model_repository:
                observed = client.observe(placed)
                unread = [m for m in placed if observed.model(m).repository_versions is None]
                lines.append(
                    # Why the observation failed, as a pass says it: the store named, and what
                    # failed there (a store that is down shows as Triton not answering first).
                    CheckLine(
                        f"{where} repository",
                        FAIL,
                        observed.error,
                        "the first part says what failed: the store in spec.modelRepository "
                        f"(its address, the credentials) or tritonserver at {server.grpc}",
                    )
                    if observed.error
                    else CheckLine(
                        f"{where} repository",
                        FAIL,
                        f"{server.model_repository}: cannot read {', '.join(unread)}",
                        "mount or give the reconciler access to spec.modelRepository",
                    )
                    if unread
                    else CheckLine(
                        f"{where} repository",
                        OK,
                        f"{server.model_repository}: {len(placed)} model(s) readable",
                    )
                )
        finally:
            client.close()
        reader = ports.metrics(server)
        if reader is not None:
            figures = reader.figures("", ())
            lines.append(
                CheckLine(
                    f"{where} metrics",
                    FAIL,
                    figures.error,
                    "check spec.metrics (Triton's --metrics-port) or --prometheus-url",
                )
                if figures.error
                else CheckLine(f"{where} metrics", OK, "readable")
            )
        else:
            lines.append(
                CheckLine(
                    f"{where} metrics",
                    WARN,
                    "no spec.metrics: the analysis and the headroom check have no figures here",
                )
            )
