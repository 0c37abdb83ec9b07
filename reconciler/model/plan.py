"""The Plan: changes per server and model, each an ordered list of steps
with the reason for each. Made by ``core/plan``, executed by ``engine``, shown by ``views``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from reconciler.model.analysis import AnalysisSpec
from reconciler.model.history import Held
from reconciler.model.spec import BackendSpec, SequencePolicy, ShadowSpec, SmokeCase
from reconciler.model.traffic import RouteUpdate, TrafficPlan


class Action(StrEnum):
    DRAIN = "drain"  # wait until the model is idle on this server (sequence models)
    UNLOAD = "unload"
    REPLACE_LIBRARY = "replace-library"  # a new backend shared library reaches the host
    LOAD = "load"
    VERIFY = "verify"
    ANALYZE = "analyze"
    # A traffic rollout's router update (a phase's weights and mirror shares, the switch
    # back, the final route): planned in RolloutPlan.traffic, shown in results like a step.
    ROUTE = "route"
    # In results only, never planned: the staged rollout failed elsewhere (another server's
    # step, a step webhook, shutdown) and took this server back with it.
    ROLLOUT = "rollout"


class Exchange(StrEnum):
    """The shape of one exchange with a model version, as its config says (the probes, the
    smoke cases, the synthesized request and the replay send every one through
    ``engine/exchange.ask``, and judge what came back alike)."""

    UNARY = "unary"  # one request, one answer
    # One request over a gRPC stream, responses until Triton's final flag (a decoupled model).
    STREAM = "stream"
    # A whole sequence under a fresh correlation ID, START to END, one request after another
    # (a model with sequence_batching refuses a request that names no sequence).
    SEQUENCE = "sequence"

    @staticmethod
    def of(streaming: bool, sequence: bool) -> Exchange:
        """A model that streams is asked by a stream (a decoupled sequence model too: one
        stream per question); one that keeps state per sequence, by a whole sequence; any
        other, by one call."""
        if streaming:
            return Exchange.STREAM
        return Exchange.SEQUENCE if sequence else Exchange.UNARY


class OnFailure(StrEnum):
    """What the change does when this step fails: planned, so apply only reads it."""

    # Put the model back as it served before the change (its ``revert`` steps).
    REVERT = "revert"
    # Stop the change where it is, nothing put back: the old versions still serve (a drain
    # that timed out touched nothing), or the new ones do (only the old versions' unload is
    # left; the next pass retries it).
    STOP = "stop"


@dataclass(frozen=True)
class Step:
    server: str
    model: str
    action: Action
    # load: the version policy loaded; verify: the versions that must be READY;
    # unload: the versions kept (empty: the whole model is unloaded).
    versions: tuple[int, ...]
    reason: str
    config: Mapping[str, Any] | None = None  # the whole config sent with a load
    smoke: tuple[SmokeCase, ...] = ()
    smoke_versions: tuple[int, ...] = ()
    dropped: tuple[int, ...] = ()  # unload: the versions that go
    timeout: float = 120.0
    analysis: AnalysisSpec | None = None  # analyze: what to watch, how long
    baseline: tuple[int, ...] = ()  # analyze: the old versions the new are compared with
    drain: SequencePolicy | None = None  # drain: webhook, idle window, timeout
    backend: BackendSpec | None = None  # replace-library: what to put in place
    interface_check: bool = False  # verify: new versions must keep the old interface
    shadow: ShadowSpec | None = None  # verify: replay recorded requests on old and new
    shadow_against: int | None = None  # verify: the old version the replay compares with
    # verify: the old version a request synthesized from the inputs is tried on first; the
    # new versions must answer it if it does
    probe_against: int | None = None
    # verify, analyze: the model answers by streams (its config's model_transaction_policy
    # decoupled): smoke cases, the synthesized request and the probes are sent as gRPC
    # streams, never as unary calls (which Triton refuses for it).
    streaming: bool = False
    # verify, analyze: the model keeps state per sequence (sequence_batching): smoke cases,
    # the synthesized request and the probes are each sent as a whole sequence of their own.
    sequence: bool = False
    # analyze: probes sent to the old version before the new ones load, while it still
    # carries the clients' streams: the baseline of a streaming model's time to the first
    # response once the new versions carry them instead (``core.latency.loaded_baseline``).
    old_under_load: int = 0
    until_unavailable: bool = False  # unload: wait until the model is fully gone
    # unload before a load for want of room: bytes the server's memory figure must show free
    # (the old versions' memory given back) before the step is done; None: the index alone.
    needs_free: float | None = None
    dependents: tuple[str, ...] = ()  # unload: models that go with it (ensembles)
    # drain, in a revert: waits only when what stopped the rollout tells nothing against the
    # new versions (a router restarted, metrics unreadable, the old pool's drain timed out):
    # the sequences in flight on them then end there first. When they failed (their
    # analysis, an operator's abort) or shutdown began, those sequences are cut, and the
    # step reads what still reached them (``model.results.Cut``) and goes on.
    unless_failed: bool = False
    on_failure: OnFailure = OnFailure.REVERT
    router: str | None = None  # route: the Router manifest whose route the step sets

    @property
    def exchange(self) -> Exchange:
        """How each question to the model is sent (``Exchange``)."""
        return Exchange.of(self.streaming, self.sequence)


@dataclass(frozen=True)
class ModelChange:
    """Everything one model on one server goes through, in order."""

    server: str
    model: str
    deployment: str | None  # None when the model is being removed
    serving: tuple[int, ...]  # READY before the change
    desired: tuple[int, ...]  # empty when the model is being removed
    steps: tuple[Step, ...]
    # Run when a load or verify step fails: back to ``serving`` (which never stopped serving).
    revert: tuple[Step, ...] = ()
    # Changes with the same key never run at once (one server of a pool at a time).
    exclusive: str | None = None
    interface_baseline: int | None = None  # the old version whose interface new ones keep
    # A staged rollout's change only: the finish to run instead of the planned one (the steps
    # after the stages) when the server is found to have lost every version of the model
    # after its stage passed (restarted: EXPLICIT mode starts empty). Empty: none planned.
    restarted_finish: tuple[Step, ...] = ()
    # A reload in place (core/plan/heal.py): the versions that stopped answering.
    heals: tuple[int, ...] = ()
    # The model's config changes: its serving versions load again with the new one (Triton's
    # config is the model's, not a version's).
    reconfigured: bool = False


@dataclass(frozen=True)
class PlanProblem:
    """Something that stops one model (or one whole server) from being planned."""

    server: str
    model: str | None
    message: str
    # problem | artifact-mismatch | no-headroom | dependency | interface-change
    kind: str = "problem"

    def __str__(self) -> str:
        where = f"server {self.server}" + (f", model {self.model}" if self.model else "")
        return f"{where}: {self.message}"


@dataclass(frozen=True)
class RolloutPlan:
    """One ModelDeployment's change moving through its servers in stages: preview servers
    first, then production steps. Old versions are unloaded only after the last stage."""

    deployment: str
    model: str
    fingerprint: str
    stages: tuple[tuple[str, ...], ...]  # server names, stage by stage
    stage_names: tuple[str, ...]  # "preview", "step 1 of 3", ...
    max_parallel: tuple[int, ...]  # per stage
    pre_step: str | None = None
    post_step: str | None = None
    # Per stage: the servers whose old versions pool into the stage's latency baseline (the
    # production servers of later stages, still on the old versions, as a canary's baseline).
    # Empty for a stage: each server compares with its own old versions.
    baselines: tuple[tuple[str, ...], ...] = ()
    # Traffic moved through a router (``rollout.traffic``): the stages are then the new
    # pool's servers and the old pool's, with the route's phases between them.
    traffic: TrafficPlan | None = None
    # A traffic rollout: per server of the new pool, the analysis each phase runs.
    analyses: tuple[Step, ...] = ()


@dataclass(frozen=True)
class Plan:
    revision: str
    changes: tuple[ModelChange, ...] = ()
    problems: tuple[PlanProblem, ...] = ()
    in_sync: tuple[tuple[str, str], ...] = ()  # (server, model) pairs that already match
    held: tuple[Held, ...] = ()
    suspended: tuple[tuple[str, str], ...] = ()  # (server, model) left alone: spec.suspend
    rollouts: tuple[RolloutPlan, ...] = ()  # staged changes, coordinated across servers
    # Routers put back to their steady route before anything else (drift: a restarted
    # Envoy, a hand edit, a rollout cut short).
    routes: tuple[RouteUpdate, ...] = ()

    @property
    def steps(self) -> tuple[Step, ...]:
        return tuple(step for change in self.changes for step in change.steps)

    @property
    def has_changes(self) -> bool:
        return bool(self.changes or self.routes)
