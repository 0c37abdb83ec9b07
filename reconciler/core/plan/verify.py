"""The verify step of a model's change: what is asked of new versions before the old ones
go (READY, smoke cases, the interface, a shadow replay, a synthesized request or stream), as
the planner (``core/plan/changes.py``) puts it in a change. Pure.
"""

from __future__ import annotations

from reconciler.core.plan.revert import sorted_versions
from reconciler.model.plan import Action, Step
from reconciler.model.spec import ModelDeployment


def verify_step(
    server: str,
    deployment: ModelDeployment,
    desired: frozenset[int],
    smoke_versions: frozenset[int],
    check_interface: bool,
    old_version: int | None = None,
    streaming: bool = False,
    sequence: bool = False,
) -> Step:
    notes = [f"{', '.join(map(str, sorted(desired)))} READY"]
    if deployment.smoke:
        notes.append(
            f"{len(deployment.smoke)} smoke case(s) against "
            f"{', '.join(map(str, sorted(smoke_versions)))}"
        )
    interface = check_interface and not deployment.allow_interface_change
    if interface:
        notes.append("inputs and outputs as the old versions'")
    shadow = deployment.shadow if old_version is not None else None
    if shadow is not None:
        notes.append(
            f"replay {len(shadow.requests)} recorded request(s) on {old_version} and the new "
            f"version(s): agreement >= {shadow.min_agreement:g}"
        )
    # Nothing else declared asks the new versions a question: one request synthesized from
    # the model's inputs, which the old version answers, must be answered (an analysis
    # probes on its own, from its start). A streaming model's analysis with its probes off
    # sees nothing of an error inside a stream: Triton's counters count it a success and a
    # router sees the gRPC stream end OK (a version that failed every stream went through
    # both canary steps, bench.streaming), so verify asks it. A unary model's error
    # responses show in the router's statistics: its clients judge it there.
    watched = deployment.analysis is not None and (
        deployment.analysis.probes.enabled or not streaming
    )
    probe = (
        old_version
        if old_version is not None and not deployment.smoke and shadow is None and not watched
        else None
    )
    if probe is not None:
        notes.append(
            f"a {'stream' if streaming else 'request'} synthesized from the inputs, if {probe} "
            f"answers it, answered by {', '.join(map(str, sorted(smoke_versions)))}"
        )
    if streaming:
        notes.append("a streaming model: asked by gRPC streams")
    elif sequence:
        notes.append("a sequence model: each question asked as a whole sequence of its own")
    return Step(
        server,
        deployment.model,
        Action.VERIFY,
        sorted_versions(desired),
        "; ".join(notes),
        smoke=deployment.smoke,
        smoke_versions=sorted_versions(smoke_versions),
        timeout=deployment.verify_timeout,
        interface_check=interface,
        shadow=shadow,
        shadow_against=old_version if shadow is not None else None,
        probe_against=probe,
        streaming=streaming,
        sequence=sequence,
    )
