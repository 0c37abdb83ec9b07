"""A smoke case that expects a stream (``stream:``) on a model that does not stream, refused
(and a streaming model's latency check with the probes off: ``unprobed_latency_refusal``)
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

from collections.abc import Callable, Mapping
from typing import Any

from reconciler.core.triton_config import streams
from reconciler.model.plan import PlanProblem
from reconciler.model.serving import ModelState
from reconciler.model.spec import ModelDeployment


def stream_case_refusal(
    server: str,
    deployment: ModelDeployment,
    model: ModelState,
    target: Callable[[], Mapping[str, Any]],
) -> PlanProblem | None:
    """The smoke cases with ``stream`` on a model ``target()`` says does not stream,
    refused (``target`` is asked only where there are such cases)."""
    cases = [(i, c) for i, c in enumerate(deployment.smoke) if c.stream is not None]
    if not cases or streams(target()):
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


def unprobed_latency_refusal(
    server: str, deployment: ModelDeployment, target: Callable[[], Mapping[str, Any]]
) -> PlanProblem | None:
    """A latency check on a streaming model whose analysis turns its probes off, refused:
    the probes' streams are its only measure (Triton 2.51's counters do not time a stream),
    so it could never be judged."""
    analysis = deployment.analysis
    if analysis is None or analysis.probes.enabled or not streams(target()):
        return None
    latency = [i for i, c in enumerate(analysis.checks) if c.kind == "latency"]
    if not latency:
        return None
    where = deployment.location.file
    named = ", ".join(
        f"{where}:{deployment.line(f'verify.analysis.checks.{i}', 'verify.analysis')}: "
        f"check {analysis.checks[i].name!r}"
        for i in latency
    )
    return PlanProblem(
        server,
        deployment.model,
        f"{named} judge(s) the latency of {deployment.model}, a streaming model, but "
        f"{where}:{deployment.line('verify.analysis.probes', 'verify.analysis')} turns the "
        "probes off: a stream's time to the first response and between responses are "
        "measured on the probes' streams alone (Triton's counters do not time a stream), so "
        "the check could never be judged; refused before anything is loaded (turn the "
        "probes on, or judge latency with a promql check on the backend's metrics)",
    )
