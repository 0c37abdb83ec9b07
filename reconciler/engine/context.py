"""What the steps of one change share while they run: the clocks and waits (``Timing``),
the change's own state (``ChangeContext``), and an operator's abort, obeyed between steps.
Used by the step executors (``engine/steps.py``, ``engine/analyze.py``) and the rollout
kinds that run them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from reconciler.engine.probes import Prober
from reconciler.model.analysis import (
    Evaluation,
    Figures,
    RolloutVerdict,
)
from reconciler.model.errors import (
    Aborted,
    StepFailed,
)
from reconciler.model.history import OperatorOrder, OrderKind
from reconciler.model.plan import Action, Step
from reconciler.model.results import Cut, Draining
from reconciler.model.serving import ModelInterface
from reconciler.ports import FiguresSource, ShadowComparison, StepEvents, StepHooks

# The steps that move a rollout forward (an abort stops them; a revert's steps are not).
FORWARD = frozenset({Action.LOAD, Action.VERIFY, Action.ANALYZE, Action.REPLACE_LIBRARY})


class NoEvents:
    """Nobody watches the steps as they run (a test, the gate)."""

    def started(self, step: Step, reverting: bool) -> None:
        pass

    def evaluated(self, step: Step, evaluation: Evaluation, seconds_left: float) -> None:
        pass

    def routed(self, router: str, weights: Mapping[str, int], mirror: Mapping[str, int]) -> None:
        pass

    def draining(self, step: Step, draining: Draining) -> None:
        pass


def _never() -> bool:
    return False


@dataclass(frozen=True)
class Timing:
    """Injected clock and sleep, so waiting logic is testable without waiting; and
    ``stopping``, which turns true when the process is asked to shut down."""

    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    poll_interval: float = 0.05
    unload_wait: float = 30.0
    stopping: Callable[[], bool] = _never
    # The operator's orders (``engine/orders.py``): for a step, and the wall-clock time its
    # analysis began (None between steps), the abort or promote it obeys now. None: no
    # orders are read (a gate, a test).
    orders: Callable[[Step, float | None], OperatorOrder | None] | None = None
    wall: Callable[[], float] = time.time
    events: StepEvents = field(default_factory=lambda: NoEvents())  # steps begun, evaluations


def aborted(step: Step, order: OperatorOrder, evaluations: tuple[Evaluation, ...] = ()) -> Aborted:
    """The error a step ends with when an operator aborted its rollout."""
    why = f": {order.reason}" if order.reason else ""
    return Aborted(
        f"server {step.server}: rollout of {step.model} aborted by {order.by} at {order.at}"
        f"{why}; the old versions serve again and the spec is held (retry, undo or a new "
        "commit lifts it)",
        evaluations,
    )


def obey_abort(step: Step, timing: Timing) -> None:
    """Raise ``Aborted`` if an operator aborted ``step``'s rollout (between steps, while
    waiting)."""
    if timing.orders is None:
        return
    order = timing.orders(step, None)
    if order is not None and order.kind is OrderKind.ABORT:
        raise aborted(step, order)


class NoStepHooks:
    """The hooks of an executor that was given none: a step that needs a webhook or a
    replaceLibrary command fails, saying so (a plan without them never calls these)."""

    def call_webhook(self, url: str, payload: Mapping[str, Any]) -> None:
        raise StepFailed(f"no step hooks were given to apply: cannot call the {url} webhook")

    def replace_library(self, step: Step) -> None:
        raise StepFailed(
            f"no step hooks were given to apply: cannot replace {step.model}'s library"
        )


@dataclass
class ChangeContext:
    """What one change's steps share while it runs."""

    source: FiguresSource | None = None
    interface: ModelInterface | None = None  # the old versions' inputs and outputs
    footprint: float | None = None
    # unload of a streaming model: the seconds it waited for the streams in flight on the
    # dropped versions to end there (None: it did not wait for streams)
    stream_wait: float | None = None
    # A revert after a failure against the new versions, or at a shutdown (engine.stages.CUT):
    # its drain of them (``Step.unless_failed``) does not wait, and reads what it cuts (``cut``).
    cutting: bool = False
    cut: Cut | None = None
    # version -> what it holds as Triton's statistics report it (backends that report it)
    version_costs: Mapping[int, float] = field(default_factory=dict)
    # Where the analysis reads the old versions' figures: the servers the plan names as the
    # stage's baseline (RolloutPlan.baselines), when there are some; else (None) this
    # server's own old versions.
    baseline: FiguresSource | None = None
    hooks: StepHooks = field(default_factory=NoStepHooks)  # webhooks, replaceLibrary
    # The analysis's: the new versions' counters read before they loaded (their requests
    # count from READY), and the probes, prepared before the load too.
    counted_from: Figures | None = None
    prober: Prober | None = None
    replaces: bool = True  # the change replaces serving versions (False: a first deployment)
    # A traffic rollout's phases watch the same new versions one after another: what reached
    # them in the earlier phases counts towards minEvidence (``evidence_before``), which only
    # the last phase judges (``judge_evidence``); an earlier phase is judged by its
    # evaluations alone. A probe-only phase of one interval cannot gather minEvidence from a
    # slow model on its own (after a 100 ms probe the next waits 1.9 s at maxShare 0.05).
    evidence_before: float = 0.0
    judge_evidence: bool = True
    evidence: float = 0.0  # set by the analysis: the requests or probes that reached them
    # The new versions take no client request (a traffic phase at no traffic): like new
    # versions below the old, their latency is judged by the probes, new against old.
    probes_only: bool = False
    # A shadow phase's comparison of the mirrored live requests: its checks join each
    # evaluation, and the analysis passes only once it has compared enough of them.
    shadow: ShadowComparison | None = None


# What a step's executor returns: an analyze step's evaluations and verdict, else nothing.
StepDone = tuple[tuple[Evaluation, ...], RolloutVerdict | None]

NOTHING: StepDone = ((), None)
