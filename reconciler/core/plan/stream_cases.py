"""A smoke case that expects a stream (``stream:``) on a model that does not stream, refused
by the plan before anything is loaded, naming the manifest's file and the case's line.

Which models stream is read from the config the plan knows (``changes.target_config``): the
live one once loaded, else the repository's config.pbtxt with spec.config over it. A model
that does not stream answers each request with one response, which a case's ``stream``
(responses, each, deadline) cannot judge; verify would ask it by a unary call and judge the
case by something it did not declare. ``validate`` refuses the same where spec.config alone
says so (``core/spec/rules.py``, ``stream_case_problems``). The reverse (a streaming model
whose case has no ``stream``) is accepted: its ``expect`` judges the stream reassembled, and
a stream of one response reassembles to that response, so no ``expect`` a single response can
meet is one a stream cannot. Called by ``core/plan/changes.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconciler.core.triton_config import streams
from reconciler.model.plan import PlanProblem
from reconciler.model.serving import ModelState
from reconciler.model.spec import ModelDeployment


def stream_case_refusal(
    server: str, deployment: ModelDeployment, model: ModelState, target: Mapping[str, Any]
) -> PlanProblem | None:
    """The smoke cases with ``stream`` on a model ``target`` says does not stream, refused."""
    if streams(target):
        return None
    cases = [(i, c) for i, c in enumerate(deployment.smoke) if c.stream is not None]
    if not cases:
        return None
    where = deployment.location.file
    named = ", ".join(
        f"{where}:{deployment.line(f'verify.smoke.{i}')}: smoke case {case.name!r}"
        for i, case in cases
    )
    source = (
        "its live config"
        if model.loaded_config is not None
        else "config.pbtxt in the model repository"
        if model.repository_config is not None
        else "spec.config"
    )
    return PlanProblem(
        server,
        deployment.model,
        f"{named} expect(s) a stream (stream:), but {deployment.model} does not stream: "
        f"{source} has no model_transaction_policy {{ decoupled: true }}, so Triton answers "
        "each request with one response, which stream: cannot judge; refused before anything "
        "is loaded (remove stream:, or, for a model that sets the policy in its "
        "auto-complete, declare model_transaction_policy: {decoupled: true} in spec.config)",
    )
