"""Command line: argument parsing only; the work is in ``loop``, ``spec`` and ``render``.

Exit codes: ``validate`` 0 valid, 1 invalid; ``plan`` 0 nothing to do, 2 changes pending,
1 error; ``apply`` 0 every server converged, 1 anything failed or was reverted;
``history`` 0, or 1 without a state store.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from reconciler import __version__
from reconciler.adapters.state import StateStore
from reconciler.errors import ReconcileError, ValidationError
from reconciler.loop import RevertMode, Settings, Source, reconcile
from reconciler.render import (
    history_json,
    history_text,
    progress_line,
    report_json,
    report_text,
)
from reconciler.spec import load_desired_state, manifest_files_in
from reconciler.spec.load import analysis_source_problems

EXIT_OK, EXIT_ERROR, EXIT_CHANGES = 0, 1, 2


def _default_state() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(os.environ.get("TRITON_GITOPS_STATE", Path(base) / "triton-gitops" / "state.db"))


def _default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("TRITON_GITOPS_CACHE", Path(base) / "triton-gitops"))


def _source_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("manifest source")
    group.add_argument(
        "--repo",
        required=True,
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
        "--output", choices=("text", "json"), default="text", help="report format (default text)"
    )
    run = parser.add_argument_group("reconciler")
    run.add_argument(
        "--state",
        type=Path,
        default=_default_state(),
        help="SQLite state store: models applied per server, pass history "
        "(default $TRITON_GITOPS_STATE or $XDG_STATE_HOME/triton-gitops/state.db)",
    )
    run.add_argument(
        "--cache-dir",
        type=Path,
        default=_default_cache(),
        help="where Git mirrors are kept (default $TRITON_GITOPS_CACHE or "
        "$XDG_CACHE_HOME/triton-gitops)",
    )
    run.add_argument(
        "--parallel", type=int, default=8, metavar="N", help="servers handled at once (default 8)"
    )
    run.add_argument(
        "--load-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="longest wait for one Triton load call (default 600). Triton has no server-side "
        "load timeout: a load cut off here keeps running on the server.",
    )
    run.add_argument(
        "--call-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="longest wait for any other Triton call (default 10)",
    )
    analysis = parser.add_argument_group("analysis, revert and alerts")
    analysis.add_argument(
        "--prometheus-url",
        default=os.environ.get("TRITON_GITOPS_PROMETHEUS_URL"),
        metavar="URL",
        help="read analysis metrics from this Prometheus (needed by promql checks); without "
        "it each server's spec.metrics endpoint is scraped directly",
    )
    analysis.add_argument(
        "--revert-mode",
        choices=[m.value for m in RevertMode],
        default=RevertMode.HOLD.value,
        help="after a failed rollout (the old versions serve again at once either way): hold "
        "= keep the ModelDeployment at its previous versions until a commit changes it "
        "(default); commit = also push a commit restoring its previous versions and config "
        "to the tracked branch; branch = push that commit to a new branch "
        "triton-gitops/revert-<sha> for a pull request",
    )
    analysis.add_argument(
        "--revert-author",
        default="triton-gitops <triton-gitops@localhost>",
        metavar="'NAME <EMAIL>'",
        help="author and committer of revert commits",
    )
    analysis.add_argument(
        "--revert-message",
        default="Revert {deployments} after failed rollout of {short}",
        metavar="TEMPLATE",
        help="first line of revert commits; {deployments}, {revision} and {short} are "
        "replaced. The body always lists the failed checks with their values.",
    )
    analysis.add_argument(
        "--alertmanager-url",
        default=os.environ.get("TRITON_GITOPS_ALERTMANAGER_URL"),
        metavar="URL",
        help="post alerts to this Alertmanager (API v2); resolved when a later rollout of "
        "the model succeeds",
    )
    analysis.add_argument(
        "--alert-webhook",
        default=os.environ.get("TRITON_GITOPS_ALERT_WEBHOOK"),
        metavar="URL",
        help="post every alert event as JSON to this URL",
    )
    run.add_argument(
        "--allow-empty",
        action="store_true",
        help="accept a revision that leaves a server with no declared models although the "
        "last applied one had some (otherwise refused, so that an empty or broken checkout "
        "never unloads production)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="triton-gitops",
        description="GitOps for NVIDIA Triton Inference Server: make every server serve the "
        "model versions that the manifests in a Git repository declare, with zero-downtime "
        "swaps (load new beside old, verify, then unload old).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    validate = commands.add_parser(
        "validate",
        help="check manifests in a folder; exit 0 valid, 1 invalid",
        description="Validate every *.yaml/*.yml manifest under DIR against the JSON Schemas "
        "and the cross-document rules, printing every problem as FILE:LINE: message. "
        "Exit 0 when valid, 1 when not.",
    )
    validate.add_argument("dir", nargs="?", default=".", type=Path, metavar="DIR")
    validate.add_argument("--output", choices=("text", "json"), default="text")
    validate.add_argument(
        "--prometheus-url",
        default=os.environ.get("TRITON_GITOPS_PROMETHEUS_URL"),
        metavar="URL",
        help="the Prometheus the reconciler will use: promql checks need one, built-in "
        "checks need it or each server's spec.metrics",
    )

    history = commands.add_parser(
        "history",
        help="list recorded rollouts with their verdicts and check values",
        description="List rollouts from the state store, newest first: revision, server, "
        "model, from and to versions, outcome, the analysis verdict and each check's value.",
    )
    history.add_argument("--model", help="only this model")
    history.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    history.add_argument("--output", choices=("text", "json"), default="text")
    history.add_argument("--state", type=Path, default=_default_state(), help="state store")

    for name, summary in (
        (
            "plan",
            "show what apply would do; exit 0 nothing to do, 2 changes pending, 1 error",
        ),
        ("apply", "run one reconcile pass; exit 0 when every server converged, 1 otherwise"),
    ):
        sub = commands.add_parser(
            name,
            help=summary,
            description=f"{summary[0].upper()}{summary[1:]}. Reads the manifests at the "
            "commit the ref resolves to, observes every declared Triton server over gRPC and "
            "plans, per server and model, the versions to load, verify and unload.",
        )
        _source_options(sub)
    return parser


def _validate(args: argparse.Namespace) -> int:
    try:
        desired = load_desired_state(manifest_files_in(args.dir))
        problems = analysis_source_problems(desired, prometheus=args.prometheus_url is not None)
        if problems:
            raise ValidationError(problems)
    except ValidationError as exc:
        if args.output == "json":
            print(json.dumps({"valid": False, "problems": [vars(p) for p in exc.problems]}))
        else:
            for problem in exc.problems:
                print(problem, file=sys.stderr)
            print(f"{len(exc.problems)} problem(s)", file=sys.stderr)
        return EXIT_ERROR
    if args.output == "json":
        print(
            json.dumps(
                {
                    "valid": True,
                    "servers": len(desired.servers),
                    "deployments": len(desired.deployments),
                }
            )
        )
    else:
        print(
            f"valid: {len(desired.servers)} server(s), {len(desired.deployments)} "
            "model deployment(s)"
        )
    return EXIT_OK


def _reconcile(args: argparse.Namespace, apply_changes: bool) -> int:
    source = Source(args.repo, args.ref, args.path)
    settings = Settings(
        cache_dir=args.cache_dir,
        state_path=args.state,
        allow_empty=args.allow_empty,
        max_parallel=args.parallel,
        load_timeout=args.load_timeout,
        call_timeout=args.call_timeout,
        prometheus_url=args.prometheus_url,
        revert_mode=RevertMode(args.revert_mode),
        revert_author=args.revert_author,
        revert_message=args.revert_message,
        alertmanager_url=args.alertmanager_url,
        alert_webhook=args.alert_webhook,
    )
    try:
        report = reconcile(
            source,
            settings,
            apply_changes=apply_changes,
            progress=lambda step: print(progress_line(step), file=sys.stderr, flush=True),
        )
    except ValidationError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        print(
            f"{len(exc.problems)} problem(s) in the manifests at {exc.revision}; nothing applied",
            file=sys.stderr,
        )
        return EXIT_ERROR
    except ReconcileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(report_json(report) if args.output == "json" else report_text(report))
    if not report.ok:
        return EXIT_ERROR
    if not apply_changes and report.plan.has_changes:
        return EXIT_CHANGES
    return EXIT_OK


def _history(args: argparse.Namespace) -> int:
    if not args.state.exists():
        print(f"error: no state store at {args.state}", file=sys.stderr)
        return EXIT_ERROR
    store = StateStore(args.state)
    try:
        rollouts = store.rollouts(args.model, args.limit)
    finally:
        store.close()
    print(history_json(rollouts) if args.output == "json" else history_text(rollouts))
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Structured log lines (alerts among them) go to stderr, one JSON object per line.
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.command == "validate":
        return _validate(args)
    if args.command == "history":
        return _history(args)
    return _reconcile(args, apply_changes=args.command == "apply")
