"""Shadow request files named by ModelDeployments, attached to the
desired state (read through a function the caller gives).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

import jsonschema

from reconciler.core.spec.schema import kind_validators, schema_documents, schema_message
from reconciler.core.spec.smoke_cases import flat
from reconciler.model.errors import ValidationError
from reconciler.model.problems import Problem
from reconciler.model.spec import DesiredState, Tensor

MAX_SHADOW_REQUESTS = 10_000
MAX_SHADOW_FILE_BYTES = 64 << 20


def attach_shadow_requests(
    desired: DesiredState, read: Callable[[str], bytes | None]
) -> DesiredState:
    """Read every ModelDeployment's shadow requests file (``read`` gives a file of the
    revision, or None) into its spec; every problem as FILE:LINE."""
    problems: list[Problem] = []
    tensor = {"$ref": schema_documents()["common.schema.json"]["$id"] + "#/$defs/tensor"}
    validator = jsonschema.Draft202012Validator(
        {"type": "object", "required": ["inputs"],
         "properties": {"inputs": {"type": "object", "minProperties": 1,
                                   "additionalProperties": tensor}}},
        registry=kind_validators()["ModelDeployment"]._registry,
    )  # fmt: skip
    deployments = []
    for deployment in desired.deployments.values():
        shadow = deployment.shadow
        if shadow is None:
            deployments.append(deployment)
            continue
        content = read(shadow.requests_file)
        if content is None or len(content) > MAX_SHADOW_FILE_BYTES:
            problems.append(
                Problem(
                    shadow.location.file,
                    shadow.location.line,
                    f"shadow requests file {shadow.requests_file!r} is not in the repository "
                    f"as a regular file (absent, a symbolic link or over {MAX_SHADOW_FILE_BYTES} "
                    "bytes)",
                )
            )
            continue
        requests = []
        for number, line in enumerate(content.decode("utf-8", "replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                request = json.loads(line)
            except (ValueError, RecursionError) as exc:
                # json refuses deep nesting with RecursionError: a bomb, not a crash.
                why = "nested too deeply" if isinstance(exc, RecursionError) else exc
                problems.append(Problem(shadow.requests_file, number, f"not JSON: {why}"))
                continue
            errors = list(validator.iter_errors(request))
            if errors:
                problems.extend(
                    Problem(shadow.requests_file, number, schema_message(e)) for e in errors
                )
                continue
            requests.append(
                tuple(
                    Tensor(name, t["datatype"], tuple(t["shape"]), tuple(flat(t["data"])))
                    for name, t in request["inputs"].items()
                )
            )
        if len(requests) > MAX_SHADOW_REQUESTS:
            problems.append(
                Problem(shadow.requests_file, 1, f"more than {MAX_SHADOW_REQUESTS} requests")
            )
        deployments.append(replace(deployment, shadow=replace(shadow, requests=tuple(requests))))
    if problems:
        raise ValidationError(problems)
    return DesiredState.build(
        list(desired.servers.values()), deployments, list(desired.routers.values())
    )
