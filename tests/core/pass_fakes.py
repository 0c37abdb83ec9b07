"""Plain fakes of the pass's ports (``reconciler.ports``), for ``tests/core/test_loop.py``:
a manifest repository in memory, a state store in memory, an alerter, a revert writer, a
resolver, a phase recorder, and ``FakeTriton`` (``tests/core/fakes.py``) as a client.
``World`` holds one of each and gives the ``Ports`` a pass is run with. No Git, no Triton,
no SQLite.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reconciler.model.errors import DiscoveryFailed, SourceUnavailable
from reconciler.model.history import (
    AlertEvent,
    AppliedSpec,
    History,
    Hold,
    OperatorAction,
    OperatorOrder,
    PassRecord,
    Rollout,
    StagedRecord,
)
from reconciler.model.servers import TritonServer
from reconciler.model.serving import ServerState
from reconciler.model.source import (
    CommitVerdict,
    PushedRevert,
    RevertEdit,
    Revision,
    SignaturePolicy,
)
from reconciler.ports import Ports
from tests.core.fakes import FakeTriton, observe


def server_yaml(name: str) -> str:
    return (
        "apiVersion: triton-gitops/v1alpha1\nkind: TritonServer\n"
        f"metadata:\n  name: {name}\nspec:\n  grpc: {name}:8001\n  modelRepository: /models\n"
    )


def pool_yaml(name: str, dns: str) -> str:
    return (
        "apiVersion: triton-gitops/v1alpha1\nkind: TritonServer\n"
        f"metadata:\n  name: {name}\nspec:\n  discovery: {{dns: {dns}, grpcPort: 8001}}\n"
        "  modelRepository: /models\n"
    )


def deployment_yaml(name: str, versions: Iterable[int], servers: Iterable[str]) -> str:
    return (
        "apiVersion: triton-gitops/v1alpha1\nkind: ModelDeployment\n"
        f"metadata:\n  name: {name}\nspec:\n"
        f"  servers:\n    names: [{', '.join(servers)}]\n"
        f"  versions: [{', '.join(map(str, versions))}]\n"
    )


class FakeManifests:
    """A manifest repository in memory: ``commit`` a set of files, the head moves there.
    Also the mirror's commit checks (fast-forward, signatures, trailers)."""

    location = "fake://manifests"

    def __init__(self) -> None:
        self.revisions: dict[str, dict[str, bytes]] = {}
        self.head = ""
        self.unavailable: str | None = None  # fetch fails with this message
        self.fast_forward = True
        self.unreadable: set[str] = set()  # revisions whose files cannot be read
        self.fetched: list[str] = []
        self.closed = 0  # times the ports that hold it were closed

    def commit(self, files: Mapping[str, str]) -> str:
        text = repr((len(self.revisions), sorted(files.items())))
        sha = hashlib.sha1(text.encode()).hexdigest()
        self.revisions[sha] = {path: body.encode() for path, body in files.items()}
        self.head = sha
        return sha

    def fetch(self, ref: str) -> str:
        self.fetched.append(ref)
        if self.unavailable is not None:
            raise SourceUnavailable(self.unavailable)
        return ref if ref in self.revisions else self.head  # a sha names its commit

    def read(self, revision: str, path: str) -> Revision:
        prefix = path.strip("/")
        if revision not in self.revisions or revision in self.unreadable:
            raise SourceUnavailable(f"{self.location} has no commit {revision[:12]}")
        files = self.revisions[revision]
        return Revision(revision, {p: b for p, b in files.items() if p.startswith(prefix)})

    def read_file(self, revision: str, path: str) -> bytes | None:
        return self.revisions[revision].get(path.strip("/"))

    def close(self) -> None:
        self.closed += 1

    def is_fast_forward(self, old: str, new: str) -> bool:
        return self.fast_forward

    def has_commit(self, sha: str) -> bool:
        return sha in self.revisions

    def signature_verdicts(
        self, trusted_keys: Path, policy: SignaturePolicy, old: str | None, new: str
    ) -> list[CommitVerdict]:
        return []

    def approvals(self, revision: str, trailer: str) -> list[str]:
        return []


class FakeState:
    """A state store in memory, as far as the pass reads back what it wrote."""

    def __init__(self) -> None:
        self.revision: str | None = None
        self.managed: dict[str, frozenset[str]] = {}
        self.holds: dict[str, Hold] = {}
        self.applied: dict[str, AppliedSpec] = {}
        self.passes: list[dict[str, Any]] = []
        self.early_holds: list[Hold] = []  # written by the journal, before the pass's record
        self.stages: dict[str, Any] = {}
        self.reverted: dict[str, str] = {}
        self.open: set[tuple[str, str, str]] = set()
        self.undelivered: dict[str, list[Any]] = {}
        self.outbox: dict[tuple[str, str, str, bool], AlertEvent] = {}
        self.transitions: dict[tuple[str, str], tuple[str, str]] = {}
        self.fail_record: Exception | None = None
        self.closed = 0
        self.recorded_rollouts: list[Rollout] = []  # what ``rollouts`` answers, newest first
        self.actions: list[OperatorAction] = []
        self.given: list[OperatorOrder] = []  # the operators' orders (abort, promote)
        self.live: list[Mapping[str, Any] | None] = []  # every live snapshot written
        self.bound: tuple[str, str] | None = None  # the repository and folder it records

    def history(self) -> History:
        staged = {
            name: StagedRecord(fingerprint, completed, started, revision)
            for name, (fingerprint, revision, completed, started) in self.stages.items()
        }
        return History(
            self.revision,
            dict(self.managed),
            dict(self.holds),
            staged=staged,
            transitions=dict(self.transitions),
        )

    def last_pass(self) -> dict[str, Any] | None:
        if not self.passes:
            return None
        last = self.passes[-1]  # as the store's: revision, ok, summary (no clock here)
        return {"revision": last["revision"], "finished_at": None, "ok": last["ok"]} | {
            "summary": last["summary"]
        }

    def bound_source(self) -> tuple[str, str] | None:
        return self.bound

    def bind_source(self, repo: str, path: str) -> None:
        self.bound = self.bound or (repo, path)

    def applied_spec(self, deployment: str) -> AppliedSpec | None:
        return self.applied.get(deployment)

    def rollouts(self, model: str | None = None, limit: int = 100) -> list[Rollout]:
        return [r for r in self.recorded_rollouts if model in (None, r.model)][:limit]

    def record_action(self, verb: str, target: str, by: str, detail: str = "") -> OperatorAction:
        self.actions.append(OperatorAction("2026-12-01T03:00:00Z", verb, target, by, detail))
        return self.actions[-1]

    def open_alerts(self) -> set[tuple[str, str, str]]:
        return set(self.open)

    def undelivered_alerts(self) -> dict[str, list[Any]]:
        return dict(self.undelivered)

    def save_undelivered_alerts(self, backlogs: Mapping[str, list[Any]]) -> None:
        self.undelivered = dict(backlogs)

    def record_stage(
        self,
        deployment: str,
        fingerprint: str,
        revision: str,
        completed: Iterable[str],
        started: Mapping[str, tuple[int, ...]],
    ) -> None:
        self.stages[deployment] = (fingerprint, revision, frozenset(completed), dict(started))

    def record_hold(
        self, hold: Hold, rollout: Rollout | None = None, alert: AlertEvent | None = None
    ) -> None:
        self.early_holds.append(hold)
        self.holds[hold.deployment] = hold
        if alert is not None:
            self.outbox[alert.identity] = alert

    def alert_outbox(self) -> dict[tuple[str, str, str, bool], AlertEvent]:
        return dict(self.outbox)

    def alerts_handed_over(
        self, sent: Iterable[tuple[str, str, str, bool]], backlogs: Mapping[str, list[Any]]
    ) -> None:
        for key in sent:
            self.outbox.pop(key, None)
        self.undelivered = dict(backlogs)

    def record_reverted(self, deployments: Iterable[str], note: str) -> None:
        self.reverted.update(dict.fromkeys(deployments, note))

    def unreverted(self) -> set[str]:
        return {name for name in self.holds if name not in self.reverted}

    def record_pass(self, record: PassRecord) -> None:
        if self.fail_record is not None:
            raise self.fail_record
        r = record
        self.passes.append(
            {"revision": r.revision, "ok": r.ok, "summary": r.summary, "holds": r.holds}
            | {"released": r.released, "rollouts": r.rollouts}
        )
        self.revision = r.revision
        self.managed.update(r.managed)
        self.holds.update({h.deployment: h for h in r.holds})
        for name in r.released:
            self.holds.pop(name, None)
        self.applied.update({a.deployment: a for a in r.applied})
        self.open |= set(r.alerts_opened)
        resolved = set(r.alerts_resolved)
        self.open = {(m, s, k) for m, s, k in self.open if (m, s) not in resolved}
        for name in r.stages_ended:
            self.stages.pop(name, None)
        for key in r.outbox_withdrawn:
            self.outbox.pop(key, None)
        self.outbox.update({e.identity: e for e in r.outbox})
        self.transitions = dict(r.transitions)

    def orders(self, deployment: str, since: float) -> list[OperatorOrder]:
        return [o for o in self.given if o.deployment == deployment and o.at_epoch >= since]

    def record_live(self, snapshot: Mapping[str, Any] | None) -> None:
        self.live.append(snapshot)

    def close(self) -> None:
        self.closed += 1


class FakeAlerts:
    """Records what the pass sends; ``backlog`` is what a receiver did not take."""

    def __init__(self) -> None:
        self.sent: list[AlertEvent] = []
        self.restored: list[dict[str, list[Any]]] = []
        self.flushes = 0
        self.pending: dict[str, list[Any]] = {}

    def send(self, event: AlertEvent) -> None:
        self.sent.append(event)

    def restore(self, backlogs: Mapping[str, list[Any]]) -> None:
        self.restored.append(dict(backlogs))

    def backlog(self) -> dict[str, list[Any]]:
        return dict(self.pending)

    def flush(self) -> bool:
        self.flushes += 1
        return not self.pending

    def kinds(self) -> list[str]:
        return [e.kind for e in self.sent]


class FakeWriter:
    """The revert write-back: records each push, or fails with ``error``."""

    def __init__(self) -> None:
        self.pushed: list[tuple[str, tuple[RevertEdit, ...], str, str | None]] = []
        self.error: Exception | None = None

    def tracked_branch(self, ref: str) -> str:
        return "main" if ref == "HEAD" else ref

    def push_revert(
        self,
        branch: str,
        edits: tuple[RevertEdit, ...],
        message: str,
        target_branch: str | None = None,
        attempts: int = 5,
        reverted: str | None = None,
    ) -> PushedRevert | None:
        if self.error is not None:
            raise self.error
        self.pushed.append((branch, edits, message, target_branch))
        return PushedRevert(
            target_branch or branch, "f" * 40, tuple(e.deployment for e in edits), ()
        )


class FakeResolver:
    def __init__(self, names: Mapping[str, list[str]] | None = None) -> None:
        self.names = dict(names or {})

    def resolve(self, name: str) -> list[str]:
        if name not in self.names:
            raise DiscoveryFailed(f"cannot resolve {name}: not known")
        return self.names[name]


class PhaseRecorder:
    """A ``PassHooks`` that lists the phases as they start and end."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.seconds: dict[str, float] = {}

    def phase_started(self, phase: str) -> None:
        self.events.append(("started", phase))

    def phase_ended(self, phase: str, seconds: float) -> None:
        self.events.append(("ended", phase))
        self.seconds[phase] = seconds

    def ended(self) -> list[str]:
        return [phase for what, phase in self.events if what == "ended"]


class FakeClient(FakeTriton):
    """``FakeTriton`` as the pass's client: it observes and closes too."""

    closed = 0

    def observe(self, models: Iterable[str]) -> ServerState:
        return observe(self)

    def close(self) -> None:
        self.closed += 1


@dataclass
class World:
    """One of each fake; ``ports()`` is what a pass is given."""

    manifests: FakeManifests = field(default_factory=FakeManifests)
    state: FakeState = field(default_factory=FakeState)
    alerts: FakeAlerts = field(default_factory=FakeAlerts)
    writer: FakeWriter = field(default_factory=FakeWriter)
    resolver: FakeResolver = field(default_factory=FakeResolver)
    hooks: PhaseRecorder = field(default_factory=PhaseRecorder)
    servers: dict[str, FakeClient] = field(default_factory=dict)

    def client(self, server: TritonServer) -> FakeClient:
        return self.servers[server.name]

    def ports(self) -> Ports:
        return Ports(
            manifests=self.manifests,
            approval=self.manifests,
            open_state=lambda: self.state,
            read_state=lambda: self.state,
            open_alerts=lambda: self.alerts,
            triton=self.client,
            metrics=lambda server: None,
            reverts=self.writer,
            resolver=self.resolver,
            digests=lambda repository, model, versions: {},
            hooks=self.hooks,
        )
