"""What a pass leaves behind: managed models, serving expected, drift
corrected, revert write-back to Git. Called by the pass's record and revert phases.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from reconciler.model.history import ALL_DEPLOYMENTS, AppliedSpec, History, Hold
from reconciler.model.plan import Action, Plan
from reconciler.model.results import ApplyResult, FailureKind, Outcome
from reconciler.model.settings import RevertMode, Settings
from reconciler.model.source import RevertEdit, Source
from reconciler.model.spec import DesiredState
from reconciler.ports import RevertWriter, StateStore


def left_unverified(result: ApplyResult) -> set[str]:
    """Deployments whose new versions this pass may have left loaded and unverified: a
    change cut short by a lost server, and not put back (nothing could be). A load cut off
    by --load-timeout goes on in Triton; a version loaded before the server was lost on a
    verify's call (a network drop) stays loaded. Their journal entries stay, so the next
    pass verifies and analyses the new versions even if they are READY by then
    (``core.plan.settle.as_before_the_stop``), rather than only dropping the old ones."""
    return {
        c.change.deployment
        for c in result.changes
        if c.change.deployment
        and not c.revert
        and any(r.step.action is Action.LOAD for r in c.steps)
        and any(r.unreachable for r in c.steps)
    }


def next_managed(
    desired: DesiredState, history: History, plan_: Plan, result: ApplyResult | None
) -> dict[str, frozenset[str]]:
    """The models each server counts as ours after this pass.

    Declared models, plus removed ones whose unload did not go through (so a later pass
    retries it); a server we could not observe keeps what it had as well, and so does every
    server while everything is suspended.
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
    # Everything suspended (``triton-gitops suspend``): nothing was removed, so nothing is
    # forgotten either; the pass after ``resume`` removes what the manifests dropped.
    keep_all = ALL_DEPLOYMENTS in history.suspended
    managed: dict[str, frozenset[str]] = {}
    for server, placements in desired.placements.items():
        models = set(placements) | pending_removal.get(server, set())
        if server in unobserved or keep_all:
            models |= history.managed.get(server, frozenset())
        managed[server] = frozenset(models)
    for server, models_before in history.managed.items():
        # No longer declared: no longer ours (unless nothing is being reconciled).
        managed.setdefault(server, models_before if keep_all else frozenset())
    return managed


def revert_message(settings: Settings, result: ApplyResult, holds: tuple[Hold, ...]) -> str:
    names = ", ".join(h.deployment for h in holds)
    lines = [
        settings.revert.message.format(
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
    writer: RevertWriter,
    spec_of: Callable[[AppliedSpec], Mapping[str, Any] | None],
) -> tuple[str, ...]:
    """Push a commit restoring the held ModelDeployments' specs as they last converged
    (``spec_of``: the whole spec at that revision, where it can still be read; else their
    versions and config alone). The whole spec: a failed commit that bumped the versions
    also bumped what goes with them (a smoke case's expected answer), and a revert of the
    versions alone left a manifest whose smoke case fails the version it serves (seen
    walking the demo, issue 45)."""
    if settings.revert.mode is RevertMode.HOLD or not holds:
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
                spec_of(previous),
            )
        )
    if not edits:
        return tuple(notes)
    branch = writer.tracked_branch(source.ref)
    target = (
        f"triton-gitops/revert-{result.revision[:12]}"
        if settings.revert.mode is RevertMode.BRANCH
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
        # A change cut short by a hand unload is expected as planned: the watch finds it
        # not serving and brings the next pass forward, as for a hand unload between passes.
        if change.change.desired and (
            change.outcome is Outcome.CONVERGED or change.failure is FailureKind.UNLOADED_MEANWHILE
        ):
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
