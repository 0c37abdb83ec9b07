"""``load_desired_state``: manifest files to a DesiredState, or a
ValidationError listing every problem.
"""

from __future__ import annotations

from collections.abc import Mapping

from reconciler.core.spec.build import _build_deployment, _build_router, _build_server
from reconciler.core.spec.rules import _cross_check, _dependency_problems, _traffic_problems
from reconciler.core.spec.schema import API_VERSION, KIND_SCHEMAS, _schema_message, _validators
from reconciler.core.spec.yaml import _Document, _documents, plain
from reconciler.model.errors import Problem, ValidationError
from reconciler.model.spec import DesiredState, ModelDeployment, TritonServer
from reconciler.model.traffic import RouterSpec


def load_desired_state(files: Mapping[str, bytes]) -> DesiredState:
    """Parse, validate and cross-check manifests; raise ValidationError with every problem."""
    problems: list[Problem] = []
    servers: list[tuple[_Document, TritonServer]] = []
    deployments: list[tuple[_Document, ModelDeployment]] = []
    routers: list[tuple[_Document, RouterSpec]] = []
    validators = _validators()
    for doc in _documents(files, problems):
        api_version, kind = doc.root.get("apiVersion"), doc.root.get("kind")
        if api_version != API_VERSION:
            problems.append(
                doc.problem(
                    ("apiVersion",),
                    f"unknown apiVersion {api_version!r} (expected {API_VERSION!r})"
                    if api_version is not None
                    else "apiVersion is required",
                )
            )
            continue
        if not isinstance(kind, str) or kind not in KIND_SCHEMAS:
            problems.append(
                doc.problem(
                    ("kind",),
                    f"unknown kind {kind!r} (expected one of {', '.join(sorted(KIND_SCHEMAS))})",
                )
            )
            continue
        data = plain(doc.root)
        errors = sorted(
            validators[kind].iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path]
        )
        if errors:
            problems.extend(doc.problem(tuple(e.absolute_path), _schema_message(e)) for e in errors)
            continue
        if kind == "TritonServer":
            servers.append((doc, _build_server(doc, data)))
        elif kind == "Router":
            routers.append((doc, _build_router(doc, data)))
        else:
            deployments.append((doc, _build_deployment(doc, data, problems)))
    problems.extend(_cross_check(servers, deployments))
    problems.extend(_dependency_problems(deployments))
    problems.extend(_traffic_problems(servers, deployments, routers))
    if problems:
        raise ValidationError(problems)
    return DesiredState.build(
        [s for _, s in servers], [d for _, d in deployments], [r for _, r in routers]
    )
