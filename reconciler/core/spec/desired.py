"""Manifest files to a DesiredState: ``read_manifests`` runs every stage (YAML, schema,
builders, cross-document references, shadow request files, analysis sources) on whatever
could be built and gives every problem of every stage at once; ``load_desired_state`` is
the same, raising a ValidationError when there is any.

Documents of other tools (a Kubernetes Deployment, a CI file that slipped through the
selection) are left alone and counted (``yaml.other_tool`` says which are).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import jsonschema

from reconciler.core.spec.build import build_deployment, build_router, build_server
from reconciler.core.spec.rules import (
    Unbuilt,
    analysis_source_problems,
    cross_check,
    dependency_problems,
    evidence_warnings,
    stream_case_problems,
    traffic_problems,
)
from reconciler.core.spec.schema import (
    API_VERSION,
    KIND_SCHEMAS,
    LEGACY_API_VERSION,
    as_mapping,
    kind_validators,
)
from reconciler.core.spec.shadow import attach_shadow_requests
from reconciler.core.spec.typos import did_you_mean, schema_problems
from reconciler.core.spec.yaml import Document, plain, yaml_documents
from reconciler.model.errors import ValidationError
from reconciler.model.problems import Problem
from reconciler.model.servers import TritonServer
from reconciler.model.spec import DesiredState, ManifestReading, ModelDeployment
from reconciler.model.traffic import RouterSpec


def read_manifests(
    files: Mapping[str, bytes],
    read_file: Callable[[str], bytes | None] | None = None,
    *,
    prometheus: bool | None = None,
) -> ManifestReading:
    """Every stage on what could be built, every problem at once.

    ``read_file`` gives a file of the revision by its path under the manifest folder (for
    shadow request files; None: they are not read). ``prometheus``: whether the analyses
    may read Prometheus (None: their metric sources are not checked).
    """
    problems: list[Problem] = []
    warnings: list[Problem] = []
    ignored: dict[str, list[str]] = {}
    servers: list[tuple[Document, TritonServer]] = []
    deployments: list[tuple[Document, ModelDeployment]] = []
    routers: list[tuple[Document, RouterSpec]] = []
    unbuilt = Unbuilt()
    validators = kind_validators()
    documents = 0
    for doc in yaml_documents(files, problems, ignored):
        documents += 1
        api_version, kind = doc.root.get("apiVersion"), doc.root.get("kind")
        if api_version is None:
            problems.append(doc.problem((), f"apiVersion is required (apiVersion: {API_VERSION})"))
            continue
        if api_version not in (API_VERSION, LEGACY_API_VERSION):
            problems.append(
                doc.problem(
                    ("apiVersion",),
                    f"unknown apiVersion {api_version!r} (expected {API_VERSION!r})",
                )
            )
            continue
        if api_version == LEGACY_API_VERSION:
            warnings.append(
                doc.problem(
                    ("apiVersion",),
                    f"apiVersion {LEGACY_API_VERSION!r} is deprecated: write "
                    f"apiVersion: {API_VERSION} (a Kubernetes API group needs a DNS name)",
                )
            )
        if not isinstance(kind, str) or kind not in KIND_SCHEMAS:
            problems.append(
                doc.problem(
                    ("kind",),
                    f"unknown kind {kind!r}{did_you_mean(str(kind), KIND_SCHEMAS)} "
                    f"(expected one of {', '.join(sorted(KIND_SCHEMAS))})",
                )
            )
            continue
        data = plain(doc.root)
        errors = sorted(
            validators[kind].iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path]
        )
        if errors:
            problems.extend(doc.problem(path, message) for path, message in schema_problems(errors))
            salvaged = _salvaged(validators[kind], data, errors)
            if salvaged is None:
                unbuilt.add(kind, data)
                continue
            data = salvaged
        if kind == "TritonServer":
            servers.append((doc, build_server(doc, data, problems)))
        elif kind == "Router":
            routers.append((doc, build_router(doc, data)))
        else:
            deployments.append((doc, build_deployment(doc, data, problems)))
    problems.extend(cross_check(servers, deployments, unbuilt))
    problems.extend(dependency_problems(deployments, unbuilt))
    problems.extend(traffic_problems(servers, deployments, routers, unbuilt))
    problems.extend(stream_case_problems(deployments))
    warnings.extend(evidence_warnings(deployments))
    desired = DesiredState.build(
        [s for _, s in servers], [d for _, d in deployments], [r for _, r in routers]
    )
    if read_file is not None:
        try:
            desired = attach_shadow_requests(desired, read_file)
        except ValidationError as exc:
            problems.extend(exc.problems)
    if prometheus is not None:
        problems.extend(analysis_source_problems(desired, prometheus=prometheus))
    return ManifestReading(
        desired,
        tuple(sorted(problems, key=lambda p: (p.file, p.line, p.message))),
        tuple(sorted(warnings, key=lambda p: (p.file, p.line))),
        {file: tuple(found) for file, found in sorted(ignored.items())},
        documents,
    )


# How many times the refused values are taken out before a document is given up on (taking a
# value out can leave a list or an object too small, which is then taken out in turn).
_SALVAGE_ROUNDS = 3


def _salvaged(
    validator: jsonschema.protocols.Validator,
    data: dict[str, Any],
    errors: list[jsonschema.ValidationError],
) -> dict[str, Any] | None:
    """The document with the values the schema refused taken out, when what is left is
    valid (the schema's defaults stand in for them), so that the cross-document, shadow and
    analysis checks still see it: one wrong value does not hide the next batch of problems.
    None when a part that cannot go is wrong (a required field, a whole object)."""
    for _ in range(_SALVAGE_ROUNDS):
        data = copy.deepcopy(data)
        gone: list[tuple[str | int, ...]] = []  # values taken out (with all below them)
        # The deepest and last first, so that taking out a list item moves no other path.
        for error in sorted(errors, key=_path_order, reverse=True):
            path = tuple(error.absolute_path)
            if any(path[: len(taken)] == taken for taken in gone):
                continue  # a second error about a value taken out already
            taken_out = _take_out(data, error)
            if taken_out is None:
                return None
            gone.append(taken_out)
        errors = list(validator.iter_errors(data))
        if not errors:
            return data
    return None


def _path_order(error: jsonschema.ValidationError) -> list[tuple[int, str]]:
    # List indices compare as numbers (10 after 9), keys as text.
    return [(p, "") if isinstance(p, int) else (-1, str(p)) for p in error.absolute_path]


def _take_out(
    data: dict[str, Any], error: jsonschema.ValidationError
) -> tuple[str | int, ...] | None:
    """Take out of ``data`` what ``error`` refuses: the path of what went (its keys'
    path for unexpected keys), or None when it cannot go."""
    path = tuple(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        holder = _at(data, path)
        if not isinstance(holder, dict):
            return None
        declared = as_mapping(error.schema).get("properties", {})
        for key in [k for k in error.instance if k not in declared]:
            holder.pop(key, None)
        return (*path, "\0")  # no other error's path: the object itself stays
    target = _at(data, path[:-1])
    if not path or (isinstance(error.instance, dict) and not isinstance(target, list)):
        return None  # a whole object is wrong: nothing sensible is left
    in_list = isinstance(target, list) and isinstance(path[-1], int) and path[-1] < len(target)
    if not (in_list or (isinstance(target, dict) and path[-1] in target)):
        return None
    del target[path[-1]]
    return path


def _at(data: Any, path: tuple[str | int, ...]) -> Any:
    for step in path:
        try:
            data = data[step]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def load_desired_state(files: Mapping[str, bytes]) -> DesiredState:
    """Parse, validate and cross-check manifests; raise ValidationError with every problem."""
    reading = read_manifests(files)
    if reading.problems:
        raise ValidationError(list(reading.problems))
    return reading.desired
