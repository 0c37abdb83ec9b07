"""The small Protocols the pass and the executor are given: what they need of
Triton, of metrics, and of the other adapters. ``adapters/`` holds the real ones, the tests
plain fakes; ``wiring`` builds the real ``Ports`` value that ``loop.reconcile`` is given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from reconciler.core.exchange import MAX_RESPONSES, Reply
from reconciler.model.analysis import Evaluation, Figures, PoolFigures
from reconciler.model.gate import LoadFigures
from reconciler.model.history import (
    AlertEvent,
    AppliedSpec,
    History,
    Hold,
    OperatorAction,
    OperatorOrder,
    OrderKind,
    PassRecord,
    Rollout,
    Suspension,
)
from reconciler.model.plan import Exchange, Step
from reconciler.model.results import Draining
from reconciler.model.servers import TritonServer
from reconciler.model.serving import DeviceMemory, ModelInterface, ModelState, ServerState
from reconciler.model.shadow import ShadowFigures, ShadowTarget
from reconciler.model.source import (
    CommitVerdict,
    PushedRevert,
    RevertEdit,
    Revision,
    SignaturePolicy,
)
from reconciler.model.spec import Tensor
from reconciler.model.traffic import RouterSpec, RouteState


class ModelControl(Protocol):
    """What apply needs from one Triton server (``adapters/triton.py`` is the real one)."""

    def load(self, model: str, config: Mapping[str, Any]) -> None: ...

    def unload(self, model: str) -> None: ...

    def model_state(self, model: str) -> ModelState: ...

    def infer(
        self,
        model: str,
        version: int,
        inputs: tuple[Tensor, ...],
        outputs: tuple[str, ...],
        timeout: float | None = None,
    ) -> dict[str, npt.NDArray[np.generic]]:
        """The answer of ``version``; VerifyFailed when the server answers with an error or,
        with a ``timeout``, does not answer within it."""
        ...

    def stream(
        self,
        model: str,
        version: int,
        inputs: tuple[Tensor, ...],
        outputs: tuple[str, ...],
        timeout: float | None = None,
        max_responses: int = MAX_RESPONSES,
    ) -> Reply:
        """The responses of ``version`` (a model that streams) to one request over a gRPC
        stream, until Triton's final flag; VerifyFailed when an error arrives inside the
        stream, the stream ends without its final flag, or more than ``max_responses``
        come; ProbeTimedOut when the final flag has not come by ``timeout``."""
        ...

    def sequence(
        self,
        model: str,
        version: int,
        inputs: tuple[Tensor, ...],
        outputs: tuple[str, ...],
        requests: int,
        timeout: float | None = None,
    ) -> Reply:
        """The answers of ``version`` (a sequence model) to ``requests`` requests of
        ``inputs`` sent one after another as one sequence under a fresh correlation ID (START
        on the first, END on the last), timed from the first; VerifyFailed when one is
        answered with an error, ProbeTimedOut when one has no answer by ``timeout``."""
        ...

    def interface(self, model: str, version: int) -> ModelInterface: ...

    def memory_usage(self, model: str) -> dict[int, tuple[DeviceMemory, ...]]:
        """What each loaded version of ``model`` holds per device as Triton's statistics
        report it (a version whose backend reports nothing holds an empty tuple)."""
        ...


# -- the pass's ports (``loop``): what one reconcile pass is given -----------------------------
#
# Each Protocol has only the methods the pass (and the journal it writes) really calls; the
# real implementations are in ``adapters/`` and ``wiring.ports`` puts them together.


class ManifestSource(Protocol):
    """The manifest repository, commits named by their sha (``adapters.git.GitManifests``)."""

    # The repository as messages and the state store name it: its URL without credentials,
    # a local path made absolute.
    location: str

    def fetch(self, ref: str) -> str:
        """Bring the mirror up to date and resolve ``ref``: the commit's full sha."""
        ...

    def read(self, revision: str, path: str) -> Revision: ...

    def read_file(self, revision: str, path: str) -> bytes | None: ...

    def close(self) -> None:
        """End what it keeps open between calls (the mirror's git processes)."""
        ...


class CommitChecks(Protocol):
    """What the approval phase asks of the mirror (``adapters.git.GitManifests``)."""

    def is_fast_forward(self, old: str, new: str) -> bool: ...

    def has_commit(self, sha: str) -> bool:
        """Whether the mirror holds the commit ``sha``."""
        ...

    def signature_verdicts(
        self, trusted_keys: Path, policy: SignaturePolicy, old: str | None, new: str
    ) -> list[CommitVerdict]: ...

    def approvals(self, revision: str, trailer: str) -> list[str]: ...


class StateStore(Protocol):
    """The pass's record (``adapters.state.StateStore``), opened once per pass."""

    def history(self) -> History: ...

    def last_pass(self) -> dict[str, Any] | None: ...

    def bound_source(self) -> tuple[str, str] | None: ...

    def bind_source(self, repo: str, path: str) -> None: ...

    def applied_spec(self, deployment: str) -> AppliedSpec | None: ...

    def rollouts(self, model: str | None = None, limit: int = 100) -> list[Rollout]: ...

    def open_alerts(self) -> set[tuple[str, str, str]]: ...

    def undelivered_alerts(self) -> dict[str, list[Any]]: ...

    def save_undelivered_alerts(self, backlogs: Mapping[str, list[Any]]) -> None: ...

    def alert_outbox(self) -> dict[tuple[str, str, str, bool], AlertEvent]: ...

    def alerts_handed_over(
        self, sent: Iterable[tuple[str, str, str, bool]], backlogs: Mapping[str, list[Any]]
    ) -> None: ...

    def record_stage(
        self,
        deployment: str,
        fingerprint: str,
        revision: str,
        completed: Iterable[str],
        started: Mapping[str, tuple[int, ...]],
    ) -> None: ...

    def record_hold(
        self, hold: Hold, rollout: Rollout | None = None, alert: AlertEvent | None = None
    ) -> None: ...

    def record_reverted(self, deployments: Iterable[str], note: str) -> None: ...

    def unreverted(self) -> set[str]: ...

    def record_pass(self, record: PassRecord) -> None: ...

    def record_action(
        self, verb: str, target: str, by: str, detail: str = ""
    ) -> OperatorAction: ...

    def orders(self, deployment: str, since: float) -> list[OperatorOrder]: ...

    def record_live(self, snapshot: Mapping[str, Any] | None) -> None: ...

    def close(self) -> None: ...


class OnCallRecord(Protocol):
    """What the on-call verbs (``loop.on_call``) read and write: the state store the passes
    read, opened by ``wiring.state_store``."""

    def history(self) -> History: ...

    def applied_deployments(self) -> list[str]: ...

    def operator_actions(
        self, target: str | None = None, limit: int = 100
    ) -> list[OperatorAction]: ...

    def suspend(self, target: str, by: str, reason: str = "") -> Suspension: ...

    def resume(self, target: str, by: str) -> Suspension | None: ...

    def suspensions(self) -> list[Suspension]: ...

    def retry(self, deployment: str, by: str) -> Hold | None: ...

    def give_order(
        self, kind: OrderKind, deployment: str, by: str, reason: str = ""
    ) -> OperatorOrder | None: ...

    def in_progress(self) -> set[str]: ...

    def record_action(
        self, verb: str, target: str, by: str, detail: str = ""
    ) -> OperatorAction: ...


class DeliveryRecord(Protocol):
    """The webhook deliveries the service has seen, kept in the state store so that a replay
    is refused across a restart (``service.webhooks``)."""

    def seen_deliveries(self, since: float, limit: int) -> list[tuple[str, float]]: ...

    def remember_deliveries(
        self, keys: Iterable[str], at: float, since: float, limit: int
    ) -> None: ...

    def close(self) -> None: ...


class RotatingSecrets(Protocol):
    """The service's secrets as their mounted files say now, re-read when a file changes (a
    rotated Kubernetes Secret): ``adapters.secret_files.SecretFiles``."""

    def current(self) -> dict[str, Any]: ...


class StepEvents(Protocol):
    """What apply tells as it runs, besides each step's result (``model.results.Progress``):
    for ``status --watch``, ``GET /status`` and ``apply``'s lines on a terminal. Called from
    apply's worker threads."""

    def started(self, step: Step, reverting: bool) -> None: ...

    def evaluated(self, step: Step, evaluation: Evaluation, seconds_left: float) -> None: ...

    def routed(self, router: str, weights: Mapping[str, int], mirror: Mapping[str, int]) -> None:
        """A router now routes by ``weights`` and mirrors ``mirror`` (shares out of
        ``model.traffic.WEIGHT_SCALE``)."""

    def draining(self, step: Step, draining: Draining) -> None:
        """A drain step's reading: what still reaches the model, and how long it may wait."""


class OperatorOrders(Protocol):
    """The orders operators gave rollouts in progress (``abort``, ``promote``), read while
    apply runs; the state store keeps them."""

    def orders(self, deployment: str, since: float) -> list[OperatorOrder]: ...


class TritonClient(ModelControl, Protocol):
    """One Triton server as the pass uses it: what apply needs, plus the observation."""

    def observe(self, models: Iterable[str]) -> ServerState: ...

    def server_version(self) -> str: ...

    def explicit_model_control(self) -> bool: ...

    def close(self) -> None: ...


class Alerts(Protocol):
    """Where a pass sends its alert events (``adapters.alerts.FanOut``), one per pass: what a
    receiver did not take is kept in the state store and restored by the next pass."""

    def send(self, event: AlertEvent) -> None: ...

    def restore(self, backlogs: Mapping[str, list[Any]]) -> None: ...

    def backlog(self) -> dict[str, list[Any]]: ...

    def flush(self) -> bool: ...


class RevertWriter(Protocol):
    """The revert write-back to Git (``adapters.git.GitWriter``)."""

    def tracked_branch(self, ref: str) -> str: ...

    def push_revert(
        self,
        branch: str,
        edits: tuple[RevertEdit, ...],
        message: str,
        target_branch: str | None = None,
        attempts: int = 5,
        reverted: str | None = None,
    ) -> PushedRevert | None: ...


class Resolver(Protocol):
    """DNS names of discovered servers to addresses (``adapters.discovery``)."""

    def resolve(self, name: str) -> list[str]: ...


class VersionDigests(Protocol):
    """The digests of pinned version folders in a readable model repository
    (``adapters.artifacts.version_digests``)."""

    def __call__(
        self, repository: str, model: str, versions: Iterable[int]
    ) -> dict[int, str | None]: ...


class PassHooks(Protocol):
    """An observer of the pass: told when each named phase starts and how long it took
    (benchmarks time the pass through it; ``NoPassHooks`` is the default)."""

    def phase_started(self, phase: str) -> None: ...

    def phase_ended(self, phase: str, seconds: float) -> None: ...


class NoPassHooks:
    """A ``PassHooks`` that does nothing."""

    def phase_started(self, phase: str) -> None:
        pass

    def phase_ended(self, phase: str, seconds: float) -> None:
        pass


@dataclass(frozen=True)
class Ports:
    """Everything outside that one pass reaches, as one value (``wiring.ports`` builds it).

    The state store and the alerter are opened once per pass (``open_state`` to apply,
    ``read_state`` to plan or show status: never created nor written), clients and metric
    readers made per server; the rest is used as is.
    """

    manifests: ManifestSource
    approval: CommitChecks
    open_state: Callable[[], StateStore]
    read_state: Callable[[], StateStore]
    open_alerts: Callable[[], Alerts]
    triton: Callable[[TritonServer], TritonClient]
    metrics: Callable[[TritonServer], FiguresSource | None]
    reverts: RevertWriter
    resolver: Resolver
    digests: VersionDigests
    hooks: PassHooks = field(default_factory=NoPassHooks)
    # Step webhooks and the replaceLibrary command (none: a step that needs one fails).
    step_hooks: StepHooks | None = None
    # A client per Router manifest (none given: a manifest that declares one is refused).
    routers: Callable[[RouterSpec], TrafficRouter] | None = None
    # Where routers mirror live shadow traffic (--comparator-listen); none: a shadow phase
    # fails, saying so, and the old versions keep serving.
    comparator: Comparator | None = None

    def close(self) -> None:
        """End what the adapters keep open from call to call (the manifest mirror's git
        processes); whoever built the ports closes them when its pass is done."""
        self.manifests.close()

    def __enter__(self) -> Ports:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class ShadowComparison(Protocol):
    """One shadow phase's comparison as the analysis reads it and the engine ends it
    (``adapters/comparator.py``'s ``ShadowSession``)."""

    target: ShadowTarget  # what it compares, and how (``target.spec``)

    def figures(self) -> ShadowFigures:
        """What was compared so far (cumulative since ``Comparator.begin``)."""
        ...

    def end(self) -> None:
        """Stop comparing (the router mirrors nothing to it any more)."""
        ...


class Comparator(Protocol):
    """Where a router mirrors live requests for a shadow phase (``LiveComparator``)."""

    def begin(self, target: ShadowTarget) -> ShadowComparison:
        """Compare ``target``'s mirrored requests from now on; ComparatorError (a
        RuntimeError) when it cannot listen."""
        ...


class TrafficRouter(Protocol):
    """One router in front of Triton pools, as the pass and the executor use it
    (``adapters/envoy.py``'s ``EnvoyRouter``, ``adapters/gateway.py``'s ``GatewayRouter``).
    Shares are out of ``model.traffic.WEIGHT_SCALE``."""

    def observe(self) -> RouteState:
        """The weights and mirror shares it routes by now; unreachable is data (never
        raises)."""
        ...

    def route(self, weights: Mapping[str, int], mirror: Mapping[str, int]) -> str | None:
        """Route by ``weights`` (every pool of the route named) and mirror ``mirror``'s
        shares, in one update, without dropping a request; the identity of the router that
        took the update (see ``identity``), None when this kind of router has none;
        RouterUnavailable when the router does not take it."""
        ...

    def keep_affinity(self) -> None:
        """Write the router's declared sequence affinity configuration back where it
        drifted (``RouteState.affinity_drift``); RouterUnavailable when it cannot."""
        ...

    def identity(self) -> str | None:
        """Which running router answers now: what ``route`` returned as long as the router
        that took that update still holds it, something else once it restarted (or another
        writer routed since); None when this kind of router has none, and then no identity
        check applies. RouterUnavailable when it does not answer."""
        ...

    def figures(self, pools: Iterable[str]) -> Mapping[str, PoolFigures] | None:
        """Each pool's cumulative statistics as the router saw them; None when this kind
        of router reports none; RouterUnavailable when it does not answer."""
        ...

    def close(self) -> None: ...


class FiguresSource(Protocol):
    """Where an analyze step reads metrics (``adapters/metrics.py`` has the real ones)."""

    def figures(
        self, model: str, versions: tuple[int, ...], queries: Mapping[str, str] = ...
    ) -> Figures: ...


# -- the executor's calls outside Triton (engine/) ------------------------------------------


class StepHooks(Protocol):
    """What a change calls outside Triton: the webhooks around its steps (the drain webhook,
    a staged rollout's preStep/postStep) and a backend's replaceLibrary (its command, then
    its webhook). ``adapters/hooks.py``'s ``HttpStepHooks`` is the real one; given to
    ``engine.apply.apply`` by its caller. Each call raises StepFailed when the other side
    says no or does not answer."""

    def call_webhook(self, url: str, payload: Mapping[str, Any]) -> None: ...

    def replace_library(self, step: Step) -> None: ...


# -- the pre-merge gate's isolated server (loop/gate.py) ------------------------------------


class LoadTester(Protocol):
    """Drives one version of a model with the same requests at one concurrency level:
    ``adapters/triton_load.py`` (built in, gRPC) and ``adapters/perf_analyzer.py`` (Triton's
    own load generator) are the real ones, and ``adapters/aiperf.py`` (AIPerf, streaming
    models only, over Triton's HTTP generate_stream: the gate's ``stream_load_tester``)."""

    name: str  # built-in | perf_analyzer | aiperf

    def measure(
        self,
        model: str,
        version: int,
        requests: Sequence[tuple[Tensor, ...]],
        outputs: tuple[str, ...],
        concurrency: int,
        count: int,
        batched: bool = False,
        *,
        exchange: Exchange = Exchange.UNARY,
    ) -> LoadFigures:
        """``count`` requests (the given ones, round robin), ``concurrency`` at a time, after
        a short warm-up; failures are counted, never raised. ``batched``: the model's config
        has a batch dimension (the requests' first dimension). ``exchange``: how the model
        is asked (``model.plan.Exchange``). STREAM: it is decoupled; each request is one
        stream (gRPC; AIPerf's: HTTP server-sent events), read to Triton's final flag, and
        its latency the time to the first response. SEQUENCE: it keeps state per sequence;
        each concurrent worker sends its requests as sequences of its own (START ... END),
        each request timed and counted as one."""
        ...


class MemoryGauge(Protocol):
    """What the isolated server's memory reads (``adapters/local_triton.LocalTriton``)."""

    def version_memory(self, model: str, version: int) -> int | None:
        """Bytes held by the processes that run only this version (Python-backend stubs);
        None when the backend runs inside the server."""
        ...

    def server_memory(self) -> int | None: ...


# -- the service's watch between passes (service/connections.py) ---------------------------


class ServerConnection(Protocol):
    """The watch's connection to one Triton server, kept from one reading of its index to
    the next (``adapters/triton.py``). A server that restarts drops every connection to it
    as its old process ends, before the new one has loaded anything: what the serving board
    (service/serving.py) hears of a restart at once, between readings."""

    def version_states(self) -> dict[str, dict[int, str]]:
        """Per model in the repository index, each version's state; ServerUnavailable or
        StepFailed when it cannot be read."""
        ...

    def connected(self) -> bool:
        """Whether the connection is up now, asked of the client library without a call."""
        ...

    def when_dropped(self, dropped: Callable[[], None]) -> None:
        """Call ``dropped`` (on a thread of the client library) each time an established
        connection goes down: the server ended, restarted or closed it."""
        ...

    def close(self) -> None: ...


# -- one reconciler at a time (apply and undo in cli/, service/daemon.py) ------------------


@dataclass(frozen=True)
class LockHolder:
    """Who holds the reconciler lock: enough for a refusal to name it."""

    pid: int
    command: str  # apply, run, undo
    since: str  # RFC 3339
    host: str

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.command}) on {self.host} since {self.since}"


class ReconcilerLock(Protocol):
    """The one lock every command that changes anything holds while it runs, so that a
    one-shot ``apply`` never runs beside ``run`` on the same state store and Git mirror.
    ``adapters/reconciler_lock.py``'s ``StateLockFile`` (a file next to the state store) and
    ``adapters/leader_lease.py``'s ``LeaderLease`` (a Kubernetes Lease, for several replicas)
    are the real ones."""

    where: str  # the lock file or the Lease, for messages

    def acquire(self, timeout: float) -> bool:
        """Take the lock, waiting at most ``timeout`` seconds; False when another still
        holds it then."""
        ...

    def release(self) -> None: ...

    def holder(self) -> LockHolder | None:
        """Who holds it now (None: nobody)."""
        ...

    def held(self) -> bool:
        """Still ours: False once lost (a Lease that could not be renewed)."""
        ...
