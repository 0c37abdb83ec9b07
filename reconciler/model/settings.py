"""The reconciler's settings as frozen values: one pass's (``Settings``, grouped: Git,
Triton, analysis, revert, alerts, approval) and the service's (``RunSettings``). Filled by
the CLI (one group per option group), read by ``wiring``, ``loop`` and ``service``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from reconciler.model.source import GitCredentials, SignaturePolicy


@dataclass(frozen=True)
class RunSettings:
    interval: float = 60.0
    jitter: float = 5.0
    listen: str = "127.0.0.1:9090"
    github_secret: str | None = None
    gitlab_token: str | None = None
    reconcile_token: str | None = None
    # The on-call verbs' bearer tokens by name (--operator-tokens-file); empty: verbs are off.
    operator_tokens: Mapping[str, str] = field(default_factory=dict)
    watch_interval: float = 3.0
    shutdown_deadline: float = 60.0
    dry_run: bool = False
    max_body_bytes: int = 1 << 20
    # One deadline for the whole request (headers, waiting for a webhook slot, body), from
    # the moment the connection is accepted: a client dribbling a byte a second is cut off.
    read_timeout: float = 5.0
    max_connections: int = 128  # connections served at once; more are answered 503 at once
    max_webhook_reads: int = 16  # webhook bodies read at once; more wait within their deadline
    replay_window: float = 3600.0  # seconds a delivery is remembered
    replay_memory: int = 10_000  # deliveries remembered at most (the oldest are forgotten)
    # The namespace of the Triton pods whose readiness-gate condition the service sets from
    # the serving truth (--readiness-gate); None: only GET /serving and /metrics say it.
    readiness_gate: str | None = None
    # Seconds a version may stay UNLOADING before an alert names it (--unload-deadline).
    unload_deadline: float = 300.0


class RevertMode(StrEnum):
    HOLD = "hold"
    COMMIT = "commit"
    BRANCH = "branch"


@dataclass(frozen=True)
class GitSettings:
    """How the manifest repository is reached."""

    fetch_timeout: float = 120.0  # a Git remote that stalls longer fails the pass's fetch
    credentials: GitCredentials = field(default_factory=GitCredentials)


@dataclass(frozen=True)
class TritonSettings:
    """How the servers are found and driven."""

    max_parallel: int = 8  # servers handled at once
    load_timeout: float = 600.0
    call_timeout: float = 10.0
    config_recheck: float = 600.0  # see TritonServerClient.observe
    poll_interval: float = 0.05  # how often verify and unload poll Triton's index
    hosts_file: Path | None = None  # names resolved from this file first (discovery)


@dataclass(frozen=True)
class AnalysisSettings:
    """Where analysis metrics are read."""

    prometheus_url: str | None = None  # without it, each server's spec.metrics is scraped
    # host:port where routers mirror live shadow traffic (rollout.traffic.shadow); the
    # comparator listens there only while a shadow phase runs. None: no comparator.
    comparator_listen: str | None = None
    # host:port of its HTTP listener, for the copies of HTTP generate_stream requests
    # (server-sent events); None: only gRPC copies are taken.
    comparator_http_listen: str | None = None


@dataclass(frozen=True)
class RevertSettings:
    """What a failed rollout leaves in Git."""

    mode: RevertMode = RevertMode.HOLD
    author: str = "triton-gitops <triton-gitops@localhost>"
    message: str = "Revert {deployments} after failed rollout of {short}"


@dataclass(frozen=True)
class AlertSettings:
    """Where alerts go besides the log."""

    alertmanager_url: str | None = None
    webhook: str | None = None


@dataclass(frozen=True)
class ApprovalSettings:
    """Only approved commits: fast-forward only, signatures, approval trailers."""

    accept_rewrite: str | None = None  # a rewritten head (sha or prefix) an operator accepted
    verify_signatures: SignaturePolicy | None = None
    trusted_keys: Path | None = None
    require_trailer: str | None = None
    min_approvals: int = 1


# How long the state store keeps passes, rollouts and on-call actions (0: for ever).
DEFAULT_HISTORY_DAYS = 90.0


@dataclass(frozen=True)
class Settings:
    """One pass's settings, in groups (as the CLI's option groups are)."""

    cache_dir: Path
    state_path: Path
    history_days: float = DEFAULT_HISTORY_DAYS  # passes, rollouts, on-call actions kept
    allow_empty: bool = False  # accept a revision that leaves a server with no models
    git: GitSettings = field(default_factory=GitSettings)
    triton: TritonSettings = field(default_factory=TritonSettings)
    analysis: AnalysisSettings = field(default_factory=AnalysisSettings)
    revert: RevertSettings = field(default_factory=RevertSettings)
    alerts: AlertSettings = field(default_factory=AlertSettings)
    approval: ApprovalSettings = field(default_factory=ApprovalSettings)
    # NAMESPACE/NAME of a coordination.k8s.io/v1 Lease that the reconciler lock also takes
    # (several replicas: one leads); None: the lock file next to the state store alone.
    leader_lease: str | None = None
