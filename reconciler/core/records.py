"""What a pass leaves behind about its rollouts: records, holds, and the alerts they raise.

Pure functions from a Plan and its ApplyResult (and the wall-clock time, passed in) to the
values the state store writes and the alert adapters send. Called by ``loop.record``.

A rollout is a change that loaded something new (versions or config) for a ModelDeployment on
one server. A change that was reverted puts its ModelDeployment on hold at the versions each
server served before, until a commit changes that ModelDeployment.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from reconciler.model.analysis import Evaluation
from reconciler.model.history import AlertEvent, AppliedSpec, Held, History, Hold, Rollout
from reconciler.model.plan import Action, ModelChange, Plan
from reconciler.model.results import (
    ApplyResult,
    ChangeResult,
    FailureKind,
    Outcome,
    StepResult,
)
from reconciler.model.spec import DesiredState


def rfc3339(epoch: float) -> str:
    """``epoch`` in RFC 3339, UTC, to the second (what operators read and type)."""
    moment = datetime.fromtimestamp(epoch, UTC).replace(microsecond=0)
    return moment.isoformat().replace("+00:00", "Z")


def checks_json(evaluation: Evaluation | None) -> tuple[dict[str, Any], ...]:
    if evaluation is None:
        return ()
    return tuple(
        {
            "check": r.check,
            "verdict": str(r.verdict),
            "value": r.value,
            "threshold": r.threshold,
            "detail": r.detail,
        }
        for r in evaluation.results
    )


def _is_rollout(change: ChangeResult) -> bool:
    return change.change.deployment is not None and any(
        s.action is Action.LOAD for s in change.change.steps
    )


def rollouts_from(result: ApplyResult, now: float) -> tuple[Rollout, ...]:
    return tuple(
        _rollout_of(change, result.revision, now)
        for change in result.changes
        if _is_rollout(change)
    )


def _rollout_of(change: ChangeResult, revision: str, now: float) -> Rollout:
    analysis = change.analysis
    last = analysis.evaluations[-1] if analysis and analysis.evaluations else None
    return Rollout(
        revision=revision,
        deployment=change.change.deployment or "",
        server=change.change.server,
        model=change.change.model,
        from_versions=change.change.serving,
        to_versions=change.change.desired,
        outcome=str(change.outcome),
        verdict=_verdict(change),
        checks=checks_json(last),
        error=change.error,
        rollback_seconds=change.rollback_seconds,
        finished_at=now,
    )


def _verdict(change: ChangeResult) -> str | None:
    """The rollout's analysis verdict; "aborted" too when an operator's abort stopped a step
    before any analysis (during a load, between steps)."""
    analysis = change.analysis
    if analysis is not None and analysis.verdict:
        return str(analysis.verdict)
    return next((str(r.verdict) for r in change.steps if r.verdict == "aborted"), None)


def failure_at_hold(
    change: ModelChange,
    done: Iterable[StepResult],
    revision: str,
    revert_action: str,
    now: float,
) -> tuple[Rollout, AlertEvent]:
    """The row and the failure alert of a rollout whose forward step just failed (``done``:
    its forward steps so far, the failed one last), written with its hold before the revert
    runs: what the pass's record will say, as far as it is known. The revert is still to
    run, so the outcome is "reverted" and the rollback not measured (None); the pass's own
    record completes the row and replaces the alert, unless the process dies first."""
    failed = ChangeResult(change, Outcome.REVERTED, tuple(done))
    return _rollout_of(failed, revision, now), _alert_of(failed, revision, revert_action)


def resumed_from(
    rollouts: Iterable[Rollout], history: History, desired: DesiredState
) -> tuple[Rollout, ...]:
    """``rollouts`` with each that resumes an interrupted one (an in-flight record of the same
    spec names its server) starting where the interrupted one started: an in-place swap
    killed after its unload left nothing serving, which is not where the swap began."""
    resumed = []
    for rollout in rollouts:
        spec = desired.deployments.get(rollout.deployment)
        began = (
            history.began_from(rollout.deployment, spec.fingerprint, rollout.server)
            if spec
            else None
        )
        resumed.append(replace(rollout, from_versions=began) if began is not None else rollout)
    return tuple(resumed)


def interrupted_swaps_finished(
    history: History,
    desired: DesiredState,
    plan_: Plan,
    result: ApplyResult,
    begun: Iterable[str],
    now: float,
) -> tuple[tuple[str, ...], tuple[Rollout, ...]]:
    """In-flight records an earlier pass left behind (killed after its swap, or while the old
    versions unloaded) that this pass finds finished: the ModelDeployment, still at the same
    spec, had nothing left but an unload (done now, converged) or nothing at all, with no
    problem planning it. Their names (the records end) and the swaps the killed pass never
    recorded, one per server it had begun (``begun``: the records this pass began itself,
    which end as usual; a staged rollout in the plan ends by its own run)."""
    staged = {r.deployment for r in plan_.rollouts} | set(begun)
    held = {h.deployment for h in plan_.held}
    recorded = {(r.deployment, r.server) for r in rollouts_from(result, now)}
    ended: list[str] = []
    swaps: list[Rollout] = []
    for name, record in sorted(history.staged.items()):
        spec = desired.deployments.get(name)
        if spec is None or spec.fingerprint != record.fingerprint or name in staged | held:
            continue
        servers = {
            server
            for server, placements in desired.placements.items()
            if any(p.deployment.name == name for p in placements.values())
        }
        changes = [c for c in result.changes if c.change.deployment == name]
        troubled = any(
            p.server in servers and p.model in (None, spec.model) for p in plan_.problems
        )
        if troubled or any(c.outcome is not Outcome.CONVERGED for c in changes):
            continue
        ended.append(name)
        for server in sorted((set(record.started) | record.completed) & servers):
            if (name, server) in recorded:
                continue
            swaps.append(
                Rollout(
                    revision=record.revision or result.revision,
                    deployment=name,
                    server=server,
                    model=spec.model,
                    from_versions=record.started.get(server, ()),
                    to_versions=spec.versions,
                    outcome=str(Outcome.CONVERGED),
                    verdict="passed" if server in record.completed else None,
                    checks=(),  # the interrupted pass's evaluations were never written
                    error=None,
                    rollback_seconds=None,
                    finished_at=now,
                )
            )
    return tuple(ended), tuple(swaps)


def holds_from(result: ApplyResult, desired: DesiredState, history: History) -> tuple[Hold, ...]:
    """A hold for every ModelDeployment with a reverted change, naming every server involved."""
    reverted: dict[str, list[ChangeResult]] = {}
    for change in result.changes:
        if _is_rollout(change) and change.outcome in (Outcome.REVERTED, Outcome.FAILED):
            if change.change.heals:
                continue  # a reload in place: the spec is not at fault, the probes go on
            if change.failure is not None and change.failure.transient:
                # The server went away or restarted, the metrics source was down, or only an
                # unload is left: nothing known against the versions, the next pass tries again.
                continue
            if any(r.unreachable for r in change.revert):
                continue  # the server went away while putting back: transient as well
            reverted.setdefault(change.change.deployment or "", []).append(change)
    holds = []
    for name, changes in sorted(reverted.items()):
        deployment = desired.deployments[name]
        earlier = history.holds.get(name)
        if earlier is not None and earlier.fingerprint != deployment.fingerprint:
            earlier = None  # released: its servers' "previous" is history now
        previous = dict(earlier.previous) if earlier else {}
        configs = dict(earlier.configs) if earlier else {}
        for change in changes:
            # Nothing served because an in-place swap was stopped after its unload: the revert
            # put back what served before it (``plan``'s revert steps do the same).
            began = history.began_from(name, deployment.fingerprint, change.change.server)
            previous.setdefault(change.change.server, change.change.serving or began or ())
            load = change.change.revert[0] if change.change.revert else None
            configs.setdefault(change.change.server, load.config if load else None)
        holds.append(
            Hold(
                deployment=name,
                fingerprint=deployment.fingerprint,
                revision=result.revision,
                reason="; ".join(sorted({c.error or str(c.outcome) for c in changes})),
                previous=previous,
                configs=configs,
            )
        )
    return tuple(holds)


def held_placements(holds: Iterable[Hold], desired: DesiredState) -> tuple[Held, ...]:
    """The placements ``holds`` keep at their old versions, as the next plan lists them
    (``Plan.held``): for the report of the pass that wrote them."""
    return tuple(
        Held(
            server, desired.deployments[h.deployment].model, h.deployment, h.revision, h.reason, was
        )
        for h in holds
        for server, was in sorted(h.previous.items())
    )


def released_holds(desired: DesiredState, history: History) -> tuple[str, ...]:
    """Holds whose ModelDeployment a newer commit changed or removed."""
    return tuple(
        sorted(
            name
            for name, hold in history.holds.items()
            if name not in desired.deployments
            or desired.deployments[name].fingerprint != hold.fingerprint
        )
    )


def alerts_from(result: ApplyResult, revert_action: str) -> tuple[AlertEvent, ...]:
    """One alert per failed rollout; a resolving event per successful one."""
    events = []
    for change in result.changes:
        if not _is_rollout(change):
            continue
        if change.outcome in (Outcome.SKIPPED, Outcome.INTERRUPTED):
            continue  # not attempted, or put back at shutdown: nothing failed
        if change.change.heals:
            events.append(_heal_alert(change, result.revision))
            continue
        events.append(_alert_of(change, result.revision, revert_action))
    return tuple(events)


def _heal_alert(change: ChangeResult, revision: str) -> AlertEvent:
    """What a reload in place of versions that stopped answering did: a warning when they
    serve again (Alertmanager ends it after its resolve_timeout, as nothing sends it again),
    critical when the reload failed (the next pass tries again while the probes fail)."""
    model, server = change.change.model, change.change.server
    broken = ", ".join(map(str, change.change.heals))
    load = change.change.steps[0]
    details = {"revision": revision, "deployment": change.change.deployment, "why": load.reason}
    if change.outcome is Outcome.CONVERGED:
        summary = f"{model} {broken} on {server} stopped answering; reloaded in place, READY"
        return AlertEvent("stopped-answering", "warning", summary, revision, model, server,
                          details)  # fmt: skip
    summary = f"{model} {broken} on {server} stopped answering and could not be reloaded"
    details["error"] = change.error
    return AlertEvent("stopped-answering", "critical", summary, revision, model, server, details)


def _alert_of(change: ChangeResult, revision: str, revert_action: str) -> AlertEvent:
    model, server = change.change.model, change.change.server
    to = ", ".join(map(str, change.change.desired))
    serving = ", ".join(map(str, change.change.serving))
    if change.outcome is Outcome.CONVERGED:
        return AlertEvent(
            "rollout-succeeded",
            "info",
            f"{model} {to} serves on {server}",
            revision,
            model,
            server,
            resolved=True,
        )
    if any(r.step.action is Action.DRAIN and not r.ok for r in change.steps):
        return AlertEvent(
            "drain-timeout",
            "warning",
            f"{model} on {server} did not go idle; {to} not swapped in, {serving} keeps serving",
            revision,
            model,
            server,
            {"revision": revision, "error": change.error},
        )
    unload = next((r for r in change.steps if r.step.action is Action.UNLOAD and not r.ok), None)
    if unload is not None:
        # The versions the unload dropped: those serving before that the spec keeps stay.
        old = ", ".join(map(str, unload.step.dropped)) or serving
        return AlertEvent(
            "unload-failed",
            "warning",
            f"{model} {to} serves on {server}, but the old version(s) {old} could not be "
            "unloaded; the next pass retries",
            revision,
            model,
            server,
            {"revision": revision, "error": change.error, "versions": old},
        )
    return _failed_alert(change, revision, revert_action)


def _failed_alert(change: ChangeResult, revision: str, revert_action: str) -> AlertEvent:
    """A rollout that failed to load or verify, or failed its analysis (here or, staged,
    on another server)."""
    model, server = change.change.model, change.change.server
    to = ", ".join(map(str, change.change.desired))
    analysis = change.analysis
    failed_analysis = (analysis is not None and not analysis.ok) or any(
        r.step.action is Action.ROLLOUT for r in change.steps
    )
    last = analysis.evaluations[-1] if analysis and analysis.evaluations else None
    details: dict[str, Any] = {
        "revision": revision,
        "deployment": change.change.deployment,
        "from_versions": list(change.change.serving),
        "to_versions": list(change.change.desired),
        "outcome": str(change.outcome),
        "error": change.error,
        "action": revert_action if change.outcome is Outcome.REVERTED else "none",
    }
    if last is not None:
        details["checks"] = "; ".join(str(r) for r in last.results)
    if change.rollback_seconds is not None:
        details["rollback_seconds"] = round(change.rollback_seconds, 4)
    # An operator's abort (``Aborted``'s verdict), whichever step it stopped.
    aborted = any(r.verdict == "aborted" for r in change.steps)
    what = "failed its analysis" if failed_analysis else "failed to load or verify"
    # The server stopped answering (or restarted) mid-change: nothing is known against the
    # versions, nothing is held, and the service tries again once the server answers.
    # Or another caller unloaded a version it needed (by hand): nothing against the versions
    # either, and the next pass comes at once.
    lost = change.failure is FailureKind.SERVER_LOST
    taken = change.failure is FailureKind.UNLOADED_MEANWHILE
    if lost or taken:
        step = next(r.step.action for r in change.steps if not r.ok)
        what = (
            f"was cut short: the server was lost during {step}; tried again once it answers"
            if lost
            else f"was cut short: a version was unloaded by another caller during {step}, "
            "not held; the next pass loads it again"
        )
    return AlertEvent(
        "rollout-failed" if failed_analysis or aborted else "load-failed",
        "warning" if lost or taken else "critical",
        f"{model} {to} on {server} "
        + ("was aborted by an operator" if aborted else what)
        + (
            f"; {', '.join(map(str, change.change.serving)) or 'nothing'} serves again"
            if change.outcome is Outcome.REVERTED
            else ""
        ),
        revision,
        model,
        server,
        details,
    )


def applied_from(
    desired: DesiredState, plan: Plan, result: ApplyResult | None
) -> tuple[AppliedSpec, ...]:
    """ModelDeployments that now serve their spec on every server they are placed on."""
    done = set(plan.in_sync) | {
        (c.change.server, c.change.model)
        for c in (result.changes if result else ())
        if c.outcome is Outcome.CONVERGED
    }
    held = {h.deployment for h in plan.held}
    placed: dict[str, list[tuple[str, str]]] = {}
    for server, placements in desired.placements.items():
        for model, placement in placements.items():
            placed.setdefault(placement.deployment.name, []).append((server, model))
    return tuple(
        AppliedSpec(
            name,
            plan.revision,
            d.fingerprint,
            d.versions,
            d.config,
            d.backend.revision if d.backend else None,
        )
        for name, d in sorted(desired.deployments.items())
        if name not in held and placed.get(name) and all(p in done for p in placed[name])
    )


def hold_reminders(
    plan: Plan, open_alerts: Iterable[tuple[str, str, str]]
) -> tuple[AlertEvent, ...]:
    """The failure alerts of holds still in force, fired again.

    Alertmanager resolves an alert nobody sends again within its ``resolve_timeout`` (5 min
    by default), while a hold lasts until a commit changes the failed spec: so every pass
    that keeps a hold says so again. Same kind, model, server and severity as the first
    firing, so Alertmanager sees the same alert, still active.
    """
    held = {(h.model, h.server): h for h in plan.held}
    return tuple(
        AlertEvent(
            kind,
            "critical",
            f"{model} on {server} held at {', '.join(map(str, h.versions)) or 'nothing'} "
            f"since revision {h.revision[:12]} failed; a commit that changes "
            f"{h.deployment} releases it",
            h.revision,
            model,
            server,
            {"revision": h.revision, "deployment": h.deployment, "held": "yes", "reason": h.reason},
        )
        for model, server, kind in sorted(open_alerts)
        if kind in ("rollout-failed", "load-failed") and (h := held.get((model, server)))
    )


def problem_alerts(plan: Plan) -> tuple[AlertEvent, ...]:
    """Plan problems people must hear about: an artifact changed under a released version,
    no memory headroom, a dependency that would make Triton load or unload on its own, a
    config that would change the interface clients of the serving versions see."""
    return tuple(
        AlertEvent(
            p.kind,
            "critical" if p.kind == "artifact-mismatch" else "warning",
            f"{p.model} on {p.server}: {p.message}",
            plan.revision,
            p.model,
            p.server,
            {"revision": plan.revision, "problem": p.message},
        )
        for p in plan.problems
        if p.kind in ("artifact-mismatch", "no-headroom", "dependency", "interface-change")
    )


def footprints_from(result: ApplyResult) -> dict[tuple[str, str], float]:
    """Memory each new version took when it loaded (bytes per version): the footprint a later
    headroom check assumes when the manifest declares none."""
    found: dict[tuple[str, str], float] = {}
    for change in result.changes:
        new = set(change.change.desired) - set(change.change.serving)
        key = (change.change.server, change.change.model)
        for step in change.steps:
            if not (step.ok and new):
                continue
            if new <= set(step.version_costs):
                # Triton's statistics, per version and device: the backend's own measure.
                found[key] = sum(step.version_costs[v] for v in new) / len(new)
            elif step.footprint is not None:
                found[key] = step.footprint / len(new)
    return found
