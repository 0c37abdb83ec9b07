"""The in-flight journal: what a pass writes to the state store while apply runs, so that a
reconciler killed mid-pass (SIGKILL, OOM, a power cut) resumes safely. Called by ``loop``.

Before apply, for each ModelDeployment change that loads something, the versions each server
served before (staged rollouts record their stages themselves): if the process dies, the next
pass sees the new versions as not yet verified (``core.plan.settle.as_before_the_stop``) and
verifies and analyses them again, rather than promoting a version whose analysis never
finished. When a server's
forward steps pass (the last verify or analysis before the old versions go), it is marked so.
When a forward step fails, the hold is written at once, before the revert runs, so a kill
mid-revert neither loses the failure nor lets the next pass try the failed spec again; in the
same transaction, the rollout's row as far as it is known and its failure alert, in the alert
outbox (``core.records.failure_at_hold``), so a kill before the pass's record loses neither.
The pass's own record (``StateStore.record_pass``) ends these entries, completing the row.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from reconciler.core.records import failure_at_hold
from reconciler.engine.context import FORWARD
from reconciler.model.history import History, Hold
from reconciler.model.plan import Action, ModelChange, Plan
from reconciler.model.results import FailureKind, Progress, StepResult
from reconciler.model.spec import DesiredState
from reconciler.ports import StateStore


def _last_forward(change: ModelChange) -> int:
    """The index of the step after which only the old versions' unload is left."""
    index = len(change.steps)
    while index > 0 and change.steps[index - 1].action is Action.UNLOAD:
        index -= 1
    return index - 1


@dataclass
class Journal:
    state: StateStore
    plan: Plan
    desired: DesiredState
    revision: str
    revert_action: str  # what the write-back does with a failure (--revert-mode), for its alert
    deployments: list[str] = field(default_factory=list)  # the entries begun, to be ended
    # Holds written early; the pass's own outcome (``holds_from``) decides which stay: a
    # failure found after it was reported to be a restarted server, or a version unloaded
    # by another caller (``engine.change.blame_elsewhere``), is not held.
    held: set[str] = field(default_factory=set)
    # The alerts written with those holds (``AlertEvent.identity``), for the pass's record.
    alerted: set[tuple[str, str, str, bool]] = field(default_factory=set)
    # What earlier passes left (their in-flight records): ``History.began_from``.
    interrupted: History = field(default_factory=History)
    _done: dict[tuple[str, str], list[StepResult]] = field(default_factory=dict)
    _passed: dict[str, set[str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def begin(
        cls,
        state: StateStore,
        plan_: Plan,
        desired: DesiredState,
        revision: str,
        revert_action: str,
        interrupted: History | None = None,
    ) -> Journal:
        """The entries of this plan's changes; ``interrupted``: the history with the entries
        an earlier pass left, whose servers keep what served before that pass began."""
        journal = cls(
            state, plan_, desired, revision, revert_action, interrupted=interrupted or History()
        )
        staged = {r.deployment for r in plan_.rollouts}
        for name in sorted({c.deployment for c in plan_.changes if c.deployment} - staged):
            if any(s.action is Action.LOAD for c in journal._changes(name) for s in c.steps):
                journal.deployments.append(name)
                journal._passed[name] = set()
                journal._write(name)
        return journal

    def _began(self, deployment: str, server: str, otherwise: tuple[int, ...]) -> tuple[int, ...]:
        """What ``server`` served when an interrupted pass began this spec there; else
        ``otherwise``."""
        fingerprint = self.desired.deployments[deployment].fingerprint
        began = self.interrupted.began_from(deployment, fingerprint, server)
        return otherwise if began is None else began

    def _changes(self, deployment: str) -> list[ModelChange]:
        return [c for c in self.plan.changes if c.deployment == deployment]

    def _write(self, deployment: str) -> None:
        self.state.record_stage(
            deployment,
            self.desired.deployments[deployment].fingerprint,
            self.revision,
            self._passed[deployment],
            {
                c.server: self._began(deployment, c.server, c.serving)
                for c in self._changes(deployment)
            },
        )

    def watch(self, progress: Progress) -> Progress:
        """``progress`` with each step result journalled first."""
        held = {h.deployment for h in self.plan.held}
        changes = {(c.server, c.model): c for c in self.plan.changes}

        def journalled(result: StepResult) -> None:
            change = changes.get((result.step.server, result.step.model))
            name = change.deployment if change else None
            if change is None or name is None or result.reverting:
                progress(result)
                return
            with self._lock:
                done = self._done.setdefault((change.server, change.model), [])
                done.append(result)
                if result.ok and name in self._passed:
                    if result.step is change.steps[_last_forward(change)]:
                        self._passed[name].add(change.server)
                        self._write(name)
                elif (
                    not result.ok
                    and result.step.action in FORWARD
                    # Only a failure against the versions holds: a lost server, unreadable
                    # metrics or a shutdown leave the next pass to try again.
                    and result.failure is FailureKind.AGAINST_VERSIONS
                    and name not in held  # putting a hold's versions back: it stays as it is
                ):
                    row, alert = failure_at_hold(
                        change, done, self.revision, self.revert_action, time.time()
                    )
                    self.state.record_hold(self._hold(name, result), row, alert)
                    self.held.add(name)
                    self.alerted.add(alert.identity)
            progress(result)

        return journalled

    def _hold(self, deployment: str, failed: StepResult) -> Hold:
        changes = self._changes(deployment)
        return Hold(
            deployment=deployment,
            fingerprint=self.desired.deployments[deployment].fingerprint,
            revision=self.revision,
            reason=failed.error or "failed",
            previous={
                c.server: c.serving or self._began(deployment, c.server, ()) for c in changes
            },
            configs={c.server: c.revert[0].config if c.revert else None for c in changes},
        )


def unpushed(
    state: StateStore, history: History, desired: DesiredState, holds: tuple[Hold, ...]
) -> tuple[Hold, ...]:
    """Holds an earlier pass recorded whose revert it never pushed to Git (it died first),
    still about the spec in Git now; the write-back pushes them with this pass's."""
    pending = state.unreverted() - {h.deployment for h in holds}
    return tuple(
        hold
        for name, hold in sorted(history.holds.items())
        if name in pending
        and name in desired.deployments
        and desired.deployments[name].fingerprint == hold.fingerprint
    )
