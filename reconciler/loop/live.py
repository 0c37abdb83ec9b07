"""The rollouts of the pass in progress, as ``status --watch`` and the service's
``GET /status`` show them (issue 15): per ModelDeployment and server, the step running and
since when, the latest evaluation with each check's value and threshold, and the analysis
time left. Fed by apply's events (``ports.StepEvents``) and step results, and written to the
state store as it changes, so that any process reading the store (a one-shot ``status
--watch``, the service's HTTP thread) sees a pass run by another; cleared when apply ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from reconciler.core.records import checks_json, rfc3339
from reconciler.model.analysis import Evaluation
from reconciler.model.plan import Action, Plan, Step
from reconciler.model.results import Draining, StepResult
from reconciler.views.live import RUNNING


class LiveStatus:
    """One apply's rollouts as they run. ``write``: where each new snapshot goes (the state
    store; None when apply has ended)."""

    def __init__(
        self,
        plan: Plan,
        write: Callable[[Mapping[str, Any] | None], None],
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._write, self._wall = write, wall
        self._deployments = {(c.server, c.model): c.deployment for c in plan.changes}
        self._started = wall()
        self._revision = plan.revision
        # (server, model) -> what the live view shows of it
        self._servers: dict[tuple[str, str], dict[str, Any]] = {}
        self._lock = threading.Lock()

    # -- the events (apply's worker threads) ------------------------------------------------

    def started(self, step: Step, reverting: bool) -> None:
        now = self._wall()
        state = ("reverting: " if reverting else "") + RUNNING.get(step.action, str(step.action))
        entry: dict[str, Any] = {
            "step": str(step.action),
            "versions": list(step.versions),
            "state": state,
            "since": rfc3339(now),
            "since_epoch": now,
        }
        if step.action is Action.ANALYZE and step.analysis is not None:
            entry["seconds_left"] = step.analysis.duration
            entry["analysis_ends_epoch"] = now + step.analysis.duration
        self._update(step, entry, ("draining",))  # an earlier drain's readings go

    def evaluated(self, step: Step, evaluation: Evaluation, seconds_left: float) -> None:
        self._update(
            step,
            {
                "seconds_left": round(seconds_left, 1),
                "analysis_ends_epoch": self._wall() + seconds_left,
                "evaluation": {
                    "index": evaluation.index,
                    "at_seconds": round(evaluation.at, 3),
                    "verdict": str(evaluation.verdict),
                    "checks": list(checks_json(evaluation)),
                },
            },
        )

    def routed(self, router: str, weights: Mapping[str, int], mirror: Mapping[str, int]) -> None:
        pass  # the route step's result says it

    def draining(self, step: Step, draining: Draining) -> None:
        self._update(step, {"draining": draining.as_json()})

    def ended(self, result: StepResult) -> None:
        step = result.step
        entry: dict[str, Any] = {"state": f"{step.action} {'ok' if result.ok else 'failed'}"}
        if not result.ok:
            entry["error"] = result.error
        self._update(step, entry)

    def finish(self) -> None:
        """Apply has ended: nothing is in progress any more."""
        self._write(None)

    # -- what is shown ---------------------------------------------------------------------

    def _update(self, step: Step, changes: Mapping[str, Any], drop: tuple[str, ...] = ()) -> None:
        with self._lock:
            key = (step.server, step.model)
            entry = self._servers.setdefault(key, {})
            for name in drop:
                entry.pop(name, None)
            entry.update(changes)
            snapshot = self._snapshot()
        self._write(snapshot)

    def _snapshot(self) -> dict[str, Any]:
        rollouts: dict[str, dict[str, Any]] = {}
        for (server, model), entry in sorted(self._servers.items()):
            deployment = self._deployments.get((server, model)) or model
            rollout = rollouts.setdefault(
                deployment, {"deployment": deployment, "model": model, "servers": {}}
            )
            rollout["servers"][server] = dict(entry)
        now = self._wall()
        return {
            "revision": self._revision,
            "pass_started_at": rfc3339(self._started),
            "updated_at": rfc3339(now),
            "updated_epoch": now,
            "rollouts": list(rollouts.values()),
        }


class FanOut:
    """Several watchers of the same apply."""

    def __init__(self, *watchers: Any) -> None:
        self._watchers = watchers

    def started(self, step: Step, reverting: bool) -> None:
        for watcher in self._watchers:
            watcher.started(step, reverting)

    def evaluated(self, step: Step, evaluation: Evaluation, seconds_left: float) -> None:
        for watcher in self._watchers:
            watcher.evaluated(step, evaluation, seconds_left)

    def routed(self, router: str, weights: Mapping[str, int], mirror: Mapping[str, int]) -> None:
        for watcher in self._watchers:
            watcher.routed(router, weights, mirror)

    def draining(self, step: Step, draining: Draining) -> None:
        for watcher in self._watchers:
            watcher.draining(step, draining)
