"""What executing a Plan did: per step, per change, per pass. Made by
``engine``; read by ``core/records``, ``loop`` and ``views``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from reconciler.model.analysis import Evaluation, RolloutVerdict
from reconciler.model.plan import Action, ModelChange, RolloutPlan, Step


@dataclass(frozen=True)
class Cut:
    """A switch back that did not wait, or waited no longer, for the sequences in flight on
    the new versions (they failed, shutdown came, or the drain's timeout passed): those
    sequences end with an error at their next request. Triton 2.51 counts no open sequence;
    what stands for them is what still reached the new versions after the route had sent
    every new sequence back: the requests a second over the last ``seconds`` of reading
    (None: not read, at a shutdown or without the model's metrics)."""

    rate: float | None
    seconds: float

    def text(self, versions: str) -> str:
        if self.rate is None:
            return f"the sequences in flight on {versions} were cut, not counted (no reading)"
        return (
            f"the sequences in flight on {versions} were cut: {self.rate:.1f} requests a second "
            f"still reached them over {self.seconds:.1f}s after the switch back (Triton counts "
            "no open sequence)"
        )


@dataclass(frozen=True)
class Draining:
    """A drain in progress: one server waiting until the sequences in flight on a model
    have ended (or idled out), so that its versions may change. Triton 2.51 exposes no
    count of open sequences; what stands for them is what still reaches the model: the
    inferences it counted a second over the last reading (the later requests of sequences
    still open: new ones go elsewhere by then, or the drain waits for them too) and its
    queued requests. The drain ends once nothing arrived for ``idle`` seconds (at least
    the model's max_sequence_idle_microseconds: every sequence then ended or Triton freed
    its slot)."""

    rate: float | None  # inferences a second since the last reading; None before two
    pending: float | None  # requests queued (nv_inference_pending_request_count)
    quiet: float  # seconds since the last new inference
    idle: float  # the quiet that ends the drain
    left: float  # seconds before the drain gives up (drainTimeout)

    def as_json(self) -> dict[str, float | None]:
        """As the live view keeps it (``views.live.drain_text`` says it in words)."""
        return {
            "requests_per_second": None if self.rate is None else round(self.rate, 3),
            "pending": self.pending,
            "quiet_seconds": round(self.quiet, 1),
            "idle_seconds": self.idle,
            "seconds_left": round(self.left, 1),
        }


class Outcome(StrEnum):
    CONVERGED = "converged"
    REVERTED = "reverted"  # a step failed; the model serves what it served before
    FAILED = "failed"  # a step failed and the model could not be put back (see errors)
    SKIPPED = "skipped"  # not attempted: its server became unreachable, or shutdown began
    INTERRUPTED = "interrupted"  # shutdown during its analysis or rollout: put back, not held


class FailureKind(StrEnum):
    """What a failed step says, decided once where its error is caught (from the error's
    class, ``model/errors.py``): whether the spec is held or the next pass tries again."""

    # The new versions (or config, or library) failed: put back, and the spec is held.
    AGAINST_VERSIONS = "against-versions"
    # The server did not answer, or restarted and lost the model meanwhile: nothing is known
    # against the versions. Not held; the server's other changes are skipped this pass.
    SERVER_LOST = "server-lost"
    # The analysis could not read its metrics (Prometheus down): put back, not held.
    METRICS_UNAVAILABLE = "metrics-unavailable"
    # Shutdown came during the analysis, or between a rollout's stages: put back, not held.
    INTERRUPTED = "interrupted"
    # A drain that timed out: nothing was swapped, the old versions serve as before.
    NOT_SWAPPED = "not-swapped"
    # An unload did not go through: the next pass retries it.
    UNLOAD_FAILED = "unload-failed"
    # A version the step needed READY was unloaded meanwhile by another caller (a hand
    # unload): put back, not held, and the service passes again at once, as for a hand
    # unload found between passes.
    UNLOADED_MEANWHILE = "unloaded-meanwhile"

    @property
    def transient(self) -> bool:
        """It tells nothing against the versions: no hold, the next pass tries again."""
        return self in _TRANSIENT


_TRANSIENT = frozenset(
    {
        FailureKind.SERVER_LOST,
        FailureKind.METRICS_UNAVAILABLE,
        FailureKind.UNLOAD_FAILED,
        FailureKind.UNLOADED_MEANWHILE,
    }
)


@dataclass(frozen=True)
class StepResult:
    step: Step
    ok: bool
    seconds: float
    error: str | None = None
    failure: FailureKind | None = None  # why it failed (None when it did not)
    reverting: bool = False  # the step belongs to a change's revert
    ended_at: float = 0.0  # the injected clock when the step ended
    evaluations: tuple[Evaluation, ...] = ()  # analyze: every evaluation made
    verdict: RolloutVerdict | None = None  # analyze: how it ended
    footprint: float | None = None  # load beside old: server memory added per new version
    # unload of a streaming model: seconds waited for the streams in flight on the old
    # versions to end there (how many streams Triton does not say)
    stream_wait: float | None = None
    # a switch back's drain not waited for (``Step.unless_failed``): what it cut
    cut: Cut | None = None
    # load: what each version holds as Triton's statistics report it (where the backend does)
    version_costs: Mapping[int, float] = field(default_factory=dict)

    @property
    def unreachable(self) -> bool:
        """The step failed because the server did not answer (or restarted)."""
        return self.failure is FailureKind.SERVER_LOST


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
    def failure(self) -> FailureKind | None:
        """Why the change's forward steps failed: its failed step's kind (there is at most
        one: a change stops at its first failure), None when none failed."""
        return next((r.failure for r in self.steps if not r.ok), None)

    @property
    def analysis(self) -> StepResult | None:
        """The last analysis (a traffic rollout runs one per phase; a failed one is last)."""
        return next((r for r in reversed(self.steps) if r.step.action is Action.ANALYZE), None)

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
    routes: tuple[StepResult, ...] = ()  # the plan's steady-route updates (Plan.routes)

    @property
    def ok(self) -> bool:
        return all(c.outcome is Outcome.CONVERGED for c in self.changes) and all(
            r.ok for r in self.routes
        )


Progress = Callable[[StepResult], None]
# Called as a staged rollout starts each stage: the servers whose stages passed, and the
# servers this stage is about to touch with the versions they served before.
StagedProgress = Callable[[RolloutPlan, tuple[str, ...], Mapping[str, tuple[int, ...]]], None]
