"""``run``: the reconciler as a service (``service.daemon``): passes on a schedule and on
webhooks, the watch between them, the HTTP API, its secrets read from mounted files.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from reconciler.adapters.logs import configure_logging
from reconciler.cli.options import seconds_option, settings_of, source_options
from reconciler.cli.shell import Command, Commands, failed
from reconciler.model.settings import RunSettings
from reconciler.model.source import Source

_RUN = RunSettings()


def _declare_run(commands: Commands) -> None:
    run = commands.add_parser(
        "run",
        help="reconcile continuously: schedule, webhooks, self-heal, /metrics",
        description="Run as a service: a pass every --interval (with jitter, never two at "
        "once), another at once on a verified webhook (GitHub X-Hub-Signature-256, GitLab "
        "X-Gitlab-Token, or POST /reconcile with a bearer token), and a cheap watch of every "
        "server between passes so a restarted server or a hand-unloaded model is restored "
        "within seconds. Serves /metrics, /healthz and /readyz on --listen. SIGTERM or SIGINT "
        "finishes the change in progress and exits 0. GET /serving (and --readiness-gate) "
        "says whether each server serves what it should.",
    )
    source_options(run)
    service = run.add_argument_group("service")
    seconds_option(
        service,
        "--interval",
        _RUN.interval,
        "between passes (%(default)g)",
    )
    seconds_option(
        service,
        "--jitter",
        _RUN.jitter,
        "random delay added (%(default)g)",
    )
    service.add_argument(
        "--listen",
        default=_RUN.listen,
        metavar="HOST:PORT",
        help="address for webhooks, /metrics, /healthz, /readyz (%(default)s)",
    )
    seconds_option(
        service,
        "--watch-interval",
        _RUN.watch_interval,
        "how often each server is checked between passes (%(default)g)",
    )
    seconds_option(
        service,
        "--unload-deadline",
        _RUN.unload_deadline,
        "a version UNLOADING longer than this is alerted, naming it (%(default)g)",
    )
    seconds_option(
        service,
        "--shutdown-deadline",
        _RUN.shutdown_deadline,
        "longest wait at shutdown for the change in progress (%(default)g)",
    )
    service.add_argument(
        "--dry-run", action="store_true", help="plan and report every pass; change nothing"
    )
    service.add_argument(
        "--readiness-gate",
        metavar="NAMESPACE",
        help="set the condition triton-gitops.dev/serving on each Triton pod in NAMESPACE "
        "(found by its address) from what it serves, for pods that list it in "
        "spec.readinessGates; the role needs get, list on pods and patch on pods/status. "
        "GET /serving says the same without it",
    )
    service.add_argument(
        "--operator-tokens-file",
        type=Path,
        metavar="FILE",
        help="named bearer tokens for the on-call verbs (POST /v1/suspend, /v1/resume, "
        "/v1/reconcile, /v1/deployments/NAME/suspend|resume|retry|abort|promote|promote-full) "
        "and GET /status, /v1/passes/last; one 'name: token' per line; history records the "
        "name. The verbs are off without it",
    )
    for name, what in (
        ("github-secret", "GitHub webhook secret (HMAC-SHA256)"),
        ("gitlab-token", "GitLab webhook token"),
        ("reconcile-token", "bearer token for POST /reconcile"),
    ):
        service.add_argument(
            f"--{name}-file",
            type=Path,
            metavar="FILE",
            help=f"file holding the {what} (or the value in "
            f"$TRITON_GITOPS_{name.upper().replace('-', '_')}); the endpoint is off without it",
        )


# The environment variable each of run's secrets is read from without its file.
_SECRET_VARIABLES = {
    "github_secret": "TRITON_GITOPS_GITHUB_SECRET",
    "gitlab_token": "TRITON_GITOPS_GITLAB_TOKEN",
    "reconcile_token": "TRITON_GITOPS_RECONCILE_TOKEN",
}


def _run(args: argparse.Namespace) -> int:
    # The service's modules are imported by the command that runs it: see cli/__init__.py.
    from reconciler import wiring
    from reconciler.adapters.secret_files import SecretFileError, SecretFiles
    from reconciler.service.daemon import Daemon
    from reconciler.service.operator import parse_tokens

    configure_logging(args.log_format, args.log_level, replace=True)
    # The secret files are read again whenever they change (a rotated Kubernetes Secret);
    # a value from the environment stays as it was at start.
    files = {
        "git_token": args.git_token_file,
        "github_secret": args.github_secret_file,
        "gitlab_token": args.gitlab_token_file,
        "reconcile_token": args.reconcile_token_file,
        "operator_tokens": args.operator_tokens_file,
    }
    try:
        secrets = SecretFiles(
            {name: path for name, path in files.items() if path is not None},
            {"operator_tokens": parse_tokens},
        )
    except SecretFileError as exc:
        return failed(f"secret file: {exc}")
    current = secrets.current()

    def secret(name: str) -> str | None:
        return current[name] if name in current else os.environ.get(_SECRET_VARIABLES[name])

    settings = settings_of(args)
    lock = wiring.reconciler_lock(settings, "run")
    daemon = Daemon(
        Source(args.repo, args.ref, args.path),
        settings,
        RunSettings(
            interval=args.interval,
            jitter=args.jitter,
            listen=args.listen,
            github_secret=secret("github_secret") or None,
            gitlab_token=secret("gitlab_token") or None,
            reconcile_token=secret("reconcile_token") or None,
            operator_tokens=current.get("operator_tokens", {}),
            watch_interval=args.watch_interval,
            shutdown_deadline=args.shutdown_deadline,
            dry_run=args.dry_run,
            readiness_gate=args.readiness_gate,
            unload_deadline=args.unload_deadline,
        ),
        lock=lock,
        secrets=secrets,
    )
    code = daemon.serve()
    if code != 0:
        # A pass is still running past the deadline: do not wait for its thread.
        logging.shutdown()
        os._exit(code)
    return code


COMMANDS = {"run": Command(_declare_run, _run)}
