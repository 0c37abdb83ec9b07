"""One model on one server: the change that brings what it serves to
what its ModelDeployment declares (load beside, verify, analyze, unload; or swap in place),
its revert steps, its failure policy (``Step.on_failure``), and the problems that stop it
(a version the repository lacks, a changed artifact, a change of the interface clients see, no
memory headroom).
Called by ``core/plan/planner.py`` and ``core/plan/held.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from reconciler.core.interface import config_interface, interface_part
from reconciler.core.latency import old_under_load
from reconciler.core.plan.heal import heal_change
from reconciler.core.plan.revert import put_back_unloaded, revert_steps, sorted_versions
from reconciler.core.plan.stream_cases import stream_case_refusal, unprobed_latency_refusal
from reconciler.core.plan.verify import verify_step
from reconciler.core.triton_config import (
    config_drift,
    in_sequences,
    is_complete,
    merge,
    merged_when_asked,
    streams,
    with_versions,
    without_heal_marker,
)
from reconciler.model.history import History
from reconciler.model.plan import Action, ModelChange, OnFailure, PlanProblem, Step
from reconciler.model.serving import ModelState, ServerState, interface_difference
from reconciler.model.spec import (
    BackendSpec,
    ModelDeployment,
    SequencePolicy,
    StreamExpectation,
)


def _base_config(
    model: ModelState, deployment: ModelDeployment
) -> tuple[Mapping[str, Any] | None, str | None]:
    """The config to merge spec.config over, or why there is none."""
    if model.loaded_config is not None:
        return without_heal_marker(model.loaded_config), None
    if model.repository_config is not None:
        return model.repository_config, None
    if is_complete(deployment.config):
        return {}, None
    return None, (
        "no base config: the model is not loaded, its config.pbtxt cannot be read "
        "(set spec.modelRepository on the TritonServer), and spec.config is not complete"
    )


def target_config(model: ModelState, deployment: ModelDeployment) -> Mapping[str, Any] | None:
    """The config the model is to run with: the base with spec.config merged over it."""
    base, _ = _base_config(model, deployment)
    return None if base is None else merge(base, deployment.config)


def composing_models(config: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The models an ensemble config runs in its steps."""
    if not config:
        return ()
    steps = config.get("ensemble_scheduling", {}).get("step", [])
    return tuple(sorted({str(s["model_name"]) for s in steps if "model_name" in s}))


def _sequence_policy(
    deployment: ModelDeployment, target: Mapping[str, Any]
) -> SequencePolicy | None:
    """How to drain a sequence model (declared, or detected from sequence_batching)."""
    batching = target.get("sequence_batching")
    if deployment.sequence is None and batching is None:
        return None
    policy = deployment.sequence or SequencePolicy()
    if isinstance(batching, Mapping) and batching.get("max_sequence_idle_microseconds"):
        # The drain must outlast the longest pause Triton allows inside a sequence.
        floor = int(batching["max_sequence_idle_microseconds"]) / 1e6
        policy = replace(policy, idle=max(policy.idle, floor))
    return policy


def _digest_problem(
    server: str, deployment: ModelDeployment, model: ModelState
) -> PlanProblem | None:
    wrong = []
    for version, pinned in sorted(deployment.digests.items()):
        if version not in model.repository_digests:
            continue  # the repository cannot be read: nothing to compare with
        found = model.repository_digests[version]
        if found is not None and found != pinned:
            wrong.append(f"version {version} is {found}, the manifest pins {pinned}")
    if not wrong:
        return None
    return PlanProblem(
        server,
        deployment.model,
        "artifact changed under a released version number, refusing to load: " + "; ".join(wrong),
        "artifact-mismatch",
    )


def _refusal(
    server: str, deployment: ModelDeployment, observed: ServerState, model: ModelState
) -> PlanProblem | None:
    """Why the model cannot be planned here at all: versions the repository lacks, a model
    the repository does not hold, a config.pbtxt that does not parse while new versions are
    to load, an artifact changed under a released version."""
    desired = frozenset(deployment.versions)
    if model.repository_config_error is not None and desired - model.ready:
        # Triton would refuse the file on any load that reads it (a restart's), and the new
        # versions' interface cannot be checked against it: nothing is loaded until it is
        # fixed. A model that serves what it should is left alone.
        return PlanProblem(
            server,
            deployment.model,
            f"{model.repository_config_error}; refused before anything is loaded: fix "
            "config.pbtxt in the model repository",
        )
    if model.repository_versions is not None:
        missing = desired - model.repository_versions
        if missing:
            # Named, so that the engineer looks in the bucket or folder the server reads
            # (an upload that went to another prefix, another environment's bucket).
            where = f" {observed.repository_url}" if observed.repository_url else ""
            return PlanProblem(
                server,
                deployment.model,
                f"version(s) {', '.join(map(str, sorted(missing)))} not in the model repository"
                f"{where} (it holds "
                f"{', '.join(map(str, sorted(model.repository_versions))) or 'none'})",
            )
    elif observed.in_repository and deployment.model not in observed.in_repository:
        return PlanProblem(server, deployment.model, "model not in the server's model repository")
    return _digest_problem(server, deployment, model)


def _interface_refusal(
    server: str,
    deployment: ModelDeployment,
    model: ModelState,
    target: Mapping[str, Any],
    desired: frozenset[int],
) -> PlanProblem | None:
    """A change of what clients see, refused before anything is loaded.

    Triton applies a config to the whole model: loading [old, new] with a config that renames
    an output reloads the serving versions with it too, and their clients get the new output
    at once, long before the after-load check could revert. So the interface of the config to
    be sent (``target``) is compared with the one the serving versions run, here, and so is
    the interface the new versions come with in the model repository's config.pbtxt (when it
    can be read): keys spec.config leaves out would be sent as they serve now, which the new
    versions may not match. Nothing serving here (a first load), no loaded config to compare
    with, or ``spec.allowInterfaceChange``: no gate. The executor's after-load check
    (``interface_check`` on the verify step) stays behind it for what a config cannot tell.
    """
    if deployment.allow_interface_change or not model.ready or model.loaded_config is None:
        return None
    served = config_interface(model.loaded_config)
    if served is None:
        return None
    new = sorted(desired - model.ready)
    serving = ", ".join(map(str, sorted(model.ready)))
    what = (
        f"version {new[0]} changes"
        if len(new) == 1
        else f"versions {', '.join(map(str, new))} change"
        if new
        else "spec.config changes"
    )
    sent = config_interface(target)
    changed = interface_difference(served, sent) if sent is not None else []
    if changed:
        return PlanProblem(
            server,
            deployment.model,
            f"{what} the model's interface: {'; '.join(changed)}; refused before anything is "
            f"loaded (Triton applies a config to the whole model, so version(s) {serving} would "
            "answer with it too; set spec.allowInterfaceChange: true to accept)",
            "interface-change",
        )
    if not new or model.repository_config is None:
        return None
    # The config a first load of the new versions would send (config.pbtxt under spec.config);
    # what config.pbtxt leaves out (a backend's auto-complete fills it in) is not compared.
    published = merge(
        interface_part(model.loaded_config), merge(model.repository_config, deployment.config)
    )
    comes_with = config_interface(published)
    changed = interface_difference(served, comes_with) if comes_with is not None else []
    if not changed:
        return None
    return PlanProblem(
        server,
        deployment.model,
        f"{what} the model's interface, as config.pbtxt in the model repository declares it: "
        f"{'; '.join(changed)}; refused before anything is loaded (the load would send the "
        f"inputs and outputs version(s) {serving} serve, which config.pbtxt does not declare "
        "for the new versions; declare the interface in spec.config, with "
        "spec.allowInterfaceChange: true to accept a change)",
        "interface-change",
    )


@dataclass(frozen=True)
class _Delta:
    """What one model on one server must go through, as read once: planned from."""

    server: str
    deployment: ModelDeployment
    ready: frozenset[int]
    desired: frozenset[int]
    drift: tuple[str, ...]  # top-level spec.config keys the loaded config does not match
    target: Mapping[str, Any]  # the whole config to run with
    sequence: SequencePolicy | None  # how to drain it, when it is a sequence model
    revert: tuple[Step, ...]

    @property
    def streaming(self) -> bool:
        """Whether the model answers by streams, as the config it will run with says."""
        return streams(self.target)

    @property
    def stream_drain(self) -> float:
        """How long an unload waits for the streams in flight on the versions it drops to
        end: the longest stream deadline its smoke cases declare, else the schema's."""
        deadlines = [c.stream.deadline for c in self.deployment.smoke if c.stream is not None]
        return max(deadlines, default=StreamExpectation().deadline)

    @property
    def new(self) -> frozenset[int]:
        return self.desired - self.ready

    @property
    def old(self) -> frozenset[int]:
        return self.ready - self.desired


def plan_model(
    server: str,
    deployment: ModelDeployment,
    observed: ServerState,
    history: History | None = None,
    drift_of: Callable[[Mapping[str, Any], Mapping[str, Any]], list[str]] = config_drift,
) -> ModelChange | PlanProblem | None:
    """What ``deployment`` asks of its model on ``server``: the change, the problem that
    stops it, or None when it serves as declared. ``drift_of``: ``config_drift``, or the
    plan's ``DriftMemo`` of it."""
    history = history or History()
    model = observed.model(deployment.model)
    refusal = _refusal(server, deployment, observed, model)
    if refusal is not None:
        return refusal
    base, why_not = _base_config(model, deployment)
    if base is None:
        return PlanProblem(server, deployment.model, why_not or "no base config")
    # The config to run with, merged when first asked for: a model that serves as declared
    # (most of a fleet's pairs) needs it only to refuse a stream case or to heal (issue 46).
    declared = merged_when_asked(base, deployment.config)
    wrong_shape = stream_case_refusal(server, deployment, model, declared) or (
        unprobed_latency_refusal(server, deployment, declared)
    )
    if wrong_shape is not None:
        return wrong_shape  # the probes between rollouts ask by the first case too
    ready = model.ready
    desired = frozenset(deployment.versions)
    drift = (
        drift_of(deployment.config, without_heal_marker(model.loaded_config))
        if ready and model.loaded_config is not None
        else []
    )
    applied_backend = history.backends.get(deployment.name)
    backend_change = (
        deployment.backend is not None
        and applied_backend is not None
        and applied_backend != deployment.backend.revision
        and bool(ready)
    )
    if desired == ready and not drift and not backend_change:
        # Serving as declared; versions whose probes stopped being answered are reloaded.
        return heal_change(server, deployment, model, declared)
    target = declared()
    gate = _interface_refusal(server, deployment, model, target, desired)
    if gate is not None:
        return gate  # before anything is sent: the serving versions keep their config
    # Nothing serves because an in-place swap of this spec was stopped after its unload: a
    # revert puts back what served before it began, not nothing.
    before = history.began_from(deployment.name, deployment.fingerprint, server)
    delta = _Delta(
        server,
        deployment,
        ready,
        desired,
        tuple(drift),
        target,
        _sequence_policy(deployment, target),
        put_back_unloaded(server, deployment.model, target, frozenset(before))
        if not ready and before
        else revert_steps(server, deployment.model, model, ready),
    )
    if backend_change:
        assert deployment.backend is not None
        backend = deployment.backend
        why = f"backend {backend.name} {applied_backend} -> {backend.revision}"
        drain = delta.sequence or SequencePolicy(idle=2.0)
        return _swap_in_place(server, deployment, target, ready, drain, why, backend, delta.revert)
    no_room = _no_room_beside(delta, observed, history)
    if no_room is None:
        return _change_beside(delta)
    room, needed_each = no_room
    if deployment.when_no_headroom != "replace":
        return PlanProblem(
            server,
            deployment.model,
            f"no memory headroom: {room}; the old versions keep serving "
            "(rollout.whenNoHeadroom: replace swaps instead, one server at a time)",
            "no-headroom",
        )
    why = f"no room beside the old ({room})"
    needs = needed_each * len(deployment.versions)
    return _swap_in_place(
        server, deployment, target, ready, delta.sequence, why, None, delta.revert, needs
    )


def _no_room_beside(
    delta: _Delta, observed: ServerState, history: History
) -> tuple[str, float] | None:
    """Why the new versions cannot load beside the old (memory), with the bytes one version
    needs; None when they can or nothing tells (no footprint known, no free memory)."""
    if not (delta.new and delta.ready):
        return None
    deployment = delta.deployment
    needed_each = deployment.memory_per_version or history.footprints.get(
        (delta.server, deployment.model)
    )
    if needed_each is None or observed.memory_free is None:
        return None
    needed = needed_each * len(delta.new)
    if needed <= observed.memory_free:
        return None
    return (
        f"{len(delta.new)} new version(s) need {needed / 2**20:.0f} MiB beside the old, "
        f"{observed.memory_free / 2**20:.0f} MiB free"
        + (f" ({observed.memory_free_on})" if observed.memory_free_on else ""),
        needed_each,
    )


def _change_beside(delta: _Delta) -> ModelChange:
    """Load the new versions beside the old (which keep serving), verify and analyse them,
    then drop the old ones."""
    server, deployment, ready = delta.server, delta.deployment, delta.ready
    changing = bool(delta.new or delta.drift)
    steps: list[Step] = []
    if changing:
        steps.extend(_load_and_verify(delta))
    if deployment.analysis is not None and changing:
        steps.append(_analyze_step(delta))
    if delta.old:
        steps.append(_unload_old(delta))
    return ModelChange(
        server,
        deployment.model,
        deployment.name,
        sorted_versions(ready),
        sorted_versions(delta.desired),
        tuple(steps),
        exclusive=deployment.name if delta.sequence is not None and ready else None,
        interface_baseline=(
            max(ready) if ready and changing and not deployment.allow_interface_change else None
        ),
        revert=delta.revert,
        reconfigured=bool(changing and delta.drift),
    )


def _load_and_verify(delta: _Delta) -> list[Step]:
    """Drain first for a sequence model; load the old and new versions together; verify."""
    server, deployment, ready, desired = delta.server, delta.deployment, delta.ready, delta.desired
    new, drift = delta.new, delta.drift
    steps: list[Step] = []
    if ready and delta.sequence is not None:
        steps.append(_drain_step(server, deployment.model, ready, delta.sequence))
    why = []
    if new:
        why.append(f"serve new version(s) {', '.join(map(str, sorted(new)))}")
    if drift:
        why.append(f"config changed ({', '.join(drift)})")
    if ready:
        why.append(f"beside {', '.join(map(str, sorted(ready)))} which keep serving")
    loading = ready | desired
    steps.append(
        Step(
            server,
            deployment.model,
            Action.LOAD,
            sorted_versions(loading),
            "; ".join(why),
            config=with_versions(delta.target, deployment.model, loading),
        )
    )
    old_serving = ready - desired
    steps.append(
        verify_step(
            server,
            deployment,
            desired,
            desired if drift else new,
            bool(ready),
            max(old_serving) if old_serving and new else None,
            streaming=delta.streaming,
            sequence=delta.sequence is not None,
        )
    )
    return steps


def _analyze_step(delta: _Delta) -> Step:
    deployment, ready = delta.deployment, delta.ready
    spec = deployment.analysis
    assert spec is not None
    watched = delta.desired if delta.drift else delta.new
    old = ready - delta.desired
    note = ""
    if ready and max(watched) < max(ready):
        note = (
            f"; unversioned requests keep reaching {max(ready)} until it is unloaded, "
            f"so the new versions see only version-pinned traffic (noTraffic: "
            f"{spec.no_traffic})"
        )
    # The new versions take the old one's clients here (unversioned requests reach the
    # highest version): a streaming model's old version is probed under them first.
    loaded = old_under_load(
        delta.streaming, spec.checks, spec.probes.enabled, bool(old) and max(watched) > max(old)
    )
    if loaded:
        note += (
            f"; before the load, {loaded} probe streams to {max(old)} under its clients' load "
            "(the time to the first response the new versions are held to once they carry them)"
        )
    return Step(
        delta.server,
        deployment.model,
        Action.ANALYZE,
        sorted_versions(watched),
        f"watch {', '.join(map(str, sorted(watched)))} for {spec.duration:g}s, every "
        f"{spec.interval:g}s: {', '.join(c.name for c in spec.checks)}"
        + (
            f"; probes at most {spec.probes.rate:g}/s from "
            + (
                "the smoke cases"
                if deployment.smoke
                else "the recorded requests"
                if deployment.shadow is not None
                else "the model's inputs"
            )
            if spec.probes.enabled
            else ""
        )
        + f"; old versions stay loaded{note}",
        analysis=spec,
        baseline=sorted_versions(old),
        old_under_load=loaded,
        # What the probes send: the smoke cases, else the recorded requests (else requests
        # synthesized from the model's inputs).
        smoke=deployment.smoke,
        shadow=deployment.shadow,
        streaming=delta.streaming,
        sequence=delta.sequence is not None,
    )


def _unload_old(delta: _Delta) -> Step:
    model = delta.deployment.model
    step = Step(
        delta.server,
        model,
        Action.UNLOAD,
        sorted_versions(delta.desired),
        f"drop old version(s) {', '.join(map(str, sorted(delta.old)))}"
        + (" once the new ones are verified" if delta.new or delta.drift else ""),
        config=with_versions(delta.target, model, delta.desired),
        dropped=sorted_versions(delta.old),
        # The new versions are verified and serving: nothing to put back; the next pass
        # retries the unload.
        on_failure=OnFailure.STOP,
    )
    if not delta.streaming:
        return step
    # A streaming model's unload waits for the streams in flight on the dropped versions.
    return replace(
        step,
        reason=f"{step.reason}; the streams in flight on them end there first (at most "
        f"{delta.stream_drain:g}s)",
        timeout=delta.stream_drain,
        streaming=True,
    )


def _drain_step(server: str, model: str, ready: frozenset[int], policy: SequencePolicy) -> Step:
    return Step(
        server,
        model,
        Action.DRAIN,
        sorted_versions(ready),
        f"wait until {model} is idle here (no pending request, no new inference for "
        f"{policy.idle:g}s; at most {policy.drain_timeout:g}s)"
        + (", after telling the load balancer" if policy.drain_webhook else ""),
        drain=policy,
        on_failure=OnFailure.STOP,  # nothing was touched: the old versions serve as before
    )


def _swap_in_place(
    server: str,
    deployment: ModelDeployment,
    target: Mapping[str, Any],
    ready: frozenset[int],
    drain: SequencePolicy | None,
    why: str,
    backend: BackendSpec | None,
    revert: tuple[Step, ...],
    needs_free: float | None = None,
) -> ModelChange:
    """Swap in place on this server (old out, then new in): a backend library change, or no
    memory for both (``needs_free``: what the new versions need, which the memory figure
    must show free once the old are gone). The model does not serve here in between: one
    server at a time."""
    model = deployment.model
    desired = frozenset(deployment.versions)
    steps = []
    if drain is not None:
        steps.append(_drain_step(server, model, frozenset(deployment.versions), drain))
    steps.append(
        Step(
            server,
            model,
            Action.UNLOAD,
            (),
            f"{why}: unload here and wait until it is gone"
            + (f" and {needs_free / 2**20:.0f} MiB show free" if needs_free is not None else ""),
            until_unavailable=True,
            needs_free=needs_free,
        )
    )
    if backend is not None:
        steps.append(
            Step(
                server,
                model,
                Action.REPLACE_LIBRARY,
                (),
                f"put {backend.name} {backend.revision} in place",
                backend=backend,
            )
        )
    steps.append(
        Step(
            server,
            model,
            Action.LOAD,
            sorted_versions(desired),
            f"serve {', '.join(map(str, sorted(desired)))} again",
            config=with_versions(target, model, desired),
        )
    )
    steps.append(
        verify_step(
            server,
            deployment,
            desired,
            desired,
            False,
            streaming=streams(target),
            sequence=in_sequences(target),
        )
    )
    return ModelChange(
        server,
        model,
        deployment.name,
        sorted_versions(ready),
        sorted_versions(desired),
        tuple(steps),
        revert=revert,
        exclusive=deployment.name,
    )
