"""The option groups several commands share (the manifest source, Git credentials, approval,
the reconciler's settings, logging), and the ``Settings`` read from them. A default that
``model.settings`` has is taken from there and shown by the help from there (``%(default)s``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from reconciler.adapters.logs import LOG_FORMATS, LOG_LEVELS
from reconciler.cli.shell import secret
from reconciler.core.spec.durations import option_seconds
from reconciler.model.settings import (
    DEFAULT_HISTORY_DAYS,
    AlertSettings,
    AnalysisSettings,
    ApprovalSettings,
    GitSettings,
    RevertMode,
    RevertSettings,
    Settings,
    TritonSettings,
)
from reconciler.model.source import GitCredentials, SignaturePolicy

_GIT, _TRITON = GitSettings(), TritonSettings()
_REVERT, _APPROVAL = RevertSettings(), ApprovalSettings()
_CREDENTIALS = GitCredentials()
# How long apply and undo wait for another reconciler to let the lock go.
LOCK_TIMEOUT = 30.0


def default_state() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "triton-gitops" / "state.db"


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "triton-gitops"


def seconds(text: str) -> float:
    """An option's duration (``core.spec.durations.option_seconds``: 30, 0.5, 1m, 1m30s, 500ms),
    as argparse, the config file and the environment give it."""
    try:
        return option_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def seconds_option(
    group: argparse.ArgumentParser | argparse._ArgumentGroup, flag: str, default: float, help: str
) -> None:
    """An option of a duration (a bare number is seconds), its default written once, in
    seconds (``help`` shows it with ``%(default)g``)."""
    group.add_argument(flag, type=seconds, default=default, metavar="DURATION", help=help)


def token_file_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="with --service: a file holding one of its operator tokens (or the token in "
        "$TRITON_GITOPS_OPERATOR_TOKEN)",
    )


def source_options(
    parser: argparse.ArgumentParser,
    outputs: tuple[str, ...] = ("text", "json"),
    repo_required: bool = True,
) -> None:
    """The options of a command that reads the manifests and reaches the servers, in the
    groups --help shows: source, Git credentials, approval, reconciler, analysis."""
    _manifest_source(parser, outputs, repo_required)
    _git_credentials(parser)
    _approval(parser)
    _reconciler(parser)
    _analysis(parser)


def _manifest_source(
    parser: argparse.ArgumentParser, outputs: tuple[str, ...], repo_required: bool
) -> None:
    group = parser.add_argument_group("manifest source")
    group.add_argument(
        "--repo",
        required=repo_required,
        metavar="URL|PATH",
        help="Git repository holding the manifests: a URL (file://, ssh://, https://) or a "
        "local path. It is mirrored into the cache; manifests are read from a commit, never "
        "from a work tree.",
    )
    group.add_argument(
        "--ref",
        default="HEAD",
        help="branch, tag or commit to reconcile to (default: the remote's HEAD)",
    )
    group.add_argument(
        "--path",
        default="",
        metavar="SUBDIR",
        help="folder in the repository holding the manifests (default: the whole repository)",
    )
    group.add_argument(
        "--output", choices=outputs, default="text", help="report format (default %(default)s)"
    )


def _git_credentials(parser: argparse.ArgumentParser) -> None:
    creds = parser.add_argument_group(
        "Git credentials (from the environment or mounted files, never from the repository)"
    )
    creds.add_argument(
        "--git-token-file",
        type=Path,
        metavar="FILE",
        help="HTTPS token for the repository (or the value in $TRITON_GITOPS_GIT_TOKEN); sent "
        "as basic auth through git's environment, never in a URL or a message",
    )
    creds.add_argument(
        "--git-username",
        default=_CREDENTIALS.username,
        help="user name sent with the token (%(default)s)",
    )
    creds.add_argument("--git-ssh-key", type=Path, metavar="FILE", help="SSH private key file")


def _approval(parser: argparse.ArgumentParser) -> None:
    approved = parser.add_argument_group(
        "only approved commits (fast-forward only; signatures; approval trailers)"
    )
    approved.add_argument(
        "--accept-rewrite",
        metavar="SHA",
        help="the tracked branch was rewritten (force-pushed) on purpose: accept this new head "
        "(full SHA or a prefix). Without it a head that does not descend from the last applied "
        "commit is refused, alerted, and the last applied revision keeps serving.",
    )
    approved.add_argument(
        "--verify-signatures",
        choices=[p.value for p in SignaturePolicy],
        help="refuse commits not signed (OpenPGP, git verify-commit) by a key in --trusted-keys: "
        "head = the commit applied; all = every commit since the last applied one",
    )
    approved.add_argument(
        "--trusted-keys",
        type=Path,
        metavar="DIR",
        help="folder of trusted public keys (*.asc, *.gpg); imported into a keyring the "
        "reconciler owns, never the user's own",
    )
    approved.add_argument(
        "--require-trailer",
        metavar="KEY",
        help="refuse a commit with fewer than --min-approvals distinct KEY: trailers (e.g. "
        "Approved-by, as Git hosts write into merge commits); use with --verify-signatures",
    )
    approved.add_argument(
        "--min-approvals",
        type=int,
        default=_APPROVAL.min_approvals,
        metavar="N",
        help="with --require-trailer (%(default)s)",
    )


def _reconciler(parser: argparse.ArgumentParser) -> None:
    run = parser.add_argument_group("reconciler")
    run.add_argument(
        "--state",
        type=Path,
        default=default_state(),
        help="SQLite state store: models applied per server, pass history "
        "(default $TRITON_GITOPS_STATE or $XDG_STATE_HOME/triton-gitops/state.db)",
    )
    run.add_argument(
        "--history-days",
        type=float,
        default=DEFAULT_HISTORY_DAYS,
        metavar="DAYS",
        help="keep passes, rollouts and on-call actions this long in the state store "
        "(%(default)g; 0: for ever). Holds, open alerts, rollouts in progress "
        "and each server's latest rollout of each ModelDeployment are kept whatever their age",
    )
    run.add_argument(
        "--cache-dir",
        type=Path,
        default=default_cache(),
        help="where Git mirrors are kept (default $TRITON_GITOPS_CACHE_DIR or "
        "$XDG_CACHE_HOME/triton-gitops)",
    )
    run.add_argument(
        "--parallel",
        type=int,
        default=_TRITON.max_parallel,
        metavar="N",
        help="servers handled at once (default %(default)s)",
    )
    run.add_argument(
        "--hosts-file",
        type=Path,
        metavar="FILE",
        help="resolve discovery names from this file first ('name address...' lines), then "
        "from DNS: for local fleets and tests",
    )
    seconds_option(
        run,
        "--load-timeout",
        _TRITON.load_timeout,
        "longest wait for one Triton load call (default %(default)g). Triton has no "
        "server-side load timeout: a load cut off here keeps running on the server.",
    )
    seconds_option(
        run,
        "--fetch-timeout",
        _GIT.fetch_timeout,
        "longest wait for one fetch of the manifest repository (default %(default)g); a "
        "remote that stalls longer fails the pass, and everything keeps serving",
    )
    seconds_option(
        run,
        "--call-timeout",
        _TRITON.call_timeout,
        "longest wait for any other Triton call (default %(default)g); a smoke case "
        "without a timeout of its own that gets no answer by then, from a server that "
        "answers, fails the version",
    )
    run.add_argument(
        "--leader-lease",
        metavar="NAMESPACE/NAME",
        help="apply, undo and run also take this coordination.k8s.io/v1 Lease (leader "
        "election, for more than one replica) besides the lock file next to --state",
    )
    seconds_option(
        run,
        "--config-recheck",
        _TRITON.config_recheck,
        "how often a loaded model's config is read again although Triton's index shows no "
        "change (a hand reload with another config); spread over 0.5x-1.5x (%(default)g). "
        "Configs read are kept beside --state for the next process; 0: read every config "
        "every pass",
    )
    run.add_argument(
        "--allow-empty",
        action="store_true",
        help="accept a revision that leaves a server with no declared models although the "
        "last applied one had some (otherwise refused, so that an empty or broken checkout "
        "never unloads production)",
    )


def _analysis(parser: argparse.ArgumentParser) -> None:
    analysis = parser.add_argument_group("analysis, revert and alerts")
    analysis.add_argument(
        "--prometheus-url",
        metavar="URL",
        help="read analysis metrics from this Prometheus (needed by promql checks); without "
        "it each server's spec.metrics endpoint is scraped directly",
    )
    analysis.add_argument(
        "--comparator-listen",
        metavar="HOST:PORT",
        help="where routers mirror live shadow traffic (a ModelDeployment's "
        "rollout.traffic.shadow, a Router's spec.comparator): the comparator listens here "
        "while a shadow phase runs, and compares the old and new versions' answers. Without "
        "it a rollout with a shadow phase is a plan problem: nothing of it is loaded",
    )
    analysis.add_argument(
        "--comparator-http-listen",
        metavar="HOST:PORT",
        help="with --comparator-listen: where routers mirror copies of Triton's HTTP "
        "generate_stream requests (server-sent events) for the comparator, whose sides it "
        "asks at each TritonServer's spec.http; the router's mirror-only HTTP/1.1 cluster "
        "to the comparator reaches this address",
    )
    analysis.add_argument(
        "--revert-mode",
        choices=[m.value for m in RevertMode],
        default=_REVERT.mode.value,
        help="after a failed rollout (the old versions serve again at once either way): hold "
        "= keep the ModelDeployment at its previous versions until a commit changes it "
        "(default); commit = also push a commit restoring its previous versions and config "
        "to the tracked branch; branch = push that commit to a new branch "
        "triton-gitops/revert-<sha> for a pull request",
    )
    analysis.add_argument(
        "--revert-author",
        default=_REVERT.author,
        metavar="'NAME <EMAIL>'",
        help="author and committer of revert commits (%(default)s)",
    )
    analysis.add_argument(
        "--revert-message",
        default=_REVERT.message,
        metavar="TEMPLATE",
        help="first line of revert commits; {deployments}, {revision} and {short} are "
        "replaced. The body always lists the failed checks with their values.",
    )
    analysis.add_argument(
        "--alertmanager-url",
        metavar="URL",
        help="post alerts to this Alertmanager (API v2); resolved when a later rollout of "
        "the model succeeds",
    )
    analysis.add_argument(
        "--alert-webhook",
        metavar="URL",
        help="post every alert event as JSON to this URL",
    )


def lock_timeout_option(command: argparse.ArgumentParser) -> None:
    seconds_option(
        command,
        "--lock-timeout",
        LOCK_TIMEOUT,
        "how long to wait for another reconciler (a running service, another apply) "
        "to release the lock next to --state before refusing (%(default)g; 0: refuse at once)",
    )


def two_refs(command: argparse.ArgumentParser) -> None:
    """The options of a command that compares two refs of one repository (diff, gate)."""
    command.add_argument("--repo", required=True, metavar="URL|PATH")
    command.add_argument("--base", required=True, metavar="REF", help="e.g. origin/main")
    command.add_argument("--head", required=True, metavar="REF", help="the change")
    command.add_argument("--path", default="", metavar="SUBDIR")


def log_options(command: argparse.ArgumentParser, default_format: str) -> None:
    group = command.add_argument_group("logging (stderr)")
    group.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=default_format,
        help="text: the message and its fields as key=value; json: one object a line (time "
        f"in RFC 3339, level, logger, message, fields). Default {default_format}",
    )
    group.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="info",
        help="least severe record logged (%(default)s); debug also shows run's scheduler lines",
    )


def git_credentials(args: argparse.Namespace) -> GitCredentials:
    return GitCredentials(
        token=secret(getattr(args, "git_token_file", None), "TRITON_GITOPS_GIT_TOKEN"),
        username=getattr(args, "git_username", _CREDENTIALS.username),
        ssh_key=getattr(args, "git_ssh_key", None),
    )


def settings_of(args: argparse.Namespace) -> Settings:
    """One settings group per option group of ``source_options``."""
    return Settings(
        cache_dir=args.cache_dir,
        state_path=args.state,
        history_days=args.history_days,
        allow_empty=args.allow_empty,
        git=GitSettings(fetch_timeout=args.fetch_timeout, credentials=git_credentials(args)),
        triton=TritonSettings(
            max_parallel=args.parallel,
            load_timeout=args.load_timeout,
            call_timeout=args.call_timeout,
            config_recheck=args.config_recheck,
            hosts_file=args.hosts_file,
        ),
        analysis=AnalysisSettings(
            prometheus_url=args.prometheus_url,
            comparator_listen=args.comparator_listen,
            comparator_http_listen=args.comparator_http_listen,
        ),
        revert=RevertSettings(
            mode=RevertMode(args.revert_mode),
            author=args.revert_author,
            message=args.revert_message,
        ),
        alerts=AlertSettings(alertmanager_url=args.alertmanager_url, webhook=args.alert_webhook),
        leader_lease=getattr(args, "leader_lease", None),
        approval=ApprovalSettings(
            accept_rewrite=args.accept_rewrite,
            verify_signatures=(
                SignaturePolicy(args.verify_signatures) if args.verify_signatures else None
            ),
            trusted_keys=args.trusted_keys,
            require_trailer=args.require_trailer,
            min_approvals=args.min_approvals,
        ),
    )
