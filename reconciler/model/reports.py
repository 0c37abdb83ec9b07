"""What a pass and ``status`` return to their callers (the CLI, the
service, the views): the plan, what apply did, what is served and why not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from reconciler.model.history import Held, Rollout
from reconciler.model.plan import Plan
from reconciler.model.problems import Problem
from reconciler.model.results import ApplyResult, FailureKind
from reconciler.model.spec import ModelDeployment


@dataclass(frozen=True)
class PassReport:
    revision: str
    plan: Plan
    result: ApplyResult | None = None
    reverts: tuple[str, ...] = ()  # what the revert write-back did, one line each
    # (server, model) pairs put back to an already applied spec: someone or something
    # (a restart, a hand unload) changed the server.
    drift: tuple[tuple[str, str], ...] = ()
    servers: Mapping[str, str] = field(default_factory=dict)  # name -> gRPC address
    # server -> model -> versions that serve as intended after this pass (the daemon's watch
    # checks these between passes, so a restarted server is seen within seconds)
    expected: Mapping[str, Mapping[str, tuple[int, ...]]] = field(default_factory=dict)
    served: Mapping[str, str] = field(default_factory=dict)  # server -> digest of its state
    # declared server -> (DNS name, refresh seconds, addresses found), for the service's watch
    discovered: Mapping[str, tuple[str, float, tuple[str, ...]]] = field(default_factory=dict)
    # The placements a hold this pass wrote keeps at their old versions (the plan, made
    # before, lists only earlier passes' holds in ``plan.held``).
    held: tuple[Held, ...] = ()
    # (server, model) -> the ModelDeployment placing it there: what the service's probes
    # between rollouts send (spec.servingProbes, the smoke cases).
    placed: Mapping[tuple[str, str], ModelDeployment] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.plan.problems and (self.result is None or self.result.ok)

    @property
    def down_when_planned(self) -> frozenset[str]:
        """Servers that did not answer when the pass planned (a whole-server problem)."""
        return frozenset(p.server for p in self.plan.problems if p.model is None)

    @property
    def unreachable(self) -> frozenset[str]:
        """Servers that did not answer: when the pass planned, or while it applied (a
        change whose step lost the server)."""
        while_applying = {
            c.change.server
            for c in (self.result.changes if self.result else ())
            if c.failure is FailureKind.SERVER_LOST
        }
        return self.down_when_planned | while_applying


@dataclass(frozen=True)
class PassFailure:
    """One server, model or router a pass did not bring where the manifests ask, and why:
    a plan problem (a server unreachable, a manifest problem) or a change that did not
    converge. ``core/failures.py`` derives them from a PassReport; the pass logs one event
    each and the service answers them in ``GET /v1/passes/last``."""

    revision: str
    # A change's FailureKind (against-versions, server-lost, ...) or "skipped"; a plan
    # problem's kind ("unreachable" for a whole server, else PlanProblem.kind).
    kind: str
    reason: str  # the failed step's error, or the problem's message
    server: str | None = None  # None: a router
    model: str | None = None  # None: the whole server, or a router
    deployment: str | None = None
    step: str | None = None  # the action that failed (load, verify, analyze, ...)
    outcome: str | None = None  # the change's Outcome; None for a plan problem
    versions: tuple[int, ...] = ()  # the versions asked for
    router: str | None = None
    revert_error: str | None = None  # the old versions could not be put back: why
    checks: tuple[Mapping[str, Any], ...] = ()  # a failed analysis's last evaluation
    # A person must act: nothing the next pass does by itself fixes it (core/failures.py).
    severe: bool = False


@dataclass(frozen=True)
class SavedPlan:
    """What ``plan --out`` records: the revision, each server's state, the steps."""

    revision: str
    served: Mapping[str, str]
    steps: tuple[Mapping[str, object], ...]


@dataclass(frozen=True)
class ModelStatus:
    server: str
    model: str
    deployment: str | None
    desired: tuple[int, ...]
    serving: tuple[int, ...]
    state: str  # in-sync | pending | held | suspended | removing | problem | unreachable
    detail: str = ""
    last_rollout: Rollout | None = None
    # The model answers by streams (decoupled), as its live config says (the repository's
    # and the manifest's before it is loaded).
    streaming: bool = False


@dataclass(frozen=True)
class Condition:
    """One Kubernetes-style condition of a ModelDeployment (metav1.Condition's fields)."""

    type: str  # Ready | Reconciling | Stalled
    status: str  # True | False | Unknown
    reason: str  # PascalCase: RolloutSucceeded, Progressing, Held, ...
    message: str
    last_transition_time: str  # RFC 3339, UTC: when ``status`` last changed


@dataclass(frozen=True)
class StatusReport:
    revision: str
    last_applied: str | None
    models: tuple[ModelStatus, ...]
    unreachable: Mapping[str, str]  # server -> why
    last_pass: Mapping[str, object] | None
    # Router -> how it routes now ("canary 0%, stable 100%"), or why it could not be read.
    routes: Mapping[str, str] = field(default_factory=dict)
    # ModelDeployment -> its Ready, Reconciling and Stalled conditions
    conditions: Mapping[str, tuple[Condition, ...]] = field(default_factory=dict)
    # Servers are declared and not one of them answered (``status`` exits 3).
    no_server_reached: bool = False
    # The manifests at ``revision`` do not validate: each problem; the rows are then what
    # the last applied revision declares (``declared_at``), as Argo CD shows an application
    # whose source cannot be read with a condition saying so.
    invalid: tuple[Problem, ...] = ()
    declared_at: str | None = None

    def narrowed(self, model: str | None, server: str | None) -> StatusReport:
        """Only this model's and this server's rows (None: all), with the conditions of the
        deployments left and the unreachable servers among them. A server's name also
        selects its discovered instances (``<server>/<address>``)."""

        def on(name: str) -> bool:
            return server is None or name == server or name.startswith(f"{server}/")

        rows = tuple(m for m in self.models if on(m.server) and model in (None, m.model))
        kept = {m.deployment for m in rows}
        return replace(
            self,
            models=rows,
            unreachable={s: why for s, why in self.unreachable.items() if on(s)},
            conditions={d: c for d, c in self.conditions.items() if d in kept},
        )
