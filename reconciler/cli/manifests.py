"""The commands that read manifests and model folders only, never a server: ``validate`` (a
folder), ``diff`` (two refs) and ``digest`` (a model version folder).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from ruamel.yaml import YAML

from reconciler.adapters.files import manifest_files_in, read_in_directory
from reconciler.adapters.git import path_in_work_tree
from reconciler.adapters.model_repository import folder_digest
from reconciler.cli.options import default_cache, git_credentials, two_refs
from reconciler.cli.shell import (
    EXIT_CHANGES,
    EXIT_ERROR,
    EXIT_OK,
    Command,
    Commands,
    print_as,
    problems_at,
)
from reconciler.core.spec.crds import crds
from reconciler.core.spec.desired import read_manifests
from reconciler.core.spec.rules import promql_without_prometheus
from reconciler.core.spec.shadow import MAX_SHADOW_FILE_BYTES
from reconciler.loop.review import diff_refs
from reconciler.model.errors import ValidationError
from reconciler.model.problems import Problem
from reconciler.model.spec import DesiredState, ManifestReading
from reconciler.views.review import diff_json, diff_markdown, diff_text
from reconciler.views.validation import validation_annotations, validation_json, validation_text


def _declare_validate(commands: Commands) -> None:
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
    print_as(
        args.output,
        {
            "github": lambda: (
                validation_annotations(reading, where, path_in_work_tree(args.dir)) or None
            ),
            "json": lambda: json.dumps(validation_json(reading, where)),
            "text": lambda: _text_and_warnings(reading, where),
        },
    )
    return EXIT_ERROR if reading.problems else EXIT_OK


def _text_and_warnings(reading: ManifestReading, where: str) -> str | None:
    """validate's text: the warnings on stderr, what it found on stdout."""
    out, err = validation_text(reading, where)
    if err:
        print(err, file=sys.stderr)
    return out or None


def _where(problem: Problem) -> tuple[str, int]:
    return problem.file, problem.line


def _declare_diff(commands: Commands) -> None:
    diff_command = commands.add_parser(
        "diff",
        help="what a change does to the desired state; no servers needed",
        description="Compare the manifests at two refs: per server and model, versions added "
        "and removed, config fields changed, servers added or removed, models unloaded, and "
        "warnings a reviewer must see. Needs no Triton server. Exit 0 no change, 2 changes, "
        "1 error.",
    )
    two_refs(diff_command)
    diff_command.add_argument("--output", choices=("text", "json", "markdown"), default="text")
    diff_command.add_argument("--cache-dir", type=Path, default=default_cache())


def _diff(args: argparse.Namespace) -> int:
    from reconciler import wiring  # late: see cli/__init__.py

    try:
        manifests = wiring.review_manifests(args.repo, args.cache_dir, git_credentials(args))
        base, head, changes = diff_refs(manifests, args.base, args.head, args.path)
    except ValidationError as exc:
        return problems_at(exc)
    print_as(
        args.output,
        {
            "json": lambda: json.dumps(diff_json(changes, base, head), indent=2),
            "markdown": lambda: diff_markdown(changes, base, head),
            "text": lambda: diff_text(changes, base, head),
        },
    )
    return EXIT_CHANGES if changes.has_changes else EXIT_OK


def _declare_digest(commands: Commands) -> None:
    digest = commands.add_parser(
        "digest",
        help="print the digest of a model version folder, to pin in a manifest",
        description="Print the sha256 file-tree digest of a model version folder (e.g. "
        "models/echo/3, or s3://bucket/models/echo/3 read from the bucket), as spec.versions "
        "entries pin it: {version: 3, digest: sha256:...}. The reconciler recomputes it "
        "before every load when it can read the model repository, and refuses a version "
        "whose folder changed.",
    )
    digest.add_argument("path", metavar="PATH|URL")


def _digest(args: argparse.Namespace) -> int:
    print(folder_digest(args.path))
    return EXIT_OK


def _declare_crds(commands: Commands) -> None:
    commands.add_parser(
        "crds",
        help="print the CustomResourceDefinitions of the manifests' kinds",
        description="Print the CustomResourceDefinitions of TritonServer, ModelDeployment and "
        "Router, generated from the JSON Schemas, as YAML documents: for a cluster where "
        "`kubectl explain` and `kubectl apply --dry-run=server` should know the manifests "
        "(triton-gitops crds | kubectl apply -f -). The reconciler reads the manifests from "
        "Git, never these objects from the API server.",
    )


def _crds(args: argparse.Namespace) -> int:
    yaml = YAML()
    yaml.default_flow_style = False
    yaml.width = 100
    yaml.dump_all(crds(), sys.stdout)
    return EXIT_OK


COMMANDS = {
    "validate": Command(_declare_validate, _validate),
    "crds": Command(_declare_crds, _crds),
    "diff": Command(_declare_diff, _diff),
    "digest": Command(_declare_digest, _digest),
}
