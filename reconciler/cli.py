"""Command line: argument parsing only; the work is in ``loop``, ``spec`` and ``render``.

Exit codes: ``validate`` 0 valid, 1 invalid; ``plan`` 0 nothing to do, 2 changes pending,
1 error; ``apply`` 0 every server converged, 1 anything failed or was reverted;
``history`` 0 (also without a state store: no history yet); ``status`` 0, or 3 when every
declared server is unreachable (1 an error).
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from reconciler import __version__, wiring
from reconciler.adapters.artifacts import tree_digest
from reconciler.adapters.chart import ChartUnavailable, latency_chart
from reconciler.adapters.files import manifest_files_in, read_in_directory
from reconciler.adapters.git import path_in_work_tree
from reconciler.adapters.local_triton import LocalTritonError
from reconciler.adapters.logs import LOG_FORMATS, LOG_LEVELS, configure_logging
from reconciler.adapters.operator_client import ask_service, live_status, wait_for_pass
from reconciler.adapters.options import (
    ConfigFile,
    OptionSourceError,
    command_in,
    config_path,
    known_keys,
    read_config_file,
    refuse_unknown_keys,
    take_defaults,
)
from reconciler.adapters.perf_analyzer import find_perf_analyzer
from reconciler.adapters.plan_file import load_saved_plan, save_plan
from reconciler.adapters.secret_files import SecretFileError, SecretFiles
from reconciler.core.spec.desired import read_manifests
from reconciler.core.spec.rules import promql_without_prometheus
from reconciler.core.spec.shadow import MAX_SHADOW_FILE_BYTES
from reconciler.core.undo import UndoRequest
from reconciler.engine.orders import ORDERS_EVERY
from reconciler.loop.gate import GateTarget, gated, run_gate
from reconciler.loop.on_call import VerbDone, give, never_applied
from reconciler.loop.pass_log import log_step
from reconciler.loop.reconcile import reconcile
from reconciler.loop.review import desired_at, diff_refs
from reconciler.loop.status import status
from reconciler.loop.undo import undo
from reconciler.model.analysis import Evaluation
from reconciler.model.errors import Problem, ReconcileError, StateFileRefused, ValidationError
from reconciler.model.gate import GateReport, GateVerdict, ModelGate
from reconciler.model.history import Hold, OperatorOrder, OrderKind
from reconciler.model.plan import Step
from reconciler.model.results import StepResult
from reconciler.model.settings import (
    DEFAULT_HISTORY_DAYS,
    AlertSettings,
    AnalysisSettings,
    ApprovalSettings,
    GitSettings,
    RevertMode,
    RevertSettings,
    RunSettings,
    Settings,
    TritonSettings,
)
from reconciler.model.source import GitCredentials, SignaturePolicy, Source
from reconciler.model.spec import DesiredState, ManifestReading
from reconciler.service.daemon import Daemon
from reconciler.service.operator import parse_tokens
from reconciler.views.gate import gate_annotations, gate_json, gate_markdown, gate_text
from reconciler.views.live import evaluation_line, live_text, started_line, waiting_line
from reconciler.views.render import (
    history_json,
    history_text,
    plan_json,
    progress_line,
    report_json,
    report_text,
    status_json,
    status_text,
)
from reconciler.views.review import (
    diff_json,
    diff_markdown,
    diff_text,
    plan_markdown,
)
from reconciler.views.steps import plan_steps_json
from reconciler.views.validation import validation_annotations, validation_json, validation_text

EXIT_OK, EXIT_ERROR, EXIT_CHANGES = 0, 1, 2
EXIT_GATE_FAILED = 3  # gate: a deployment failed it (1 stays an error: not judged)
EXIT_GATE_INCONCLUSIVE = 4  # gate: none failed, one's measurements too noisy to judge
EXIT_NO_SERVER = 3  # status: every declared server unreachable (1: status could not run)
# plan and apply's own records with --log-format json (their progress, why they stopped)
_log = logging.getLogger("triton_gitops.cli")


def _default_state() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "triton-gitops" / "state.db"


def _default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "triton-gitops"


def _token_file_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="with --service: a file holding one of its operator tokens (or the token in "
        "$TRITON_GITOPS_OPERATOR_TOKEN)",
    )


def _source_options(
    parser: argparse.ArgumentParser,
    outputs: tuple[str, ...] = ("text", "json"),
    repo_required: bool = True,
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
        "--output", choices=outputs, default="text", help="report format (default text)"
    )
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
        "--git-username", default="x-access-token", help="user name sent with the token"
    )
    creds.add_argument("--git-ssh-key", type=Path, metavar="FILE", help="SSH private key file")
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
        "--min-approvals", type=int, default=1, metavar="N", help="with --require-trailer (1)"
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
        "--history-days",
        type=float,
        default=DEFAULT_HISTORY_DAYS,
        metavar="DAYS",
        help="keep passes, rollouts and on-call actions this long in the state store "
        f"({DEFAULT_HISTORY_DAYS:g}; 0: for ever). Holds, open alerts, rollouts in progress "
        "and each server's latest rollout of each ModelDeployment are kept whatever their age",
    )
    run.add_argument(
        "--cache-dir",
        type=Path,
        default=_default_cache(),
        help="where Git mirrors are kept (default $TRITON_GITOPS_CACHE_DIR or "
        "$XDG_CACHE_HOME/triton-gitops)",
    )
    run.add_argument(
        "--parallel", type=int, default=8, metavar="N", help="servers handled at once (default 8)"
    )
    run.add_argument(
        "--hosts-file",
        type=Path,
        metavar="FILE",
        help="resolve discovery names from this file first ('name address...' lines), then "
        "from DNS: for local fleets and tests",
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
        "--fetch-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="longest wait for one fetch of the manifest repository (default 120); a remote "
        "that stalls longer fails the pass, and everything keeps serving",
    )
    run.add_argument(
        "--call-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="longest wait for any other Triton call (default 10)",
    )
    run.add_argument(
        "--leader-lease",
        metavar="NAMESPACE/NAME",
        help="apply, undo and run also take this coordination.k8s.io/v1 Lease (leader "
        "election, for more than one replica) besides the lock file next to --state",
    )
    run.add_argument(
        "--config-recheck",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="run: how often a loaded model's config is read again although Triton's index "
        "shows no change (a hand reload with another config); spread over 0.5x-1.5x (600)",
    )
    analysis = parser.add_argument_group("analysis, revert and alerts")
    analysis.add_argument(
        "--prometheus-url",
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
        metavar="URL",
        help="post alerts to this Alertmanager (API v2); resolved when a later rollout of "
        "the model succeeds",
    )
    analysis.add_argument(
        "--alert-webhook",
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


def _lock_timeout_option(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--lock-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long to wait for another reconciler (a running service, another apply) "
        "to release the lock next to --state before refusing (30; 0: refuse at once)",
    )


def _two_refs(command: argparse.ArgumentParser) -> None:
    """The options of a command that compares two refs of one repository (diff, gate)."""
    command.add_argument("--repo", required=True, metavar="URL|PATH")
    command.add_argument("--base", required=True, metavar="REF", help="e.g. origin/main")
    command.add_argument("--head", required=True, metavar="REF", help="the change")
    command.add_argument("--path", default="", metavar="SUBDIR")


class _Parser(argparse.ArgumentParser):
    """Usage errors exit 1: exit 2 means "changes pending" for plan and diff. Abbreviated
    options are off (in every subparser: they are made of this class), so that ``--config``
    is never taken for ``--config-recheck`` and a new option never breaks an old script."""

    commands: dict[str, argparse.ArgumentParser]  # the subcommands' parsers, by name

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")


_CONFIG_HELP = (
    "YAML file of option defaults (keys are long option names, e.g. repo, interval, "
    "revert-mode; a key no command has is refused). Precedence: command-line flag, then "
    "$TRITON_GITOPS_<OPTION> (e.g. TRITON_GITOPS_REPO), then this file, then the built-in "
    "default. $TRITON_GITOPS_CONFIG names the file too."
)


def build_parser() -> _Parser:
    parser = _Parser(
        prog="triton-gitops",
        description="GitOps for NVIDIA Triton Inference Server: make every server serve the "
        "model versions that the manifests in a Git repository declare, with zero-downtime "
        "swaps (load new beside old, verify, then unload old).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--config", type=Path, metavar="FILE", help=_CONFIG_HELP)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    validate = commands.add_parser(
        "validate",
        help="check manifests in a folder; exit 0 valid, 1 invalid",
        description="Validate every *.yaml/*.yml manifest under DIR (hidden files and folders "
        "and what a .sourceignore excludes left out; documents of other tools counted and "
        "left alone) against the JSON Schemas and the cross-document rules, printing every "
        "problem as FILE:LINE: message. Exit 0 when valid, 1 when not; a DIR with no "
        "manifest of ours is a warning (exit 0, no 'valid' line, JSON empty: true). It reads "
        "files only: no server, Git remote or Prometheus is asked, so it runs in CI. The "
        "query of each promql analysis check is checked for syntax only (whether its metrics "
        "exist only the Prometheus can tell).",
    )
    validate.add_argument("dir", nargs="?", default=".", type=Path, metavar="DIR")
    validate.add_argument(
        "--output",
        choices=("text", "json", "github"),
        default="text",
        help="github: GitHub Actions annotations (::error file=F,line=L::message), so problems "
        "show on the pull request's diff",
    )
    validate.add_argument(
        "--prometheus-url",
        metavar="URL",
        help="the Prometheus the reconciler will use (validate never queries it). Only "
        "promql checks need a Prometheus: plan, apply and run refuse them without "
        "--prometheus-url; validate checks their syntax only and, without this option, "
        "warns that they need one (exit 0). Built-in checks (successRate, latency, memory) "
        "need no Prometheus, but each server they run on needs spec.metrics, with or without "
        "it.",
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

    reconcile_verb = commands.add_parser(
        "reconcile",
        help="ask the running service for a pass now and wait for its outcome",
        description="Ask the running service (--service) for a pass now, as `flux reconcile` "
        "does, and wait until a pass that started after the request has finished: exit 0 "
        "when it fully succeeded and left no ModelDeployment held, 1 otherwise (each failed "
        "server or model is printed, and each held deployment with its servers and the "
        "failed revision: Stalled, as `flux reconcile` fails on a stalled object). "
        "Recorded under the operator token's name.",
    )
    reconcile_verb.add_argument("--service", required=True, metavar="URL")
    _token_file_option(reconcile_verb)
    reconcile_verb.add_argument(
        "--timeout", type=float, default=900.0, metavar="SECONDS", help="longest wait (900)"
    )
    for verb, summary, description in (
        (
            "suspend",
            "pause reconciling one ModelDeployment (or all) until resume; no commit",
            "Record in the state store that DEPLOYMENT (or, without one, every ModelDeployment) "
            "is not to be reconciled: passes leave its servers as they are (no load, no unload, "
            "no router change), status shows who suspended it and when, until resume. Takes "
            "effect at the next pass of a running service sharing the state store.",
        ),
        (
            "resume",
            "lift a suspend (of one ModelDeployment, or without one, of all)",
            "Lift the suspension of DEPLOYMENT, or without one the suspension of every "
            "ModelDeployment (suspensions of single deployments stay: they are listed).",
        ),
        (
            "retry",
            "lift the hold on a ModelDeployment whose rollout failed: the same spec again",
            "A failed spec is held at what served before until a commit changes it. retry "
            "lifts the hold without a commit: the next pass tries the same spec again (and "
            "analyses it again).",
        ),
        (
            "abort",
            "stop a rollout in progress now: the old versions back, the spec held, an alert",
            "Tell the reconciler applying DEPLOYMENT to stop its rollout now (within a "
            "quarter of a second: in its analysis, its current stage, or before its next "
            "step): the old versions serve again, the spec is held (retry, undo or a new "
            "commit lifts it), an alert opens, and the revert write-back runs as after a "
            "failed analysis (--revert-mode). Refused when no rollout of it is in progress.",
        ),
        (
            "promote",
            "end a rollout's running analysis as passed (--full: every analysis left)",
            "Tell the reconciler applying DEPLOYMENT to end the analyses running now as "
            "passed ('promoted' in history): the rollout goes on to its next step (the next "
            "stage or traffic share, whose analysis runs in full) or, with --full, through "
            "every step left without analysing. Refused when no rollout of it is in progress.",
        ),
    ):
        command = commands.add_parser(verb, help=summary, description=description)
        command.add_argument(
            "deployment",
            nargs="?" if verb in ("suspend", "resume") else None,
            metavar="DEPLOYMENT",
            help="a ModelDeployment's metadata.name",
        )
        if verb in ("suspend", "abort", "promote"):
            command.add_argument("--reason", default="", help="shown by status and history")
        if verb == "promote":
            command.add_argument(
                "--full", action="store_true", help="skip every analysis left in the rollout"
            )
        command.add_argument(
            "--as",
            dest="actor",
            metavar="NAME",
            help="who asks, as history records it (default: USER@HOST)",
        )
        command.add_argument("--state", type=Path, default=_default_state(), help="state store")
        command.add_argument(
            "--service",
            metavar="URL",
            help="ask the running service instead (e.g. http://127.0.0.1:9090): the verb is "
            "recorded under the token's name and, for resume and retry, a pass runs at once",
        )
        _token_file_option(command)

    undo_command = commands.add_parser(
        "undo",
        help="put a ModelDeployment back to an earlier spec by a commit to the tracked branch",
        description="Push a commit to the tracked branch that sets DEPLOYMENT's spec back to "
        "the one it had at --to-revision, by default at the last revision at which it "
        "converged (the state store knows) and that differs from the spec in Git now; "
        "comments and the file's other documents stay. The next pass applies it like any "
        "commit (a spec held after a failed rollout changes, so its hold lifts). --dry-run "
        "prints the change as a patch and pushes nothing. One-shot with --repo and --state, "
        "or through the running service with --service and --token-file.",
    )
    undo_command.add_argument("deployment", metavar="DEPLOYMENT", help="metadata.name")
    undo_command.add_argument(
        "--to-revision", metavar="SHA", help="go back to the spec at this commit of the branch"
    )
    undo_command.add_argument(
        "--dry-run", action="store_true", help="print the change as a patch; push nothing"
    )
    undo_command.add_argument("--reason", default="", help="in the commit message and history")
    undo_command.add_argument("--as", dest="actor", metavar="NAME", help="who asks (USER@HOST)")
    undo_command.add_argument("--service", metavar="URL", help="ask the running service")
    _token_file_option(undo_command)
    _source_options(undo_command, repo_required=False)
    _lock_timeout_option(undo_command)

    plan_command = commands.add_parser(
        "plan",
        help="show what apply would do; exit 0 nothing to do, 2 changes pending, 1 error",
        description="Show what apply would do; exit 0 nothing to do, 2 changes pending, "
        "1 error. Reads the manifests at the commit the ref resolves to, observes every "
        "declared Triton server over gRPC and plans, per server and model, the versions to "
        "load, verify, analyze and unload. --output markdown is a pull-request comment.",
    )
    _source_options(plan_command, ("text", "json", "markdown"))
    plan_command.add_argument(
        "--out",
        type=Path,
        metavar="FILE",
        help="also save the plan (revision, each server's state, steps) for apply --plan",
    )
    apply_command = commands.add_parser(
        "apply",
        help="run one reconcile pass; exit 0 when every server converged, 1 otherwise",
        description="Run one reconcile pass; exit 0 when every server converged, 1 when "
        "anything failed or was reverted. Reads the manifests at the commit the ref resolves "
        "to, observes every declared Triton server, plans and applies: load new versions "
        "beside the old, verify, analyze, then unload the old.",
    )
    _source_options(apply_command)
    _lock_timeout_option(apply_command)
    apply_command.add_argument(
        "--plan",
        type=Path,
        metavar="FILE",
        help="apply exactly this saved plan (plan --out); refused as stale when the tracked "
        "branch or any server moved since it was made",
    )

    diff_command = commands.add_parser(
        "diff",
        help="what a change does to the desired state; no servers needed",
        description="Compare the manifests at two refs: per server and model, versions added "
        "and removed, config fields changed, servers added or removed, models unloaded, and "
        "warnings a reviewer must see. Needs no Triton server. Exit 0 no change, 2 changes, "
        "1 error.",
    )
    _two_refs(diff_command)
    diff_command.add_argument("--output", choices=("text", "json", "markdown"), default="text")
    diff_command.add_argument("--cache-dir", type=Path, default=_default_cache())

    gate = commands.add_parser(
        "gate",
        help="pre-merge quality gate: new versions load-tested beside the old in an isolated "
        "tritonserver; exit 0 pass, 3 failed, 4 inconclusive, 1 error",
        description="For every ModelDeployment whose versions or config change between --base "
        "and --head: start a tritonserver of its own on loopback over --model-repository, bring "
        "the base spec up as apply would, load the head's new versions beside the old with the "
        "config the reconciler would send (the apply-time interface rules refuse a config that "
        "changes what clients see), run the verify step (smoke cases, shadow replay, a "
        "synthesized request), load-test old and new interleaved with the same requests at "
        "spec.verify.gate's concurrency levels, and judge latency, throughput, errors and "
        "memory against its bounds. Exit 0 every deployment passed (or none changed), 3 one "
        "failed the gate, 4 none failed but one was inconclusive (its rounds too noisy to "
        "judge), 1 error (one could not be judged).",
    )
    _two_refs(gate)
    gate.add_argument(
        "--model-repository",
        required=True,
        type=Path,
        metavar="PATH",
        help="a Triton model repository holding the old and the new version folders",
    )
    gate.add_argument(
        "--base-model-repository",
        type=Path,
        metavar="PATH",
        help="the model repository as it is at --base, for the config.pbtxt the old versions "
        "run with; default: read from --repo at --base when --model-repository is in its "
        "checkout",
    )
    gate.add_argument(
        "--output", choices=("text", "json", "markdown", "github"), default="text",
        help="github: GitHub Actions annotations on the manifest lines that failed",
    )  # fmt: skip
    gate.add_argument(
        "--report-dir",
        type=Path,
        metavar="DIR",
        help="also write gate.md, gate.json and one latency chart (SVG) per version there",
    )
    gate.add_argument(
        "--load-generator",
        choices=("auto", "built-in", "perf_analyzer"),
        default="auto",
        help="auto: perf_analyzer when it is found (--perf-analyzer or on PATH), else the "
        "built-in gRPC generator",
    )
    gate.add_argument(
        "--perf-analyzer", metavar="PATH", help="perf_analyzer binary (default: on PATH)"
    )
    gate.add_argument(
        "--tritonserver",
        type=Path,
        metavar="PATH",
        help="tritonserver binary (backends in ../backends, as in Triton's image); default: "
        "the nvidia-pytriton wheel's (pip install 'triton-gitops[local]')",
    )
    gate.add_argument(
        "--deployment", action="append", metavar="NAME", help="only these (repeatable)"
    )
    gate.add_argument("--cache-dir", type=Path, default=_default_cache())

    digest = commands.add_parser(
        "digest",
        help="print the digest of a model version folder, to pin in a manifest",
        description="Print the sha256 file-tree digest of a model version folder (e.g. "
        "models/echo/3), as spec.versions entries pin it: {version: 3, digest: sha256:...}. "
        "The reconciler recomputes it before every load when it can read the model "
        "repository, and refuses a version whose folder changed.",
    )
    digest.add_argument("path", type=Path, metavar="PATH")

    status = commands.add_parser(
        "status",
        help="per server and model: desired versus served versions, holds, last error",
        description="Observe every declared server and show, per server and model, the "
        "versions the manifests ask for, the versions Triton serves, whether it is in sync, "
        "pending, held, suspended or unreachable, the last rollout, and the last applied "
        "revision. Changes nothing (the state store is only read). Exit 0, 3 when every "
        "declared server is unreachable, 1 when it cannot run. With --watch, shows instead "
        "the rollouts in progress as they run (each server's step and since when, the latest "
        "evaluation with each check's value and threshold, the analysis time left), from the "
        "state store a running reconciler writes (--state) or from a running service "
        "(--service).",
    )
    _source_options(status, repo_required=False)
    status.add_argument(
        "--watch", action="store_true", help="follow the rollouts in progress (Ctrl-C ends)"
    )
    status.add_argument(
        "--service", metavar="URL", help="with --watch: read a running service's GET /status"
    )
    _token_file_option(status)
    status.add_argument(
        "--every", type=float, default=1.0, metavar="SECONDS", help="with --watch: refresh (1)"
    )

    run = commands.add_parser(
        "run",
        help="reconcile continuously: schedule, webhooks, self-heal, /metrics",
        description="Run as a service: a pass every --interval (with jitter, never two at "
        "once), another at once on a verified webhook (GitHub X-Hub-Signature-256, GitLab "
        "X-Gitlab-Token, or POST /reconcile with a bearer token), and a cheap watch of every "
        "server between passes so a restarted server or a hand-unloaded model is restored "
        "within seconds. Serves /metrics, /healthz and /readyz on --listen. SIGTERM or SIGINT "
        "finishes the change in progress and exits 0.",
    )
    _source_options(run)
    service = run.add_argument_group("service")
    service.add_argument(
        "--interval", type=float, default=60.0, metavar="SECONDS", help="between passes (60)"
    )
    service.add_argument(
        "--jitter", type=float, default=5.0, metavar="SECONDS", help="random delay added (5)"
    )
    service.add_argument(
        "--listen",
        default="127.0.0.1:9090",
        metavar="HOST:PORT",
        help="address for webhooks, /metrics, /healthz, /readyz (127.0.0.1:9090)",
    )
    service.add_argument(
        "--watch-interval",
        type=float,
        default=3.0,
        metavar="SECONDS",
        help="how often each server is checked between passes (3)",
    )
    service.add_argument(
        "--shutdown-deadline",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="longest wait at shutdown for the change in progress (60)",
    )
    service.add_argument(
        "--dry-run", action="store_true", help="plan and report every pass; change nothing"
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
    for name, command in commands.choices.items():
        _log_options(command, "json" if name == "run" else "text")
        # after the command too; absent unless given, so that the global one is kept
        command.add_argument(
            "--config", type=Path, metavar="FILE", default=argparse.SUPPRESS, help=_CONFIG_HELP
        )
    parser.commands = dict(commands.choices)
    return parser


def _log_options(command: argparse.ArgumentParser, default_format: str) -> None:
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
        help="least severe record logged (info); debug also shows run's scheduler lines",
    )


def _secret(file: Path | None, variable: str) -> str | None:
    """A secret from a mounted file, else from the environment; never from a flag's value."""
    if file is not None:
        return file.read_text().strip() or None
    return os.environ.get(variable) or None


# The environment variable each of run's secrets is read from without its file.
_SECRET_VARIABLES = {
    "github_secret": "TRITON_GITOPS_GITHUB_SECRET",
    "gitlab_token": "TRITON_GITOPS_GITLAB_TOKEN",
    "reconcile_token": "TRITON_GITOPS_RECONCILE_TOKEN",
}


def parse_arguments(
    argv: Sequence[str], environ: Mapping[str, str], config: ConfigFile | None = None
) -> argparse.Namespace:
    """The command line, with the defaults the environment and the config file give (see
    ``adapters/options.py``); ``config``: that file, already read (else --config's or
    $TRITON_GITOPS_CONFIG's). OptionSourceError for a file or variable that cannot be used;
    usage errors exit 1 (argparse)."""
    parser = build_parser()
    if config is None:
        path = config_path(argv, environ)
        config = read_config_file(path) if path is not None else None
    if config is not None:
        refuse_unknown_keys(config, known_keys(parser.commands))
    command = command_in(argv, parser.commands)
    if command is not None:
        take_defaults(parser.commands[command], environ, config)
    return parser.parse_args(argv)


def _validate(args: argparse.Namespace) -> int:
    try:
        # Validate never asks a Prometheus: promql queries were parsed with the manifests;
        # that the reconciler needs one to run them is a warning unless --prometheus-url
        # says it will have one.
        reading = read_manifests(
            manifest_files_in(args.dir),
            lambda name: read_in_directory(args.dir, name, MAX_SHADOW_FILE_BYTES),
            prometheus=True,
        )
    except ValidationError as exc:  # no such directory
        reading = ManifestReading(DesiredState.build([], []), tuple(exc.problems))
    if args.prometheus_url is None:
        syntax_only = "where the reconciler runs them (validate checked their syntax only)"
        said = [
            Problem(p.file, p.line, f"{p.message} {syntax_only}")
            for p in promql_without_prometheus(reading.desired)
        ]
        reading = replace(reading, warnings=tuple(sorted([*reading.warnings, *said], key=_where)))
    where = str(args.dir)
    if args.output == "github":
        annotations = validation_annotations(reading, where, path_in_work_tree(args.dir))
        if annotations:
            print(annotations)
    elif args.output == "json":
        print(json.dumps(validation_json(reading, where)))
    else:
        out, err = validation_text(reading, where)
        if err:
            print(err, file=sys.stderr)
        if out:
            print(out)
    return EXIT_ERROR if reading.problems else EXIT_OK


def _where(problem: Problem) -> tuple[str, int]:
    return problem.file, problem.line


def _diff(args: argparse.Namespace) -> int:
    try:
        manifests = wiring.review_manifests(args.repo, args.cache_dir, _git_credentials(args))
        base, head, changes = diff_refs(manifests, args.base, args.head, args.path)
    except ValidationError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        print(f"{len(exc.problems)} problem(s) at {exc.revision}", file=sys.stderr)
        return EXIT_ERROR
    except ReconcileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if args.output == "json":
        print(json.dumps(diff_json(changes, base, head), indent=2))
    elif args.output == "markdown":
        print(diff_markdown(changes, base, head))
    else:
        print(diff_text(changes, base, head))
    return EXIT_CHANGES if changes.has_changes else EXIT_OK


def _load_generator(args: argparse.Namespace) -> str | None:
    """The perf_analyzer binary to use, or None for the built-in generator."""
    if args.load_generator == "built-in":
        return None
    found = find_perf_analyzer(args.perf_analyzer)
    if found is None and (args.load_generator == "perf_analyzer" or args.perf_analyzer):
        raise ReconcileError(
            f"perf_analyzer {args.perf_analyzer or '(on PATH)'} not found; "
            "--load-generator built-in uses the gate's own"
        )
    return found


def _gate(args: argparse.Namespace) -> int:
    if not args.model_repository.is_dir():
        print(f"error: model repository {args.model_repository} is not a folder", file=sys.stderr)
        return EXIT_ERROR
    try:
        perf_analyzer = _load_generator(args)
        manifests = wiring.review_manifests(args.repo, args.cache_dir, _git_credentials(args))
        base_sha, base = desired_at(manifests, args.base, args.path)
        # Read before the head: a CI checkout read in place keeps the last commit read only.
        configs = wiring.base_configs(
            manifests,
            args.repo,
            base_sha,
            args.model_repository,
            sorted({d.model for d in base.deployments.values()}),
            args.base_model_repository,
        )
        head_sha, head = desired_at(manifests, args.head, args.path)
    except ValidationError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        print(f"{len(exc.problems)} problem(s) at {exc.revision}", file=sys.stderr)
        return EXIT_ERROR
    except ReconcileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    targets = [
        replace(t, base_config=configs.get(t.base.model) if t.base is not None else None)
        for t in gated(base, head)
        if not args.deployment or t.head.name in args.deployment or t.head.model in args.deployment
    ]
    for target in targets:
        if target.base is not None and target.base_config is None:
            print(
                f"gate: {target.head.name}: warning: the base ref's config.pbtxt is not known "
                "(--model-repository is not in --repo's checkout; --base-model-repository "
                "gives it): the old versions run with the model repository's, so a change of "
                "its inputs or outputs goes unseen",
                file=sys.stderr,
            )
    workdir = Path(tempfile.mkdtemp(prefix="triton-gitops-gate-"))
    received: list[int] = []

    def interrupted(signum: int, frame: object) -> None:
        received.append(signum)
        for taken in handlers:  # a second signal must not cut the cleanup short
            signal.signal(taken, signal.SIG_IGN)
        raise KeyboardInterrupt

    # SIGTERM (a cancelled CI job, a supervisor) ends the gate as Ctrl-C does: its server
    # killed by its pid with its process group (its stubs), its shared memory and its temp
    # folder removed. A signal's default action would leave them all behind. A SIGINT the
    # gate was started ignoring (a background job) stays ignored.
    handlers = {
        taken: signal.getsignal(taken)
        for taken in (signal.SIGTERM, signal.SIGINT)
        if signal.getsignal(taken) is not signal.SIG_IGN
    }
    for taken in handlers:
        signal.signal(taken, interrupted)
    try:
        gates, errors = _gate_each(args, targets, workdir, perf_analyzer)
    except KeyboardInterrupt:
        shutil.rmtree(workdir, ignore_errors=True)
        number = received[0] if received else signal.SIGINT
        print(
            f"gate: interrupted by {signal.Signals(number).name}: its tritonserver ended, "
            f"{workdir} removed",
            file=sys.stderr,
        )
        return 128 + number
    finally:
        for taken, handler in handlers.items():
            signal.signal(taken, handler)
    report = GateReport(base_sha, head_sha, tuple(gates))
    charts: list[str] = []
    if args.report_dir is not None:
        charts = _write_gate_reports(report, args.report_dir)
    if args.output == "json":
        print(json.dumps(gate_json(report), indent=2, allow_nan=False))
    elif args.output == "markdown":
        print(gate_markdown(report, charts), end="")
    elif args.output == "github":
        annotations = gate_annotations(report)
        if annotations:
            print(annotations)
    else:
        print(gate_text(report), end="")
    if errors:
        return EXIT_ERROR  # the servers' logs stay in the work folder the errors name
    shutil.rmtree(workdir, ignore_errors=True)
    return {
        GateVerdict.FAIL: EXIT_GATE_FAILED,
        GateVerdict.INCONCLUSIVE: EXIT_GATE_INCONCLUSIVE,
    }.get(report.verdict, EXIT_OK)


def _gate_each(
    args: argparse.Namespace, targets: list[GateTarget], workdir: Path, perf_analyzer: str | None
) -> tuple[list[ModelGate], int]:
    """Each target judged on a tritonserver of its own (its log under ``workdir``): the
    verdicts, and how many could not be judged."""
    gates: list[ModelGate] = []
    errors = 0
    for target in targets:
        print(f"gate: {target.head.name}: starting an isolated tritonserver", file=sys.stderr)
        try:
            with wiring.isolated_server(
                args.model_repository,
                workdir / target.head.name,
                tritonserver=args.tritonserver,
                perf_analyzer=perf_analyzer,
            ) as server:
                judged = run_gate(target, server)
        except (ReconcileError, LocalTritonError) as exc:
            errors += 1
            print(f"error: gate: {exc} (server log: {workdir / target.head.name})", file=sys.stderr)
            continue
        for one in judged:
            print(f"gate: {one.deployment}: {one.verdict} ({one.seconds:.1f} s)", file=sys.stderr)
        gates += judged
    return gates, errors


def _write_gate_reports(report: GateReport, folder: Path) -> list[str]:
    """gate.md, gate.json and the charts (their file names) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    charts = []
    for one in report.models:
        if one.new_figures and any(f.quantiles for f in one.new_figures):
            name = f"{one.deployment}-v{one.new_version}-latency.svg"
            try:
                (folder / name).write_text(latency_chart(one))
            except ChartUnavailable as exc:
                print(f"gate: no chart: {exc}", file=sys.stderr)
                break
            charts.append(name)
    (folder / "gate.json").write_text(
        json.dumps(gate_json(report), indent=2, allow_nan=False) + "\n"
    )
    (folder / "gate.md").write_text(gate_markdown(report, charts))
    return charts


def _git_credentials(args: argparse.Namespace) -> GitCredentials:
    return GitCredentials(
        token=_secret(getattr(args, "git_token_file", None), "TRITON_GITOPS_GIT_TOKEN"),
        username=getattr(args, "git_username", "x-access-token"),
        ssh_key=getattr(args, "git_ssh_key", None),
    )


def _settings(args: argparse.Namespace) -> Settings:
    """One settings group per option group of ``_source_options``."""
    return Settings(
        cache_dir=args.cache_dir,
        state_path=args.state,
        history_days=args.history_days,
        allow_empty=args.allow_empty,
        git=GitSettings(fetch_timeout=args.fetch_timeout, credentials=_git_credentials(args)),
        triton=TritonSettings(
            max_parallel=args.parallel,
            load_timeout=args.load_timeout,
            call_timeout=args.call_timeout,
            config_recheck=args.config_recheck,
            hosts_file=args.hosts_file,
        ),
        analysis=AnalysisSettings(prometheus_url=args.prometheus_url),
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


class _ApplyLines:
    """apply's progress on stderr (never in the report on stdout): a line as each step
    begins and ends, each evaluation as it is made, and, while a step runs long, a 'still
    loading... 40s' line every few seconds on a terminal (every 30 s in a CI log). With
    --log-format json each is a log record instead, so that every line of stderr is JSON
    (a step's end the "step" event the service logs too)."""

    def __init__(self, every: float, as_records: bool = False) -> None:
        self._every = every
        self._as_records = as_records
        self._running: dict[tuple[str, str], tuple[Step, float]] = {}
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="apply-lines", daemon=True)
        self._ticker.start()

    def _say(self, line: str, step: Step) -> None:
        if self._as_records:
            where = {"server": step.server, "model": step.model, "step": str(step.action)}
            _log.info(line, extra={"fields": where})
            return
        with self._lock:
            print(line, file=sys.stderr, flush=True)

    def started(self, step: Step, reverting: bool) -> None:
        with self._lock:
            self._running[(step.server, step.model)] = (step, time.monotonic())
        self._say(started_line(step, reverting), step)

    def evaluated(self, step: Step, evaluation: Evaluation, seconds_left: float) -> None:
        self._say(evaluation_line(step, evaluation, seconds_left), step)

    def ended(self, result: StepResult) -> None:
        with self._lock:
            self._running.pop((result.step.server, result.step.model), None)
        if self._as_records:
            log_step(result)
        else:
            self._say(progress_line(result), result.step)

    def _tick(self) -> None:
        while not self._done.wait(self._every):
            now = time.monotonic()
            with self._lock:
                running = list(self._running.values())
            for step, began in running:
                if now - began >= self._every:
                    self._say(waiting_line(step, now - began), step)

    def close(self) -> None:
        self._done.set()
        self._ticker.join()


def _tell(args: argparse.Namespace, text: str, **fields: Any) -> None:
    """Why plan or apply stopped, on stderr: a line of text, or with --log-format json an
    ERROR record like every other line there."""
    if args.log_format == "json":
        _log.error(text, extra={"fields": fields})
    else:
        print(text, file=sys.stderr)


@contextmanager
def _one_reconciler(args: argparse.Namespace, settings: Settings) -> Iterator[None]:
    """Hold the reconciler lock for a one-shot command that changes something (apply,
    undo), waiting at most --lock-timeout for another holder; ReconcileError naming it."""
    lock = wiring.reconciler_lock(settings, str(args.command))
    holder = lock.holder()
    if holder is not None and args.lock_timeout > 0:
        waiting = f"waiting up to {args.lock_timeout:g} s for the reconciler lock {lock.where}"
        if args.log_format == "json":
            _log.warning(waiting, extra={"fields": {"holder": str(holder), "pid": holder.pid}})
        else:
            print(f"{waiting}, held by {holder}", file=sys.stderr, flush=True)
    if not lock.acquire(args.lock_timeout):
        holder = lock.holder()
        raise ReconcileError(
            f"another reconciler holds the lock {lock.where}: "
            f"{holder or 'a process that just let it go'}; waited {args.lock_timeout:g} s "
            "(--lock-timeout). To ask a running service for a pass: triton-gitops "
            "reconcile --service URL"
        )
    try:
        yield
    finally:
        lock.release()


def _reconcile(args: argparse.Namespace, apply_changes: bool) -> int:
    source = Source(args.repo, args.ref, args.path)
    settings = _settings(args)
    lines = _ApplyLines(5.0 if sys.stderr.isatty() else 30.0, args.log_format == "json")
    try:
        saved = load_saved_plan(args.plan, source) if getattr(args, "plan", None) else None
        with _one_reconciler(args, settings) if apply_changes else nullcontext():
            report = reconcile(
                source,
                settings,
                wiring.ports(settings, source),
                apply_changes=apply_changes,
                progress=lines.ended,
                saved=saved,
                events=lines,
            )
    except ValidationError as exc:
        for problem in exc.problems:
            _tell(args, str(problem), file=problem.file, line=problem.line)
        _tell(
            args,
            f"{len(exc.problems)} problem(s) in the manifests at {exc.revision}; nothing applied",
            revision=exc.revision,
        )
        return EXIT_ERROR
    except ReconcileError as exc:
        _tell(args, f"error: {exc}")
        return EXIT_ERROR
    finally:
        lines.close()
    if args.output == "json":
        print(report_json(report))
    elif args.output == "markdown":
        print(plan_markdown(report.plan))
    else:
        print(report_text(report))
    if getattr(args, "out", None):
        save_plan(args.out, source, report, plan_json(report.plan), plan_steps_json(report.plan))
    if not report.ok:
        return EXIT_ERROR
    if not apply_changes and report.plan.has_changes:
        return EXIT_CHANGES
    return EXIT_OK


def _history(args: argparse.Namespace) -> int:
    if not args.state.exists():
        # Not an error: nothing was applied with this state store yet (and none is made).
        print(f"no history yet: no state store at {args.state} (apply and run write it)",
              file=sys.stderr)  # fmt: skip
        if args.output == "json":
            print(history_json([], []))
        return EXIT_OK
    with wiring.state_store(args.state, read_only=True) as store:
        rollouts = store.rollouts(args.model, args.limit)
        actions = store.operator_actions(args.model, args.limit)
    if args.output == "json":
        print(history_json(rollouts, actions))
    else:
        print(history_text(rollouts, actions))
    return EXIT_OK


def _actor(args: argparse.Namespace) -> str:
    if args.actor:
        return str(args.actor)
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _reconcile_now(args: argparse.Namespace) -> int:
    token = _secret(args.token_file, "TRITON_GITOPS_OPERATOR_TOKEN")
    if not token:
        print("error: reconcile needs --token-file (or $TRITON_GITOPS_OPERATOR_TOKEN)",
              file=sys.stderr)  # fmt: skip
        return EXIT_ERROR
    try:
        status, reply = ask_service(args.service, token, "reconcile", None)
        if status != 202:
            print(f"error: the service answered {status}: {reply.get('error', reply)}",
                  file=sys.stderr)  # fmt: skip
            return EXIT_ERROR
        print(f"reconcile: pass requested by {reply['by']}; waiting", file=sys.stderr)
        outcome = wait_for_pass(args.service, token, int(reply["after"]), args.timeout)
    except ReconcileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    revision = (outcome.get("revision") or "")[:12] or "no revision"
    print(f"pass {outcome['number']} at {revision}: {outcome['result']} "
          f"({outcome['seconds']:g} s, finished {outcome['finished_at']})")  # fmt: skip
    for failed in outcome.get("failed", []):
        where = failed["server"] + (f"/{failed['model']}" if failed.get("model") else "")
        print(f"  {where}: {failed['reason']}")
    # A held deployment is stalled, as ``flux reconcile`` fails on a stalled object: the pass
    # may have gone through, but what serves is not what Git asks until someone acts.
    held = _held_deployments(outcome.get("held", []))
    for deployment, (servers, why) in held.items():
        print(f"  held: {deployment} on {', '.join(servers)}: {why}; a commit that changes "
              f"it, `triton-gitops retry {deployment}` or `undo` lifts it")  # fmt: skip
    return EXIT_OK if outcome.get("ok") and not held else EXIT_ERROR


def _held_deployments(held: list[dict[str, Any]]) -> dict[str, tuple[list[str], str]]:
    """``GET /v1/passes/last``'s held models by deployment: its servers, and why (the failed
    revision and the first line of the reason)."""
    found: dict[str, tuple[list[str], str]] = {}
    for h in held:
        reason = (h.get("reason") or "failed").splitlines()[0]
        why = f"revision {(h.get('revision') or '')[:12]} failed: {reason}"
        found.setdefault(h["deployment"], ([], why))[0].append(h["server"])
    return found


def _operator_verb(args: argparse.Namespace) -> int:
    """suspend, resume and retry on the state store (a running service that shares it reads
    them at its next pass), or through the running service (``--service``)."""
    if args.service:
        token = _secret(args.token_file, "TRITON_GITOPS_OPERATOR_TOKEN")
        if not token:
            print("error: --service needs --token-file (or $TRITON_GITOPS_OPERATOR_TOKEN)",
                  file=sys.stderr)  # fmt: skip
            return EXIT_ERROR
        reason = getattr(args, "reason", "")
        verb = _verb(args)
        extra = _undo_body(args) if args.command == "undo" else None
        try:
            status, reply = ask_service(args.service, token, verb, args.deployment, reason, extra)
        except ReconcileError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_ERROR
        if status != 200:
            print(f"error: the service answered {status}: {reply.get('error', reply)}",
                  file=sys.stderr)  # fmt: skip
            return EXIT_ERROR
        print(reply.get("patch", ""), end="")  # undo's change
        print(f"{reply['verb']}: {reply['target']} by {reply['by']}: {reply['detail']} "
              f"({reply['pass']})")  # fmt: skip
        return EXIT_OK
    if not args.state.exists():
        # Never create one: a suspend written to a store no reconciler reads would pause
        # nothing while saying it did.
        print(
            f"error: no state store at {args.state}: give the reconciler's --state",
            file=sys.stderr,
        )
        return EXIT_ERROR
    verb = _verb(args)
    with wiring.state_store(args.state) as store:
        # A typo in the name would suspend nothing that exists; said, not refused: a
        # suspension may come before the first apply.
        named = args.deployment if verb in ("suspend", "resume") else None
        if named and never_applied(store, named):
            print(f"note: no pass has applied a ModelDeployment named {named!r} yet",
                  file=sys.stderr)  # fmt: skip
        done = give(store, verb, args.deployment, _actor(args), getattr(args, "reason", ""))
    return _said(done)


def _said(done: VerbDone) -> int:
    """A verb's outcome in the local mode's words: a line on stdout, or why not on stderr."""
    if done.refused:
        if done.verb == "retry":
            why = f"is not held (held: {', '.join(done.held) or 'none'})"
        elif done.verb == "resume":
            why = "is not suspended"
        else:
            going = ", ".join(done.in_progress) or "none"
            print(f"error: no rollout of {done.what} is in progress (in progress: {going})",
                  file=sys.stderr)  # fmt: skip
            return EXIT_ERROR
        print(f"error: {done.what} {why}", file=sys.stderr)
        return EXIT_ERROR
    record = done.record
    if isinstance(record, OperatorOrder):
        print(f"{record.kind}: {done.what}: given by {record.by} at {record.at}; the "
              f"reconciler applying it obeys within {ORDERS_EVERY:g} s")  # fmt: skip
    elif isinstance(record, Hold):
        reason = record.reason.strip().splitlines()[0] if record.reason else "failed"
        print(f"retry: the hold on {done.what} (revision {record.revision[:12]}: {reason}) is "
              "lifted; the next pass tries the same spec again")  # fmt: skip
    elif done.verb == "resume":
        print(f"resumed: {done.what} (was {record})")
        if done.still_suspended:
            print("still suspended: " + "; ".join(map(str, done.still_suspended)))
    else:
        print(f"suspended: {record}")
    return EXIT_OK


def _undo_body(args: argparse.Namespace) -> dict[str, Any]:
    return {
        **({"toRevision": args.to_revision} if args.to_revision else {}),
        **({"dryRun": True} if args.dry_run else {}),
    }


def _undo(args: argparse.Namespace) -> int:
    """undo one-shot (--repo, --state) or through the service (``_operator_verb``)."""
    if args.service:
        return _operator_verb(args)
    if not args.repo:
        print("error: undo needs --repo (one-shot) or --service", file=sys.stderr)
        return EXIT_ERROR
    if not args.state.exists():  # as the other verbs: never create one
        print(f"error: no state store at {args.state}: give the reconciler's --state",
              file=sys.stderr)  # fmt: skip
        return EXIT_ERROR
    source, settings = Source(args.repo, args.ref, args.path), _settings(args)
    request = UndoRequest(
        args.deployment, _actor(args), args.to_revision, args.reason, args.dry_run
    )
    try:
        # A dry run pushes nothing: it needs no lock.
        with nullcontext() if args.dry_run else _one_reconciler(args, settings):
            done = undo(request, source, settings, wiring.ports(settings, source))
    except ReconcileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if args.dry_run:
        print(done.patch, end="")
        print(f"undo: {done}", file=sys.stderr)
    else:
        print(f"undo: {done}; the next pass applies it")
    return EXIT_OK


def _verb(args: argparse.Namespace) -> str:
    """The verb as the service's API names it (``promote --full``: promote-full)."""
    return str(OrderKind.PROMOTE_FULL) if getattr(args, "full", False) else str(args.command)


def _watch_status(args: argparse.Namespace) -> int:
    """status --watch: the live view, redrawn on a terminal; elsewhere printed each time it
    changes (one block per change, for logs). Runs until interrupted."""
    token = _secret(args.token_file, "TRITON_GITOPS_OPERATOR_TOKEN") if args.service else None
    if args.service and not token:
        print("error: --service needs --token-file (or $TRITON_GITOPS_OPERATOR_TOKEN)",
              file=sys.stderr)  # fmt: skip
        return EXIT_ERROR
    if not args.service and not args.state.exists():
        print(f"error: no state store at {args.state}: give the reconciler's --state",
              file=sys.stderr)  # fmt: skip
        return EXIT_ERROR
    terminal, shown = sys.stdout.isatty(), ""
    # SIGTERM ends it as Ctrl-C does (a process started in the background by a shell that
    # has no job control ignores SIGINT, so a supervisor or a script sends SIGTERM).
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        while True:
            try:
                if args.service:
                    snapshot = live_status(args.service, str(token)).get("in_progress")
                else:
                    with wiring.state_store(args.state, read_only=True) as store:
                        snapshot = store.live()
                    # Written by a reconciler that no longer runs (killed mid-pass): the
                    # lock is the kernel's word on that, whatever the snapshot says.
                    if snapshot and wiring.lock_holder(args.state) is None:
                        snapshot = {**snapshot, "abandoned": True}
            except ReconcileError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return EXIT_ERROR
            if args.output == "json":
                text = json.dumps(snapshot or {"rollouts": []}, sort_keys=True)
            else:
                text = live_text(snapshot, time.time())
            if terminal:
                print("\x1b[H\x1b[2J" + text, flush=True)  # redraw in place
            elif _without_clock(text) != _without_clock(shown):
                print(text + ("\n" if args.output != "json" else ""), flush=True)
            shown = text
            time.sleep(args.every)
    except KeyboardInterrupt:
        return EXIT_OK


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _without_clock(text: str) -> str:
    """The live view less what changes every second (durations): a log gets a block only
    when a step, a state or an evaluation changed."""
    return re.sub(r"\d+s( left)?\b|updated \S+", "", text)


def _status(args: argparse.Namespace) -> int:
    if args.watch:
        return _watch_status(args)
    if not args.repo:
        print("error: status needs --repo (or --watch)", file=sys.stderr)
        return EXIT_ERROR
    try:
        source, settings = Source(args.repo, args.ref, args.path), _settings(args)
        report = status(source, settings, wiring.ports(settings, source))
    except ReconcileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(status_json(report) if args.output == "json" else status_text(report))
    if report.no_server_reached:
        print("error: no declared server answered", file=sys.stderr)
        return EXIT_NO_SERVER
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
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
        print(f"error: secret file: {exc}", file=sys.stderr)
        return EXIT_ERROR
    current = secrets.current()

    def secret(name: str) -> str | None:
        return current[name] if name in current else os.environ.get(_SECRET_VARIABLES[name])

    settings = _settings(args)
    try:
        lock = wiring.reconciler_lock(settings, "run")
    except ReconcileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
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


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_arguments(arguments, os.environ)
    except OptionSourceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    try:
        return _command(args)
    except StateFileRefused as exc:  # any command that opens the state store
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _command(args: argparse.Namespace) -> int:
    if args.command == "run":
        return _run(args)
    # Log records (alerts, each failure of a pass) go to stderr, as text or JSON lines.
    configure_logging(args.log_format, args.log_level)
    if args.command == "validate":
        return _validate(args)
    if args.command == "history":
        return _history(args)
    if args.command == "status":
        return _status(args)
    if args.command == "diff":
        return _diff(args)
    if args.command == "gate":
        return _gate(args)
    if args.command in ("suspend", "resume", "retry", "abort", "promote"):
        return _operator_verb(args)
    if args.command == "undo":
        return _undo(args)
    if args.command == "reconcile":
        return _reconcile_now(args)
    if args.command == "digest":
        try:
            print(tree_digest(args.path))
        except ReconcileError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_ERROR
        return EXIT_OK
    return _reconcile(args, apply_changes=args.command == "apply")
