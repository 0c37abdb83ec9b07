"""What the reconciler remembers between passes: holds, staged
rollouts in progress, managed models, past rollouts, applied specs and alert events.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


@dataclass(frozen=True)
class Hold:
    """A ModelDeployment whose spec failed its rollout: kept at what served before.

    It lasts until a commit changes the ModelDeployment (its fingerprint).
    """

    deployment: str
    fingerprint: str
    revision: str
    reason: str
    previous: Mapping[str, tuple[int, ...]]  # server -> versions it served before
    configs: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)


ALL_DEPLOYMENTS = "*"  # a suspension of every ModelDeployment (``triton-gitops suspend``)


@dataclass(frozen=True)
class Suspension:
    """Reconciling paused by an operator (``suspend``), without a commit: it lasts until
    ``resume``, whatever the manifests say."""

    target: str  # a ModelDeployment's name, or ALL_DEPLOYMENTS
    by: str  # who asked: the token's name, or the local user of a one-shot command
    at: str  # when, RFC 3339 (UTC)
    reason: str = ""

    def __str__(self) -> str:
        what = "every ModelDeployment" if self.target == ALL_DEPLOYMENTS else self.target
        text = f"{what} suspended by {self.by} at {self.at}"
        return f"{text}: {self.reason}" if self.reason else text


@dataclass(frozen=True)
class OperatorAction:
    """One on-call verb as history keeps it: what was asked, on what, by whom, when."""

    at: str  # RFC 3339 (UTC)
    verb: str  # suspend | resume | retry | ...
    target: str
    by: str
    detail: str = ""


class OrderKind(StrEnum):
    """What an operator told a rollout in progress to do (``abort`` / ``promote``)."""

    ABORT = "abort"  # stop now: the old versions back, the spec held, an alert
    PROMOTE = "promote"  # end the analyses running now as passed
    PROMOTE_FULL = "promote-full"  # ... and skip every analysis left in this rollout


@dataclass(frozen=True)
class OperatorOrder:
    """An order to a rollout in progress, as the state store keeps it until the pass ends.
    It applies to a rollout that was running when it was given (``at_epoch``, wall clock):
    never to one started later, so an order that came too late ends with nothing."""

    kind: OrderKind
    deployment: str
    by: str
    at: str  # RFC 3339 (UTC), what operators read
    at_epoch: float  # the same moment, compared with when a rollout or analysis started
    reason: str = ""

    def __str__(self) -> str:
        text = f"{self.kind} by {self.by} at {self.at}"
        return f"{text}: {self.reason}" if self.reason else text


@dataclass(frozen=True)
class StagedRecord:
    """How far a staged rollout got before the reconciler stopped."""

    fingerprint: str
    completed: frozenset[str]  # servers whose stage passed: new versions verified, analysed
    started: Mapping[str, tuple[int, ...]]  # servers of the stage in progress: what served
    revision: str = ""  # the revision the interrupted pass was applying


@dataclass(frozen=True)
class History:
    """What the state store remembers: the last applied revision, the models it placed, holds."""

    revision: str | None = None
    managed: Mapping[str, frozenset[str]] = field(default_factory=dict)
    holds: Mapping[str, Hold] = field(default_factory=dict)
    backends: Mapping[str, str] = field(default_factory=dict)  # deployment -> applied revision
    # Staged rollouts a previous pass began and did not finish (the reconciler stopped).
    staged: Mapping[str, StagedRecord] = field(default_factory=dict)
    footprints: Mapping[tuple[str, str], float] = field(default_factory=dict)  # bytes/version
    # Operators' suspensions, by target (a deployment's name, or ALL_DEPLOYMENTS).
    suspended: Mapping[str, Suspension] = field(default_factory=dict)
    # (ModelDeployment, condition type) -> (its status, RFC 3339 time that status began)
    transitions: Mapping[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    # When the latest pass on record ended (wall clock); None before the first one.
    last_pass_at: float | None = None

    def began_from(self, deployment: str, fingerprint: str, server: str) -> tuple[int, ...] | None:
        """What ``server`` served when a pass began rolling out this spec (``fingerprint``)
        there and was stopped (its in-flight record); None when no such record names it."""
        record = self.staged.get(deployment)
        if record is None or record.fingerprint != fingerprint:
            return None
        return record.started.get(server)

    def suspension_of(self, deployment: str) -> Suspension | None:
        """What keeps ``deployment`` from being reconciled, if an operator suspended it (or
        everything)."""
        return self.suspended.get(deployment) or self.suspended.get(ALL_DEPLOYMENTS)


@dataclass(frozen=True)
class Held:
    """A (server, model) kept at its previous versions by a hold, for the plan's report."""

    server: str
    model: str
    deployment: str
    revision: str
    reason: str
    versions: tuple[int, ...]


@dataclass(frozen=True)
class Rollout:
    revision: str
    deployment: str
    server: str
    model: str
    from_versions: tuple[int, ...]
    to_versions: tuple[int, ...]
    outcome: str  # converged | reverted | failed | skipped
    verdict: str | None  # the analysis verdict, where one ran
    checks: tuple[Mapping[str, Any], ...]  # the last evaluation's check results
    error: str | None
    rollback_seconds: float | None
    finished_at: float  # wall-clock seconds since the epoch


@dataclass(frozen=True)
class AppliedSpec:
    """The versions and config a ModelDeployment last converged to everywhere it is placed:
    what a revert write-back restores."""

    deployment: str
    revision: str
    fingerprint: str
    versions: tuple[int, ...]
    config: Mapping[str, Any]
    backend: str | None = None  # the backend library revision it runs on, if declared


KINDS = (
    "rollout-failed",
    "load-failed",
    "validation-failed",
    "rollout-succeeded",
    "unload-failed",
    "revision-refused",
    "state-mismatch",
    "artifact-mismatch",
    "no-headroom",
    "drain-timeout",
    "dependency",
    "interface-change",
    "stopped-answering",
    "unload-stuck",
)


@dataclass(frozen=True)
class AlertEvent:
    """One thing to tell people about a revision; ``kind`` is one of ``KINDS``."""

    kind: str
    severity: str  # critical | warning | info
    summary: str
    revision: str
    model: str | None = None
    server: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)
    resolved: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown alert kind {self.kind!r}; one of {', '.join(KINDS)}")

    @property
    def identity(self) -> tuple[str, str, str, bool]:
        """Which rollout's failure (or resolution) this is: the alert outbox keeps one event
        per identity, so the pass's record replaces what its journal wrote at the failure."""
        return (self.model or "", self.server or "", self.revision, self.resolved)


@dataclass(frozen=True)
class PassRecord:
    """Everything one pass learned, written to the state store in one transaction."""

    revision: str
    # server -> the models it counts as ours now (only the servers whose set changed)
    managed: Mapping[str, frozenset[str]]
    ok: bool
    summary: Mapping[str, Any]  # what the pass did, as JSON (the ``passes`` table)
    rollouts: tuple[Rollout, ...] = ()
    holds: tuple[Hold, ...] = ()
    released: tuple[str, ...] = ()  # deployments whose hold is lifted
    applied: tuple[AppliedSpec, ...] = ()
    footprints: Mapping[tuple[str, str], float] = field(default_factory=dict)
    alerts_opened: tuple[tuple[str, str, str], ...] = ()  # (model, server, kind)
    alerts_resolved: tuple[tuple[str, str], ...] = ()  # (model, server)
    # The failure alerts opened and resolved, to send: written with the record (the alert
    # outbox) and sent by the alert phase, so a kill between the two loses none of them.
    outbox: tuple[AlertEvent, ...] = ()
    # Events the journal put in the outbox that the pass's outcome does not confirm.
    outbox_withdrawn: tuple[tuple[str, str, str, bool], ...] = ()
    stages_ended: tuple[str, ...] = ()  # staged rollouts whose record goes
    # (ModelDeployment, condition type) -> (status, since): every declared deployment's
    # conditions after the pass; replaces what was remembered
    transitions: Mapping[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
