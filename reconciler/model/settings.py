"""The reconciler's settings as frozen values: one pass's (``Settings``)
and the service's (``RunSettings``). Filled by the CLI, read by ``wiring`` and ``loop``.
"""

from __future__ import annotations

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


class RevertMode(StrEnum):
    HOLD = "hold"
    COMMIT = "commit"
    BRANCH = "branch"


@dataclass(frozen=True)
class Settings:
    cache_dir: Path
    state_path: Path
    allow_empty: bool = False
    max_parallel: int = 8
    load_timeout: float = 600.0
    call_timeout: float = 10.0
    config_recheck: float = 600.0  # see TritonServerClient.observe
    fetch_timeout: float = 120.0  # a Git remote that stalls longer fails the pass's fetch
    prometheus_url: str | None = None
    revert_mode: RevertMode = RevertMode.HOLD
    revert_author: str = "triton-gitops <triton-gitops@localhost>"
    revert_message: str = "Revert {deployments} after failed rollout of {short}"
    alertmanager_url: str | None = None
    alert_webhook: str | None = None
    poll_interval: float = 0.05  # how often verify and unload poll Triton's index
    git_credentials: GitCredentials = field(default_factory=GitCredentials)
    # Only approved commits: fast-forward only, signatures, approval trailers.
    accept_rewrite: str | None = None  # a rewritten head (sha or prefix) an operator accepted
    hosts_file: Path | None = None  # names resolved from this file first (discovery)
    verify_signatures: SignaturePolicy | None = None
    trusted_keys: Path | None = None
    require_trailer: str | None = None
    min_approvals: int = 1
