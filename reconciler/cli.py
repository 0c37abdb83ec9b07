"""Command line: argument parsing only; the work is in ``loop``, ``spec`` and ``render``.

Exit codes: ``validate`` 0 valid, 1 invalid; ``plan`` 0 nothing to do, 2 changes pending,
1 error; ``apply`` 0 every server converged, 1 anything failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from reconciler import __version__
from reconciler.errors import ReconcileError, ValidationError
from reconciler.loop import Settings, Source, reconcile
from reconciler.render import progress_line, report_json, report_text
from reconciler.spec import load_desired_state, manifest_files_in

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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "validate":
        return _validate(args)
    return _reconcile(args, apply_changes=args.command == "apply")
