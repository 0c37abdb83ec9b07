"""The phases of one reconcile pass, each a short function that ``loop.reconcile`` runs in
order (and times through ``ports.hooks``):

    fetch     Git ref -> the commit's sha
    approve   refuse a state store that is another repository's record; a revision not
              fast-forward, signed, approved (or not the saved plan's)
    read      the revision's manifests -> DesiredState     (ValidationError: nothing applied)
    discover  servers found through DNS -> their instances
    guard     refuse a revision that would empty a server that serves declared models
    observe   each server -> ServerState      (concurrently; unreachable is data), free memory
    plan      (desired, serving, history) -> Plan     (pure; holds keep failed specs out)
    apply     Plan -> ApplyResult             (only in apply mode; analysis included)
    record    managed models, rollouts, holds, applied specs -> the state store
    alert     failed rollouts and loads; resolve them when a later rollout succeeds
    revert    write the failed ModelDeployments back to Git  (--revert-mode commit|branch)

Alerts go out before the revert write-back, as they always have: a reconciler killed while
pushing has already said what failed. Everything outside comes through ``run.ports``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from reconciler.core.conditions import pass_transitions
from reconciler.core.orders import resumed_since
from reconciler.core.plan.planner import plan as make_plan
from reconciler.core.records import (
    alerts_from,
    applied_from,
    footprints_from,
    held_placements,
    hold_reminders,
    holds_from,
    interrupted_swaps_finished,
    problem_alerts,
    released_holds,
    resumed_from,
    rfc3339,
    rollouts_from,
)
from reconciler.core.spec.desired import read_manifests
from reconciler.core.undo import deployment_document
from reconciler.engine.apply import apply as execute
from reconciler.engine.context import Timing
from reconciler.engine.journal import Journal, unpushed
from reconciler.faults import fault_point
from reconciler.loop.approval import check_approved
from reconciler.loop.binding import bind, check_bound
from reconciler.loop.live import FanOut, LiveStatus
from reconciler.loop.memory import PassMemory
from reconciler.loop.observation import (
    Discovered,
    instances,
    observe_routers,
    observe_servers,
    refuse_emptying,
    with_free_memory,
    with_stopped_answering,
)
from reconciler.loop.pass_log import log_manifest_warnings
from reconciler.loop.records import (
    drift_corrected,
    expected_serving,
    left_unverified,
    next_managed,
    write_back,
)
from reconciler.loop.saved_plan import check_saved_plan, serving_digest
from reconciler.model.errors import (
    ForeignState,
    ReconcileError,
    StalePlan,
    UnsafeRevision,
    ValidationError,
)
from reconciler.model.history import AlertEvent, AppliedSpec, History, Hold, PassRecord
from reconciler.model.plan import Plan
from reconciler.model.reports import PassReport, SavedPlan
from reconciler.model.results import ApplyResult, Progress, StepResult
from reconciler.model.serving import ServerState
from reconciler.model.settings import Settings
from reconciler.model.source import Source
from reconciler.model.spec import DesiredState
from reconciler.model.traffic import RouteState
from reconciler.ports import (
    Alerts,
    FiguresSource,
    Ports,
    StateStore,
    StepEvents,
    TrafficRouter,
    TritonClient,
)


@dataclass(frozen=True)
class PassRun:
    """One pass's running values: what it was asked to do and what it was given.
    ``reconcile`` makes it (with the state store and alerter it opened); every phase reads it."""

    source: Source
    settings: Settings
    ports: Ports
    state: StateStore
    alerts: Alerts
    apply_changes: bool
    progress: Progress
    stopping: Callable[[], bool]
    skip: Mapping[str, str] | None = None  # servers to leave alone this time (name -> why)
    saved: SavedPlan | None = None  # a plan made earlier that this pass must match
    memory: PassMemory | None = None  # what the service keeps between passes
    events: StepEvents | None = None  # who else watches the steps run (apply's lines)


@dataclass(frozen=True)
class Target:
    """What the pass is to make true, once the guard let it through."""

    revision: str
    desired: DesiredState
    discovered: Discovered
    history: History


@dataclass(frozen=True)
class Observed:
    """What the observe phase found, for plan and apply."""

    serving: dict[str, ServerState]
    readers: dict[str, FiguresSource]  # metric readers of the servers not settled
    settled: frozenset[str]  # servers whose last plan had nothing to do (PassMemory)
    keys: dict[str, tuple[object, ...]]  # this pass's settle keys, for the memory
    routes: dict[str, RouteState] = field(default_factory=dict)  # what each Router reports
    routers: dict[str, TrafficRouter] = field(default_factory=dict)  # a client per Router


@dataclass(frozen=True)
class Planned:
    """The plan phase's answer."""

    plan: Plan
    served: dict[str, str]  # per server, the digest of what it serves (saved plans only)


@dataclass(frozen=True)
class Applied:
    """What the apply phase did, for the record."""

    result: ApplyResult
    journal: Journal
    before: dict[str, str]  # the fingerprints applied before this pass (drift)


@dataclass(frozen=True)
class Recorded:
    """What the record phase wrote, for the alert and revert phases."""

    report: PassReport
    holds: tuple[Hold, ...]
    open_alerts: set[tuple[str, str, str]]


def fetch(run: PassRun) -> str:
    """The commit the tracked ref is at now (SourceUnavailable: everything keeps serving)."""
    return run.ports.manifests.fetch(run.source.ref)


def approve(run: PassRun, revision: str) -> None:
    """Refuse (and, applying, alert) a state store that records another repository, and a
    revision not approved the way the settings demand; a saved plan made at another
    revision is stale."""
    location = run.ports.manifests.location
    try:
        check_bound(run.state, location, run.source.path, str(run.settings.state_path))
    except ForeignState as exc:
        summary = f"the state file is another repository's record; revision {revision[:12]} "
        _alert_refusal(run, "state-mismatch", summary + "not applied", revision, exc)
        raise
    last = run.state.last_pass()
    try:
        check_approved(
            run.ports.approval,
            str(last["revision"]) if last else None,
            revision,
            run.settings.approval,
            repository=location,
        )
    except UnsafeRevision as exc:
        summary = f"revision {revision[:12]} refused; the last applied revision keeps serving"
        _alert_refusal(run, "revision-refused", summary, revision, exc)
        raise
    ended = run.memory.refusal_ended() if run.memory and run.apply_changes else None
    if ended is not None:
        run.alerts.send(
            AlertEvent(ended, "info", f"revision {revision[:12]} accepted", revision, resolved=True)
        )
    if run.saved is not None and revision != run.saved.revision:
        raise StalePlan(
            f"stale plan: {run.source.ref} is at {revision} now, the plan was made at "
            f"{run.saved.revision}; make a new plan"
        )


def _alert_refusal(
    run: PassRun, kind: str, summary: str, revision: str, exc: ReconcileError
) -> None:
    """Alert a refusal when applying: in the service once while the same refusal lasts (its
    memory), in a one-shot command every time it is run."""
    if not run.apply_changes or (run.memory and not run.memory.first_refusal(kind, str(exc))):
        return
    run.alerts.send(AlertEvent(kind, "critical", summary, revision, details={"reason": str(exc)}))
    run.alerts.flush()


def read(run: PassRun, revision: str) -> DesiredState:
    """The manifests at ``revision``: the memory's when it read them already."""
    memory, path = run.memory, run.source.path
    desired = memory.desired(revision, path) if memory else None
    if desired is None:
        desired = _read_desired(run, revision)
        if memory:
            memory.remember_desired(revision, path, desired)
    return desired


def _read_desired(run: PassRun, revision: str) -> DesiredState:
    """The manifests at ``revision``, validated, with the shadow request files they name;
    invalid manifests raise (and, when applying, alert): nothing is applied."""
    manifests, folder = run.ports.manifests, run.source.path
    files = manifests.read(revision, folder)
    # Every stage on what could be built: every problem of the revision in one alert.
    reading = read_manifests(
        files.files,
        lambda name: manifests.read_file(revision, f"{folder.strip('/')}/{name}"),
        prometheus=run.settings.analysis.prometheus_url is not None,
    )
    if reading.problems:
        if run.apply_changes:
            run.alerts.send(
                AlertEvent(
                    "validation-failed",
                    "warning",
                    f"the manifests at {files.sha[:12]} are invalid; nothing applied",
                    files.sha,
                    details={"problems": "\n".join(str(p) for p in reading.problems)},
                )
            )
        raise ValidationError(list(reading.problems), files.sha)
    log_manifest_warnings(files.sha, reading.warnings)
    return reading.desired


def discover(run: PassRun, desired: DesiredState) -> tuple[DesiredState, Discovered]:
    return instances(desired, run.ports.resolver)


def guard(run: PassRun, revision: str, desired: DesiredState, discovered: Discovered) -> Target:
    """The revision as the pass's target, unless it would empty a server (with the history
    that tells)."""
    history = run.state.history()
    refuse_emptying(desired, history, run.settings.allow_empty, discovered)
    return Target(revision, desired, discovered, history)


@contextmanager
def connected(run: PassRun, desired: DesiredState) -> Iterator[dict[str, TritonClient]]:
    """A client per server this pass handles (``skip`` left out): the memory's, kept for
    the next pass, or new ones, closed when the pass is done with them."""
    skip, memory, connect = run.skip, run.memory, run.ports.triton
    servers = {n: s for n, s in desired.servers.items() if not skip or n not in skip}
    clients = (
        memory.clients(servers, connect)
        if memory
        else {name: connect(server) for name, server in servers.items()}
    )
    try:
        yield clients
    finally:
        if not memory:
            for client in clients.values():
                client.close()


def observe(run: PassRun, target: Target, clients: Mapping[str, TritonClient]) -> Observed:
    """What each server serves, and the free memory of those not settled."""
    desired, history, parallel = target.desired, target.history, run.settings.triton.max_parallel
    serving = observe_servers(clients, desired, history, parallel, run.ports.digests)
    memory = run.memory
    if memory and memory.stopped_answering:
        serving = with_stopped_answering(serving, memory.stopped_answering)
    settled, keys = memory.settled(desired, serving, history) if memory else (frozenset(), {})
    if memory:
        memory.drop_unreachable(serving)
    readers = {
        name: reader
        for name, server in desired.servers.items()
        if name not in settled and (reader := run.ports.metrics(server)) is not None
    }
    serving = with_free_memory(serving, readers, parallel)
    routers, routes = observe_routers(desired, run.ports.routers)
    return Observed(serving, readers, settled, keys, routes, routers)


def plan(run: PassRun, target: Target, observed: Observed) -> Planned:
    """The plan, remembered for the next pass; checked against the saved plan if any."""
    plan_ = make_plan(
        target.desired,
        observed.serving,
        target.history,
        target.revision,
        run.skip,
        observed.settled,
        observed.routes,
        comparing=run.ports.comparator is not None,
    )
    if run.memory:
        run.memory.remember_plan(observed.keys, plan_)
    # What a saved plan must find unchanged: only the plan command and an apply of a
    # saved plan need it (it costs a JSON dump of every loaded config).
    served = (
        serving_digest(observed.serving) if run.saved is not None or not run.apply_changes else {}
    )
    if run.saved is not None:
        check_saved_plan(run.saved, served, plan_)
    return Planned(plan_, served)


def apply(
    run: PassRun,
    target: Target,
    plan_: Plan,
    clients: Mapping[str, TritonClient],
    observed: Observed,
) -> Applied:
    """Run the plan, each step journalled first (see ``engine/journal.py``)."""
    state, desired, revision = run.state, target.desired, target.revision
    before = {
        name: spec.fingerprint
        for name in desired.deployments
        if (spec := state.applied_spec(name)) is not None
    }
    journal = Journal.begin(
        state, plan_, desired, revision, str(run.settings.revert.mode), target.history
    )
    live = LiveStatus(plan_, state.record_live)
    journalled = journal.watch(run.progress)

    def progress(result: StepResult) -> None:
        journalled(result)
        live.ended(result)

    timing = Timing(
        poll_interval=run.settings.triton.poll_interval,
        stopping=run.stopping,
        events=FanOut(live, run.events) if run.events is not None else live,
    )
    try:
        resumed = resumed_since(target.history, desired)
        result = _execute(run, plan_, clients, observed, timing, progress, revision, resumed)
    finally:
        live.finish()
    return Applied(result, journal, before)


def _execute(
    run: PassRun,
    plan_: Plan,
    clients: Mapping[str, TritonClient],
    observed: Observed,
    timing: Timing,
    progress: Progress,
    revision: str,
    resumed: Mapping[str, float],
) -> ApplyResult:
    """The executor, given the pass's ports: stages journalled, orders read from the store
    (for a resumed rollout, those given since ``resumed`` says)."""
    state = run.state
    return execute(
        plan_,
        clients,
        max_parallel=run.settings.triton.max_parallel,
        progress=progress,
        metrics=observed.readers,
        timing=timing,
        staged_progress=lambda rollout, completed, started: state.record_stage(
            rollout.deployment, rollout.fingerprint, revision, completed, started
        ),
        hooks=run.ports.step_hooks,
        routers=observed.routers,
        orders=state,
        resumed=resumed,
        comparator=run.ports.comparator,
    )


def record(run: PassRun, target: Target, planned: Planned, applied: Applied) -> Recorded:
    """The pass's report, and everything it learned written to the state store at once."""
    desired, result = target.desired, applied.result
    holds = holds_from(result, desired, target.history)
    events = alerts_from(result, str(run.settings.revert.mode))
    open_alerts = run.state.open_alerts()
    resolved = [
        e
        for e in events
        if e.resolved and any((e.model, e.server) == (m, s) for m, s, _ in open_alerts)
    ]
    report = PassReport(
        target.revision,
        planned.plan,
        result,
        served=planned.served,
        drift=drift_corrected(desired, result, applied.before),
        servers={name: server.grpc for name, server in desired.servers.items()},
        expected=expected_serving(desired, planned.plan, result),
        discovered=target.discovered,
        held=held_placements(holds, desired),
        placed={
            (server, model): placement.deployment
            for server, models in desired.placements.items()
            for model, placement in models.items()
        },
    )
    fault_point("loop.record")
    opened = [e for e in events if not e.resolved]
    _record_pass(run, target, report, applied, holds, opened, resolved)
    return Recorded(report, holds, open_alerts)


def _record_pass(
    run: PassRun,
    target: Target,
    report: PassReport,
    applied: Applied,
    holds: tuple[Hold, ...],
    opened: list[AlertEvent],
    resolved: list[AlertEvent],
) -> None:
    desired, history, result, plan_ = target.desired, target.history, applied.result, report.plan
    managed = next_managed(desired, history, plan_, result)
    journal = applied.journal
    now = time.time()
    # A swap an earlier pass finished or nearly finished before it was killed: its record
    # ends and the swap is in history, so that the next plan is empty (issue 17).
    finished, swaps = interrupted_swaps_finished(
        history, desired, plan_, result, journal.deployments, now
    )
    record = PassRecord(
        target.revision,
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
        rollouts=(*resumed_from(rollouts_from(result, now), history, desired), *swaps),
        holds=holds,
        released=tuple(
            n
            for n in sorted({*released_holds(desired, history), *journal.held})
            if n not in {h.deployment for h in holds}
        ),
        applied=tuple(applied_from(desired, plan_, result)),
        footprints=footprints_from(result),
        alerts_opened=tuple((e.model or "", e.server or "", e.kind) for e in opened),
        alerts_resolved=tuple((e.model or "", e.server or "") for e in resolved),
        outbox=(*opened, *resolved),
        outbox_withdrawn=tuple(
            sorted(journal.alerted - {e.identity for e in (*opened, *resolved)})
        ),
        stages_ended=(*_stages_ended(target, plan_, applied), *finished),
        transitions=pass_transitions(report, desired, history.transitions, rfc3339(time.time())),
    )
    run.state.record_pass(record)
    bind(run.state, run.ports.manifests.location, run.source.path)


def _stages_ended(target: Target, plan_: Plan, applied: Applied) -> list[str]:
    """Every staged rollout this pass ran has ended, one way or the other (journal entries
    of loads cut off stay); a record left over from a spec that changed since is dropped."""
    desired = target.desired
    return (
        [r.deployment for r in plan_.rollouts]
        + [n for n in applied.journal.deployments if n not in left_unverified(applied.result)]
        + [
            name
            for name, record in target.history.staged.items()
            if name not in desired.deployments
            or desired.deployments[name].fingerprint != record.fingerprint
        ]
    )


def alert(run: PassRun, plan_: Plan, recorded: Recorded) -> None:
    """Send what the pass found: failures opened and resolved (the outbox its record wrote),
    problems, hold reminders."""
    fault_point("loop.alerts")
    send_outbox(
        run.state,
        run.alerts,
        (*problem_alerts(plan_), *hold_reminders(plan_, recorded.open_alerts)),
    )


def send_outbox(state: StateStore, alerts: Alerts, also: tuple[AlertEvent, ...] = ()) -> None:
    """Send the alert outbox (and ``also``), then, in one transaction, empty the outbox and
    save what the receivers did not take: killed anywhere, a failure alert is sent at
    least once (Alertmanager makes one alert of the same labels sent again)."""
    outbox = state.alert_outbox()
    if not outbox and not also:
        return
    for event in (*outbox.values(), *also):
        alerts.send(event)
    alerts.flush()
    state.alerts_handed_over(outbox, alerts.backlog())


def revert(
    run: PassRun, target: Target, result: ApplyResult, holds: tuple[Hold, ...]
) -> tuple[str, ...]:
    """Write the held ModelDeployments back to Git (with the holds of an earlier pass killed
    before its push); a failure is a note in the report, never the pass's error."""
    try:
        retried = unpushed(run.state, target.history, target.desired, holds)
        return write_back(
            run.source,
            run.settings,
            target.desired,
            run.state,
            result,
            (*holds, *retried),
            run.ports.reverts,
            partial(_converged_spec, run),
        )
    except ReconcileError as exc:
        return (f"revert write-back failed: {exc}",)


def _converged_spec(run: PassRun, applied: AppliedSpec) -> Mapping[str, Any] | None:
    """The spec of ``applied``'s ModelDeployment as written at the revision it converged
    at; None when that revision cannot be read or no longer holds that very spec."""
    try:
        files = run.ports.manifests.read(applied.revision, run.source.path).files
    except ReconcileError:
        return None
    document = deployment_document(files, applied.deployment)
    if document is None or document.fingerprint != applied.fingerprint:
        return None
    return document.spec
