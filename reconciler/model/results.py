"""What executing a Plan did: per step, per change, per pass. Made by
``engine``; read by ``core/records``, ``loop`` and ``views``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from reconciler.model.analysis import Evaluation, RolloutVerdict
from reconciler.model.plan import Action, ModelChange, RolloutPlan, Step


class Outcome(StrEnum):
    CONVERGED = "converged"
    REVERTED = "reverted"  # a step failed; the model serves what it served before
    FAILED = "failed"  # a step failed and the model could not be put back (see errors)
    SKIPPED = "skipped"  # not attempted: its server became unreachable, or shutdown began
    INTERRUPTED = "interrupted"  # shutdown during its analysis: put back, not held


@dataclass(frozen=True)
class StepResult:
    step: Step
    ok: bool
    seconds: float
    error: str | None = None
    unreachable: bool = False  # the step failed because the server did not answer
    reverting: bool = False  # the step belongs to a change's revert
    ended_at: float = 0.0  # the injected clock when the step ended
    evaluations: tuple[Evaluation, ...] = ()  # analyze: every evaluation made
    verdict: RolloutVerdict | None = None  # analyze: how it ended
    footprint: float | None = None  # load beside old: server memory added per new version


@dataclass(frozen=True)
class ChangeResult:
    change: ModelChange
    outcome: Outcome
    steps: tuple[StepResult, ...]
    revert: tuple[StepResult, ...] = ()

    @property
    def error(self) -> str | None:
        for result in (*self.steps, *self.revert):
            if result.error:
                return result.error
        return None

    @property
    def analysis(self) -> StepResult | None:
        return next((r for r in self.steps if r.step.action is Action.ANALYZE), None)

    @property
    def rollback_seconds(self) -> float | None:
        """From the failing evaluation until the old versions alone were loaded again."""
        analysis = self.analysis
        if analysis is None or analysis.ok or not self.revert or not self.revert[0].ok:
            return None
        return self.revert[0].ended_at - analysis.ended_at


@dataclass(frozen=True)
class ApplyResult:
    revision: str
    changes: tuple[ChangeResult, ...]

    @property
    def ok(self) -> bool:
        return all(c.outcome is Outcome.CONVERGED for c in self.changes)


Progress = Callable[[StepResult], None]


# Called as a staged rollout starts each stage: the servers whose stages passed, and the
# servers this stage is about to touch with the versions they served before.
StagedProgress = Callable[[RolloutPlan, tuple[str, ...], Mapping[str, tuple[int, ...]]], None]
