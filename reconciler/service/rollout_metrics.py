"""The rollouts in progress as metrics, for the dashboard and for alerting on a rollout as it
runs (issue 32; cf. Flagger's flagger_canary_weight): per server and model, the step running
(``triton_gitops_rollout_step``), the analysis's time left, and each check's last value and
bound; per router and pool, the share of the traffic and of the mirror the reconciler last
set (``triton_gitops_route_weight``, ``..._route_mirror``). Fed by apply's step events in
the service (as ``GET /status`` is); every series of a pass but the routes is removed when
the pass ends, so the label sets stay bounded by the changes in flight.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from reconciler.model.analysis import Evaluation
from reconciler.model.plan import Action, Step
from reconciler.model.results import Draining
from reconciler.model.traffic import WEIGHT_SCALE
from reconciler.service.telemetry import ReconcilerMetrics

# The step label's values: the planned actions, and the revert of a failed change.
STEPS = (*(str(a) for a in Action if a is not Action.ROLLOUT), "reverting")
_BOUNDS = ("min", "max", "max_increase", "max_increase_bytes")


class RolloutGauges:
    def __init__(self, metrics: ReconcilerMetrics) -> None:
        self.metrics = metrics
        self._lock = threading.Lock()
        self._steps: set[tuple[str, str]] = set()
        self._analyses: set[tuple[str, str]] = set()
        self._checks: set[tuple[str, str, str, str]] = set()
        self._bounds: set[tuple[str, str, str, str]] = set()

    def started(self, step: Step, reverting: bool) -> None:
        current = "reverting" if reverting else str(step.action)
        with self._lock:
            self._steps.add((step.server, step.model))
            for name in STEPS:
                self.metrics.rollout_step.labels(step.server, step.model, name).set(
                    1 if name == current else 0
                )
            if step.action is Action.ANALYZE and step.analysis is not None and not reverting:
                self.metrics.analysis_seconds_left.labels(step.server, step.model).set(
                    step.analysis.duration
                )
                self._analyses.add((step.server, step.model))
                for check in step.analysis.checks:
                    for bound in _BOUNDS:
                        value = getattr(check, bound)
                        if value is not None:
                            key = (step.server, step.model, check.name, bound)
                            self.metrics.check_bound.labels(*key).set(value)
                            self._bounds.add(key)

    def evaluated(self, step: Step, evaluation: Evaluation, seconds_left: float) -> None:
        kinds = {c.name: c.kind for c in step.analysis.checks} if step.analysis else {}
        with self._lock:
            self.metrics.analysis_seconds_left.labels(step.server, step.model).set(seconds_left)
            self._analyses.add((step.server, step.model))
            for result in evaluation.results:
                if result.value is None:
                    continue
                # A check the analysis spec does not name is the shadow comparison's.
                kind = kinds.get(result.check, "shadow")
                key = (step.server, step.model, result.check, kind)
                self.metrics.check_value.labels(*key).set(result.value)
                self._checks.add(key)

    def draining(self, step: Step, draining: Draining) -> None:
        pass  # the live view and apply's lines say it; its outcome is the step's result

    def routed(self, router: str, weights: Mapping[str, int], mirror: Mapping[str, int]) -> None:
        """A router's route now: each pool's share of the traffic and of the mirror (0 to 1).
        Kept after the pass: it is the route the clients meet."""
        for pool, weight in weights.items():
            self.metrics.route_weight.labels(router, pool).set(weight / WEIGHT_SCALE)
        for pool in {*weights, *mirror}:  # the comparator's share among them
            self.metrics.route_mirror.labels(router, pool).set(mirror.get(pool, 0) / WEIGHT_SCALE)

    def pass_ended(self) -> None:
        """The pass is over: nothing is in progress any more."""
        with self._lock:
            for server, model in self._steps:
                for name in STEPS:
                    self.metrics.rollout_step.remove(server, model, name)
            for server, model in self._analyses:
                self.metrics.analysis_seconds_left.remove(server, model)
            for key in self._checks:
                self.metrics.check_value.remove(*key)
            for bound in self._bounds:
                self.metrics.check_bound.remove(*bound)
            self._steps, self._analyses, self._checks, self._bounds = set(), set(), set(), set()
