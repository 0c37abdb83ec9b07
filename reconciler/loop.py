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

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

import git

from reconciler.adapters.alerts import (
    Alerter,
    AlertmanagerAlerter,
    FanOut,
    LogAlerter,
    WebhookAlerter,
)
from reconciler.adapters.credentials import redact
from reconciler.adapters.discovery import HostsFileResolver, Resolver, SystemResolver
from reconciler.adapters.git import GitCredentials, GitSource, GitWriter, RevertEdit, Revision
from reconciler.adapters.metrics import metrics_reader
from reconciler.adapters.signatures import (
    CommitVerifier,
    HistoryRewritten,
    SignaturePolicy,
    TrustedKeysError,
    UnverifiedRevision,
    approvals,
    commits_to_verify,
    is_fast_forward,
)
from reconciler.adapters.state import StateStore
from reconciler.adapters.triton import TritonServerClient
from reconciler.apply import (
    ApplyResult,
    FiguresSource,
    Outcome,
    Progress,
    StepResult,
    Timing,
    apply,
)
from reconciler.artifacts import version_digests
from reconciler.diff import DesiredDiff, diff
from reconciler.errors import ReconcileError, UnsafeRevision, ValidationError
from reconciler.faults import fault_point
from reconciler.journal import Journal, unpushed
from reconciler.plan import (
    Action,
    History,
    Hold,
    Plan,
    emptied_servers,
    plan,
    plan_steps_json,
    settle_key,
)
from reconciler.rollouts import (
    AlertEvent,
    Rollout,
    alerts_from,
    applied_from,
    footprints_from,
    hold_reminders,
    holds_from,
    problem_alerts,
    released_holds,
    rollouts_from,
)
from reconciler.serving import ServerState
from reconciler.spec import DesiredState, load_desired_state
from reconciler.spec.load import analysis_source_problems, attach_shadow_requests
from reconciler.spec.model import TritonServer


@dataclass(frozen=True)
class Source:
    repo: str
    ref: str = "HEAD"
    path: str = ""


class RevertMode(StrEnum):
    HOLD = "hold"
    COMMIT = "commit"
    BRANCH = "branch"


@dataclass(frozen=True)
class Settings:
    cache_dir: Path
    state_path: Path
    allow_empty: bool = False
    max_parallel: int = 8
    load_timeout: float = 600.0
    call_timeout: float = 10.0
    config_recheck: float = 600.0  # see TritonServerClient.observe
    fetch_timeout: float = 120.0  # a Git remote that stalls longer fails the pass's fetch
    prometheus_url: str | None = None
    revert_mode: RevertMode = RevertMode.HOLD
    revert_author: str = "triton-gitops <triton-gitops@localhost>"
    revert_message: str = "Revert {deployments} after failed rollout of {short}"
    alertmanager_url: str | None = None
    alert_webhook: str | None = None
    poll_interval: float = 0.05  # how often verify and unload poll Triton's index
    git_credentials: GitCredentials = field(default_factory=GitCredentials)
    # Only approved commits: fast-forward only, signatures, approval trailers.
    accept_rewrite: str | None = None  # a rewritten head (sha or prefix) an operator accepted
    hosts_file: Path | None = None  # names resolved from this file first (discovery)
    verify_signatures: SignaturePolicy | None = None
    trusted_keys: Path | None = None
    require_trailer: str | None = None
    min_approvals: int = 1


@dataclass(frozen=True)
class PassReport:
    revision: str
    plan: Plan
    result: ApplyResult | None = None
    reverts: tuple[str, ...] = ()  # what the revert write-back did, one line each
    # (server, model) pairs put back to an already applied spec: someone or something
    # (a restart, a hand unload) changed the server.
    drift: tuple[tuple[str, str], ...] = ()
    servers: Mapping[str, str] = field(default_factory=dict)  # name -> gRPC address
    # server -> model -> versions that serve as intended after this pass (the daemon's watch
    # checks these between passes, so a restarted server is seen within seconds)
    expected: Mapping[str, Mapping[str, tuple[int, ...]]] = field(default_factory=dict)
    served: Mapping[str, str] = field(default_factory=dict)  # server -> digest of its state
    # declared server -> (DNS name, refresh seconds, addresses found), for the service's watch
    discovered: Mapping[str, tuple[str, float, tuple[str, ...]]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.plan.problems and (self.result is None or self.result.ok)


class StalePlan(UnsafeRevision):
    """A saved plan no longer matches the tracked branch or the servers."""


@dataclass(frozen=True)
class SavedPlan:
    """What ``plan --out`` records: the revision, each server's state, the steps."""

    revision: str
    served: Mapping[str, str]
    steps: tuple[Mapping[str, object], ...]


class PassMemory:
    """What a long-running reconciler carries from one pass to the next.

    A pass over a large fleet that changes nothing should cost little. The service keeps:
    the manifests of the last revision it read (a pass at the same commit does not parse
    them again), one Triton client per server (a gRPC connection, and the configs it read:
    see ``TritonServerClient.observe``), and the settle keys of the servers whose last plan
    had nothing to do (``plan``'s ``settled``). One-shot commands keep nothing.

    Passes never overlap (the scheduler runs one at a time), so no lock.
    """

    def __init__(self) -> None:
        self._desired: tuple[str, str, DesiredState] | None = None
        self._clients: dict[str, tuple[tuple[object, ...], TritonServerClient]] = {}
        self._settled: dict[str, tuple[object, ...]] = {}

    def desired(self, revision: str, path: str) -> DesiredState | None:
        if self._desired is not None and self._desired[:2] == (revision, path):
            return self._desired[2]
        return None

    def remember_desired(self, revision: str, path: str, desired: DesiredState) -> None:
        self._desired = (revision, path, desired)

    def clients(
        self, servers: Mapping[str, TritonServer], settings: Settings
    ) -> dict[str, TritonServerClient]:
        """A client per server: the one kept from earlier passes while the server's address
        and repository are the same, else a new one; clients of servers gone are closed."""
        kept: dict[str, tuple[tuple[object, ...], TritonServerClient]] = {}
        for name, server in servers.items():
            identity = (server.grpc, server.model_repository)
            previous = self._clients.pop(name, None)
            if previous is not None and previous[0] == identity:
                kept[name] = previous
                continue
            if previous is not None:
                previous[1].close()
            kept[name] = (identity, new_client(server, settings))
        self.close()
        self._clients = kept
        return {name: client for name, (_, client) in kept.items()}

    def settled(
        self, desired: DesiredState, serving: Mapping[str, ServerState], history: History
    ) -> tuple[frozenset[str], dict[str, tuple[object, ...]]]:
        """Servers whose settle key is the one of their last plan with nothing to do; and
        this pass's keys, for ``remember_plan``."""
        keys = {
            server: key
            for server in serving
            if (key := settle_key(server, desired, serving.get(server), history)) is not None
        }
        return frozenset(s for s, k in keys.items() if self._settled.get(s) == k), keys

    def drop_unreachable(self, serving: Mapping[str, ServerState]) -> None:
        """Close the clients of servers that did not answer: the next pass connects afresh
        rather than through a channel that may still be backing off from the outage."""
        for name, state in serving.items():
            if not state.reachable and name in self._clients:
                self._clients.pop(name)[1].close()

    @property
    def settled_servers(self) -> frozenset[str]:
        """Servers whose last plan had nothing to do (the next pass may skip them)."""
        return frozenset(self._settled)

    def remember_plan(self, keys: Mapping[str, tuple[object, ...]], plan_: Plan) -> None:
        busy = {c.server for c in plan_.changes} | {p.server for p in plan_.problems}
        self._settled = {s: k for s, k in keys.items() if s not in busy}

    def close(self) -> None:
        for _, client in self._clients.values():
            client.close()
        self._clients = {}


def new_client(server: TritonServer, settings: Settings) -> TritonServerClient:
    return TritonServerClient.for_server(
        server,
        load_timeout=settings.load_timeout,
        call_timeout=settings.call_timeout,
        config_recheck=settings.config_recheck,
    )


def serving_digest(serving: Mapping[str, ServerState]) -> dict[str, str]:
    """Per server, a digest of what it serves of the models observed (versions, states,
    loaded config), so a saved plan can tell that a server moved since."""
    digests = {}
    for name, server in sorted(serving.items()):
        view = {
            "error": server.error,
            "models": {
                model: {
                    "versions": [[v.version, v.state] for v in state.versions],
                    "config": state.loaded_config,
                }
                for model, state in sorted(server.models.items())
            },
        }
        text = json.dumps(view, sort_keys=True, default=str)
        digests[name] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return digests


def check_saved_plan(saved: SavedPlan, served: Mapping[str, str], plan_: Plan) -> None:
    moved = sorted(
        name
        for name in set(saved.served) | set(served)
        if saved.served.get(name) != served.get(name)
    )
    if moved:
        raise StalePlan(
            f"stale plan: server(s) {', '.join(moved)} changed since the plan was made; "
            "make a new plan"
        )
    steps = tuple(plan_steps_json(plan_))
    if steps != tuple(saved.steps):
        raise StalePlan("stale plan: the same revision and servers now plan other steps")


def _quiet(_: StepResult) -> None:
    pass


def _not_stopping() -> bool:
    return False


def fetch(source: Source, settings: Settings) -> Revision:
    return git_source(source, settings).revision(source.ref, source.path)


def git_source(source: Source, settings: Settings) -> GitSource:
    return GitSource(
        source.repo, settings.cache_dir, settings.fetch_timeout, settings.git_credentials
    )


class NotApproved(UnsafeRevision):
    """The commit lacks the approvals its trailers must record."""


def check_approved(
    mirror: Path, last_applied: str | None, revision: str, settings: Settings
) -> None:
    """Refuse a revision that was not approved the way the settings demand.

    Fast-forward only: the tracked branch must descend from the last applied commit (a
    force-push is refused until an operator accepts that exact head). Then signatures
    (``head``: the commit applied; ``all``: every commit since the last applied one; on a
    first pass only the head), then approval trailers on the commit applied.
    """
    accepted = settings.accept_rewrite is not None and revision.startswith(settings.accept_rewrite)
    if (
        last_applied is not None
        and last_applied != revision  # the same commit again: no git process needed
        and not accepted
        and not is_fast_forward(mirror, last_applied, revision)
    ):
        raise HistoryRewritten(last_applied, revision)
    if settings.verify_signatures is not None:
        if settings.trusted_keys is None:
            raise TrustedKeysError("--verify-signatures needs --trusted-keys DIR")
        policy = settings.verify_signatures if last_applied else SignaturePolicy.HEAD
        verifier = CommitVerifier(settings.trusted_keys, settings.cache_dir / "gpg")
        verdicts = verifier.verify(
            mirror, commits_to_verify(mirror, policy, last_applied, revision)
        )
        if not all(v.ok for v in verdicts):
            raise UnverifiedRevision(verdicts)
    if settings.require_trailer:
        found = approvals(mirror, revision, settings.require_trailer)
        if len(found) < settings.min_approvals:
            raise NotApproved(
                f"refusing revision {revision}: {len(found)} distinct "
                f"{settings.require_trailer} trailer(s), {settings.min_approvals} required"
                + (f" (found: {', '.join(found)})" if found else "")
            )


def resolver(settings: Settings) -> Resolver:
    return HostsFileResolver(settings.hosts_file) if settings.hosts_file else SystemResolver()


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


def loads_cut_off(result: ApplyResult) -> set[str]:
    """Deployments whose load this pass left unfinished: cut off by --load-timeout (Triton
    goes on loading) or by a server gone mid-load. Their journal entries stay, so the next
    pass verifies and analyses the new versions even if the load ended in between and they
    are READY by then (``plan._as_before``), rather than only dropping the old ones."""
    return {
        c.change.deployment
        for c in result.changes
        if c.change.deployment
        and any(r.unreachable and r.step.action is Action.LOAD for r in c.steps)
    }


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
    for problem in plan_.problems:
        # A removal refused this pass (an ensemble still needs the model) stays ours.
        if problem.model and problem.model not in desired.placements.get(problem.server, {}):
            pending_removal.setdefault(problem.server, set()).add(problem.model)
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


def alerter(settings: Settings) -> FanOut:
    alerters: list[Alerter] = [LogAlerter(logging.getLogger("triton_gitops.alerts"))]
    if settings.alertmanager_url:
        alerters.append(AlertmanagerAlerter(settings.alertmanager_url))
    if settings.alert_webhook:
        alerters.append(WebhookAlerter(settings.alert_webhook))
    return FanOut(alerters)


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


def revert_message(settings: Settings, result: ApplyResult, holds: tuple[Hold, ...]) -> str:
    names = ", ".join(h.deployment for h in holds)
    lines = [
        settings.revert_message.format(
            deployments=names, revision=result.revision, short=result.revision[:12]
        ),
        "",
        f"triton-gitops reverted the effect of {result.revision} on {names}:",
    ]
    for change in result.changes:
        if change.change.deployment in {h.deployment for h in holds}:
            lines.append(
                f"- {change.change.server}/{change.change.model}: "
                f"{', '.join(map(str, change.change.desired))} {change.outcome}, "
                f"{', '.join(map(str, change.change.serving)) or 'nothing'} serves again"
            )
            analysis = change.analysis
            if analysis and analysis.evaluations:
                lines.extend(f"    {r}" for r in analysis.evaluations[-1].results)
            elif change.error:
                lines.append(f"    {change.error.strip().splitlines()[0]}")
    lines += ["", f"Reverted-revision: {result.revision}"]
    return "\n".join(lines) + "\n"


def write_back(
    source: Source,
    settings: Settings,
    desired: DesiredState,
    state: StateStore,
    result: ApplyResult,
    holds: tuple[Hold, ...],
) -> tuple[str, ...]:
    """Push a commit restoring the held ModelDeployments' previous versions and config."""
    if settings.revert_mode is RevertMode.HOLD or not holds:
        return ()
    edits, notes = [], []
    for hold in holds:
        previous = state.applied_spec(hold.deployment)
        deployment = desired.deployments[hold.deployment]
        if previous is None:
            notes.append(
                f"{hold.deployment}: no earlier applied spec to restore; held, not reverted in Git"
            )
            state.record_reverted([hold.deployment], notes[-1])
            continue
        edits.append(
            RevertEdit(
                hold.deployment,
                deployment.location.file,  # the file's path in the repository
                hold.fingerprint,
                previous.versions,
                previous.config,
            )
        )
    if not edits:
        return tuple(notes)
    writer = GitWriter(
        source.repo,
        settings.cache_dir,
        settings.revert_author,
        credentials=settings.git_credentials,
    )
    branch = writer.tracked_branch(source.ref)
    target = (
        f"triton-gitops/revert-{result.revision[:12]}"
        if settings.revert_mode is RevertMode.BRANCH
        else branch
    )
    pushed = writer.push_revert(
        branch,
        tuple(edits),
        revert_message(settings, result, holds),
        target,
        reverted=result.revision,
    )
    if pushed is None:
        state.record_reverted([e.deployment for e in edits], "changed again meanwhile")
        return (*notes, "revert not pushed: every ModelDeployment changed again meanwhile")
    state.record_reverted([e.deployment for e in edits], pushed.sha)
    notes.append(
        f"pushed revert {pushed.sha} to {pushed.branch}: restores {', '.join(pushed.deployments)}"
        + (
            f"; left alone (changed meanwhile): {', '.join(pushed.skipped)}"
            if pushed.skipped
            else ""
        )
    )
    return tuple(notes)


def expected_serving(
    desired: DesiredState, plan_: Plan, result: ApplyResult | None
) -> dict[str, dict[str, tuple[int, ...]]]:
    """What each server serves as intended after the pass, model by model."""
    expected: dict[str, dict[str, tuple[int, ...]]] = {}
    for server, model in plan_.in_sync:
        deployment = desired.placements[server][model].deployment
        expected.setdefault(server, {})[model] = deployment.versions
    for held in plan_.held:
        expected.setdefault(held.server, {})[held.model] = held.versions
    for change in result.changes if result else ():
        if change.outcome is Outcome.CONVERGED and change.change.desired:
            expected.setdefault(change.change.server, {})[change.change.model] = (
                change.change.desired
            )
    return expected


def drift_corrected(
    desired: DesiredState, result: ApplyResult, applied: Mapping[str, str]
) -> tuple[tuple[str, str], ...]:
    """Converged changes of ModelDeployments whose current spec had been applied before."""
    return tuple(
        (c.change.server, c.change.model)
        for c in result.changes
        if c.outcome is Outcome.CONVERGED
        and c.change.deployment is not None
        and applied.get(c.change.deployment) == desired.deployments[c.change.deployment].fingerprint
    )


def reconcile(
    source: Source,
    settings: Settings,
    *,
    apply_changes: bool,
    progress: Progress | None = None,
    skip: Mapping[str, str] | None = None,
    stopping: Callable[[], bool] | None = None,
    saved: SavedPlan | None = None,
    memory: PassMemory | None = None,
) -> PassReport:
    """One pass. ``skip``: servers to leave alone this time (name -> why); ``stopping``:
    turns true at shutdown (the change in progress finishes, no other starts); ``saved``: a
    plan made earlier (``plan --out``) that this pass must match exactly, or refuse;
    ``memory``: what the service keeps between passes (none: a one-shot pass)."""
    state = StateStore(settings.state_path)  # once per pass: opening costs milliseconds
    alerts = alerter(settings)
    # What a receiver that was down did not take, from earlier passes (or processes).
    alerts.restore(state.undelivered_alerts())
    try:
        return _reconcile(
            source,
            settings,
            state,
            alerts,
            apply_changes,
            progress,
            skip,
            stopping,
            saved,
            memory,
        )
    finally:
        alerts.flush()
        state.save_undelivered_alerts(alerts.backlog())
        state.close()


def _reconcile(
    source: Source,
    settings: Settings,
    state: StateStore,
    alerts: FanOut,
    apply_changes: bool,
    progress: Progress | None,
    skip: Mapping[str, str] | None,
    stopping: Callable[[], bool] | None,
    saved: SavedPlan | None,
    memory: PassMemory | None,
) -> PassReport:
    repository = git_source(source, settings)
    commit = repository.fetch(source.ref)
    last = state.last_pass()
    try:
        check_approved(
            repository.cache, str(last["revision"]) if last else None, commit.hexsha, settings
        )
    except UnsafeRevision as exc:
        if apply_changes:
            alerts.send(
                AlertEvent(
                    "revision-refused",
                    "critical",
                    f"revision {commit.hexsha[:12]} refused; the last applied revision keeps "
                    "serving",
                    commit.hexsha,
                    details={"reason": str(exc)},
                )
            )
            alerts.flush()
        raise
    if saved is not None and commit.hexsha != saved.revision:
        raise StalePlan(
            f"stale plan: {source.ref} is at {commit.hexsha} now, the plan was made at "
            f"{saved.revision}; make a new plan"
        )
    desired = memory.desired(commit.hexsha, source.path) if memory else None
    if desired is None:
        desired = read_desired(repository, commit, source, settings, alerts, apply_changes)
        if memory:
            memory.remember_desired(commit.hexsha, source.path, desired)
    revision_sha = commit.hexsha
    desired, discovered = discover(desired, settings)
    try:
        history = state.history()
        guard(desired, history, settings.allow_empty, discovered)
        servers = {n: s for n, s in desired.servers.items() if not skip or n not in skip}
        clients = (
            memory.clients(servers, settings)
            if memory
            else {name: new_client(server, settings) for name, server in servers.items()}
        )
        try:
            serving = observe(clients, desired, history, settings.max_parallel)
            settled, keys = (
                memory.settled(desired, serving, history) if memory else (frozenset(), {})
            )
            if memory:
                memory.drop_unreachable(serving)
            readers = {
                name: reader
                for name, server in desired.servers.items()
                if name not in settled
                and (reader := metrics_reader(settings.prometheus_url, server.metrics)) is not None
            }
            serving = with_free_memory(serving, readers, settings.max_parallel)
            plan_ = plan(desired, serving, history, revision_sha, skip, settled)
            if memory:
                memory.remember_plan(keys, plan_)
            # What a saved plan must find unchanged: only the plan command and an apply of a
            # saved plan need it (it costs a JSON dump of every loaded config).
            served = serving_digest(serving) if saved is not None or not apply_changes else {}
            if saved is not None:
                check_saved_plan(saved, served, plan_)
            if not apply_changes:
                return PassReport(revision_sha, plan_, served=served)
            applied = {
                name: spec.fingerprint
                for name in desired.deployments
                if (spec := state.applied_spec(name)) is not None
            }
            journal = Journal.begin(state, plan_, desired, revision_sha)  # see journal.py
            result = apply(
                plan_,
                clients,
                max_parallel=settings.max_parallel,
                progress=journal.watch(progress or _quiet),
                metrics=readers,
                timing=Timing(
                    poll_interval=settings.poll_interval, stopping=stopping or _not_stopping
                ),
                staged_progress=lambda rollout, completed, started: state.record_stage(
                    rollout.deployment, rollout.fingerprint, revision_sha, completed, started
                ),
            )
        finally:
            if not memory:
                for client in clients.values():
                    client.close()
        holds = holds_from(result, desired, history)
        events = alerts_from(result, str(settings.revert_mode))
        open_alerts = state.open_alerts()
        opened = [(e.model or "", e.server or "", e.kind) for e in events if not e.resolved]
        resolved = [
            e
            for e in events
            if e.resolved and any((e.model, e.server) == (m, s) for m, s, _ in open_alerts)
        ]
        report = PassReport(
            revision_sha,
            plan_,
            result,
            served=served,
            drift=drift_corrected(desired, result, applied),
            servers={name: server.grpc for name, server in desired.servers.items()},
            expected=expected_serving(desired, plan_, result),
            discovered=discovered,
        )
        fault_point("loop.record")
        managed = next_managed(desired, history, plan_, result)
        state.record_pass(
            revision_sha,
            # Only what changed: a fleet's managed rows are instances x models.
            {s: m for s, m in managed.items() if history.managed.get(s, frozenset()) != m},
            report.ok,
            {
                "changes": [
                    {"server": c.change.server, "model": c.change.model, "outcome": c.outcome}
                    for c in result.changes
                ],
                "problems": [str(p) for p in plan_.problems],
            },
            rollouts=rollouts_from(result, time.time()),
            holds=holds,
            released=[
                n
                for n in sorted({*released_holds(desired, history), *journal.held})
                if n not in {h.deployment for h in holds}
            ],
            applied=applied_from(desired, plan_, result),
            footprints=footprints_from(result),
            alerts_opened=opened,
            alerts_resolved=[(e.model or "", e.server or "") for e in resolved],
            # Every staged rollout this pass ran has ended, one way or the other; a record
            # left over from a spec that changed since is dropped too.
            stages_ended=[r.deployment for r in plan_.rollouts]
            + [n for n in journal.deployments if n not in loads_cut_off(result)]
            + [
                name
                for name, record in history.staged.items()
                if name not in desired.deployments
                or desired.deployments[name].fingerprint != record.fingerprint
            ],
        )
        fault_point("loop.alerts")
        for event in [e for e in events if not e.resolved] + resolved:
            alerts.send(event)
        for event in problem_alerts(plan_):
            alerts.send(event)
        for event in hold_reminders(plan_, open_alerts):
            alerts.send(event)
        try:
            retried = unpushed(state, history, desired, holds)  # a kill before the push
            notes = write_back(source, settings, desired, state, result, (*holds, *retried))
        except ReconcileError as exc:
            notes = (f"revert write-back failed: {exc}",)
        return replace(report, reverts=notes)
    finally:
        alerts.flush()


@dataclass(frozen=True)
class ModelStatus:
    server: str
    model: str
    deployment: str | None
    desired: tuple[int, ...]
    serving: tuple[int, ...]
    state: str  # in-sync | pending | held | suspended | removing | problem | unreachable
    detail: str = ""
    last_rollout: Rollout | None = None


@dataclass(frozen=True)
class StatusReport:
    revision: str
    last_applied: str | None
    models: tuple[ModelStatus, ...]
    unreachable: Mapping[str, str]  # server -> why
    last_pass: Mapping[str, object] | None


def status(source: Source, settings: Settings) -> StatusReport:
    """Per server and model: what the manifests ask for, what is served, and why not."""
    revision = fetch(source, settings)
    desired, _ = discover(load_desired_state(revision.files), settings)
    state = StateStore(settings.state_path)
    try:
        history = state.history()
        clients = {
            name: TritonServerClient.for_server(server, call_timeout=settings.call_timeout)
            for name, server in desired.servers.items()
        }
        try:
            serving = observe(clients, desired, history, settings.max_parallel)
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


def diff_refs(
    repo: str,
    base: str,
    head: str,
    path: str,
    cache_dir: Path,
    credentials: GitCredentials | None = None,
) -> tuple[str, str, DesiredDiff]:
    """The desired-state diff between two refs (no servers needed): (base sha, head sha, diff)."""
    repository = GitSource(repo, cache_dir, credentials=credentials)
    local = "://" not in repo and Path(repo).exists()
    states = []
    for ref in (base, head):
        # A local checkout (a CI job) is read in place, so its remote-tracking refs
        # (origin/main) resolve as they do there.
        revision = (
            repository.read(repository.resolve_in_place(ref), path)
            if local
            else repository.revision(ref, path)
        )
        try:
            states.append((revision.sha, load_desired_state(revision.files)))
        except ValidationError as exc:
            raise ValidationError(exc.problems, revision.sha) from None
    (base_sha, base_state), (head_sha, head_state) = states
    return base_sha, head_sha, diff(base_state, head_state)


SAVED_PLAN_KIND = "triton-gitops/saved-plan"


def save_plan(
    file: Path, source: Source, report: PassReport, plan_view: Mapping[str, object]
) -> None:
    """Write what ``apply --plan`` must find unchanged: revision, servers' state, steps."""
    file.write_text(
        json.dumps(
            {
                "format_version": "1",
                "kind": SAVED_PLAN_KIND,
                "repo": redact(source.repo),
                "ref": source.ref,
                "path": source.path,
                "revision": report.revision,
                "served": dict(report.served),
                "steps": plan_steps_json(report.plan),
                "plan": plan_view,
            },
            indent=2,
        )
        + "\n"
    )


def load_saved_plan(file: Path, source: Source) -> SavedPlan:
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise StalePlan(f"cannot read saved plan {file}: {exc}") from exc
    if not isinstance(data, dict) or data.get("kind") != SAVED_PLAN_KIND:
        raise StalePlan(f"{file} is not a saved triton-gitops plan")
    made_for = (data.get("repo"), data.get("ref"), data.get("path"))
    if made_for != (redact(source.repo), source.ref, source.path):
        raise StalePlan(
            f"{file} was made for repo {made_for[0]} ref {made_for[1]} path "
            f"{made_for[2]!r}, not this source"
        )
    return SavedPlan(str(data["revision"]), dict(data["served"]), tuple(data["steps"]))
