"""``reconcile``: one pass, fetch to alert."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from reconciler.adapters.alerts import FanOut
from reconciler.adapters.hooks import HttpStepHooks
from reconciler.adapters.metrics import metrics_reader
from reconciler.adapters.state import StateStore
from reconciler.core.plan.planner import plan
from reconciler.core.records import (
    alerts_from,
    applied_from,
    footprints_from,
    hold_reminders,
    holds_from,
    problem_alerts,
    released_holds,
    rollouts_from,
)
from reconciler.engine.apply import apply
from reconciler.engine.journal import Journal, unpushed
from reconciler.engine.steps import Timing
from reconciler.faults import fault_point
from reconciler.loop.approval import check_approved
from reconciler.loop.memory import PassMemory
from reconciler.loop.phases import discover, guard, observe, read_desired, with_free_memory
from reconciler.loop.records import (
    drift_corrected,
    expected_serving,
    loads_cut_off,
    next_managed,
    write_back,
)
from reconciler.loop.saved_plan import check_saved_plan, serving_digest
from reconciler.model.errors import ReconcileError, StalePlan, UnsafeRevision
from reconciler.model.history import AlertEvent
from reconciler.model.reports import PassReport, SavedPlan
from reconciler.model.results import Progress, StepResult
from reconciler.model.settings import Settings
from reconciler.model.source import Source
from reconciler.wiring import alerter, git_source, new_client


def _quiet(_: StepResult) -> None:
    pass


def _not_stopping() -> bool:
    return False


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
                hooks=HttpStepHooks(),  # until wiring passes the pass's hooks (issue 12)
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
