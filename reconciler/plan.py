"""The planner: a pure function from (desired, serving, history) to a Plan.

No I/O here. A Plan is data: per (server, model) an ordered run of steps, each with a reason,
plus the steps that put the model back as it was if a load or verify fails (a rollback is a
plan like any other, executed by the same ``apply``). Renderers live in ``render.py``.

For a version change on a server that serves versions R and must serve D:
  load    policy R + D       (R keeps serving while the new versions load beside it)
  verify  D all READY; smoke cases against each new version, explicitly by version
  unload  policy D           (only when R has versions that D drops)
Nothing is planned where R == D and the loaded config already matches the manifest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from reconciler.analysis import AnalysisSpec
from reconciler.model_config import config_drift, is_complete, merge, with_versions
from reconciler.serving import ModelState, ServerState, ServingState
from reconciler.spec.model import (
    BackendSpec,
    DesiredState,
    ModelDeployment,
    Placement,
    SequencePolicy,
    ShadowSpec,
    SmokeCase,
)


class Action(StrEnum):
    DRAIN = "drain"  # wait until the model is idle on this server (sequence models)
    UNLOAD = "unload"
    REPLACE_LIBRARY = "replace-library"  # a new backend shared library reaches the host
    LOAD = "load"
    VERIFY = "verify"
    ANALYZE = "analyze"
    # In results only, never planned: the staged rollout failed elsewhere (another server's
    # step, a step webhook, shutdown) and took this server back with it.
    ROLLOUT = "rollout"


@dataclass(frozen=True)
class Step:
    server: str
    model: str
    action: Action
    # load: the version policy loaded; verify: the versions that must be READY;
    # unload: the versions kept (empty: the whole model is unloaded).
    versions: tuple[int, ...]
    reason: str
    config: Mapping[str, Any] | None = None  # the whole config sent with a load
    smoke: tuple[SmokeCase, ...] = ()
    smoke_versions: tuple[int, ...] = ()
    dropped: tuple[int, ...] = ()  # unload: the versions that go
    timeout: float = 120.0
    analysis: AnalysisSpec | None = None  # analyze: what to watch, how long
    baseline: tuple[int, ...] = ()  # analyze: the old versions the new are compared with
    drain: SequencePolicy | None = None  # drain: webhook, idle window, timeout
    backend: BackendSpec | None = None  # replace-library: what to put in place
    interface_check: bool = False  # verify: new versions must keep the old interface
    shadow: ShadowSpec | None = None  # verify: replay recorded requests on old and new
    shadow_against: int | None = None  # verify: the old version the replay compares with
    until_unavailable: bool = False  # unload: wait until the model is fully gone
    dependents: tuple[str, ...] = ()  # unload: models that go with it (ensembles)


@dataclass(frozen=True)
class ModelChange:
    """Everything one model on one server goes through, in order."""

    server: str
    model: str
    deployment: str | None  # None when the model is being removed
    serving: tuple[int, ...]  # READY before the change
    desired: tuple[int, ...]  # empty when the model is being removed
    steps: tuple[Step, ...]
    # Run when a load or verify step fails: back to ``serving`` (which never stopped serving).
    revert: tuple[Step, ...] = ()
    # Changes with the same key never run at once (one server of a pool at a time).
    exclusive: str | None = None
    interface_baseline: int | None = None  # the old version whose interface new ones keep


@dataclass(frozen=True)
class PlanProblem:
    """Something that stops one model (or one whole server) from being planned."""

    server: str
    model: str | None
    message: str
    kind: str = "problem"  # problem | artifact-mismatch | no-headroom | dependency

    def __str__(self) -> str:
        where = f"server {self.server}" + (f", model {self.model}" if self.model else "")
        return f"{where}: {self.message}"


@dataclass(frozen=True)
class Hold:
    """A ModelDeployment whose spec failed its rollout: kept at what served before.

    It lasts until a commit changes the ModelDeployment (its fingerprint).
    """

    deployment: str
    fingerprint: str
    revision: str
    reason: str
    previous: Mapping[str, tuple[int, ...]]  # server -> versions it served before
    configs: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)


@dataclass(frozen=True)
class StagedRecord:
    """How far a staged rollout got before the reconciler stopped."""

    fingerprint: str
    completed: frozenset[str]  # servers whose stage passed: new versions verified, analysed
    started: Mapping[str, tuple[int, ...]]  # servers of the stage in progress: what served


@dataclass(frozen=True)
class History:
    """What the state store remembers: the last applied revision, the models it placed, holds."""

    revision: str | None = None
    managed: Mapping[str, frozenset[str]] = field(default_factory=dict)
    holds: Mapping[str, Hold] = field(default_factory=dict)
    backends: Mapping[str, str] = field(default_factory=dict)  # deployment -> applied revision
    # Staged rollouts a previous pass began and did not finish (the reconciler stopped).
    staged: Mapping[str, StagedRecord] = field(default_factory=dict)
    footprints: Mapping[tuple[str, str], float] = field(default_factory=dict)  # bytes/version


@dataclass(frozen=True)
class Held:
    """A (server, model) kept at its previous versions by a hold, for the plan's report."""

    server: str
    model: str
    deployment: str
    revision: str
    reason: str
    versions: tuple[int, ...]


@dataclass(frozen=True)
class RolloutPlan:
    """One ModelDeployment's change moving through its servers in stages: preview servers
    first, then production steps. Old versions are unloaded only after the last stage."""

    deployment: str
    model: str
    fingerprint: str
    stages: tuple[tuple[str, ...], ...]  # server names, stage by stage
    stage_names: tuple[str, ...]  # "preview", "step 1 of 3", ...
    max_parallel: tuple[int, ...]  # per stage
    pre_step: str | None = None
    post_step: str | None = None


@dataclass(frozen=True)
class Plan:
    revision: str
    changes: tuple[ModelChange, ...] = ()
    problems: tuple[PlanProblem, ...] = ()
    in_sync: tuple[tuple[str, str], ...] = ()  # (server, model) pairs that already match
    held: tuple[Held, ...] = ()
    suspended: tuple[tuple[str, str], ...] = ()  # (server, model) left alone: spec.suspend
    rollouts: tuple[RolloutPlan, ...] = ()  # staged changes, coordinated across servers

    @property
    def steps(self) -> tuple[Step, ...]:
        return tuple(step for change in self.changes for step in change.steps)

    @property
    def has_changes(self) -> bool:
        return bool(self.changes)


def _versions(values: frozenset[int] | set[int]) -> tuple[int, ...]:
    return tuple(sorted(values))


def _base_config(
    model: ModelState, deployment: ModelDeployment
) -> tuple[Mapping[str, Any] | None, str | None]:
    """The config to merge spec.config over, or why there is none."""
    if model.loaded_config is not None:
        return model.loaded_config, None
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


def _plan_model(
    server: str,
    deployment: ModelDeployment,
    observed: ServerState,
    history: History | None = None,
) -> ModelChange | PlanProblem | None:
    history = history or History()
    model = observed.model(deployment.model)
    desired = frozenset(deployment.versions)
    ready = model.ready
    if model.repository_versions is not None:
        missing = desired - model.repository_versions
        if missing:
            return PlanProblem(
                server,
                deployment.model,
                f"version(s) {', '.join(map(str, sorted(missing)))} not in the model repository "
                f"(it holds {', '.join(map(str, sorted(model.repository_versions))) or 'none'})",
            )
    elif observed.in_repository and deployment.model not in observed.in_repository:
        return PlanProblem(server, deployment.model, "model not in the server's model repository")
    digest_problem = _digest_problem(server, deployment, model)
    if digest_problem is not None:
        return digest_problem
    base, why_not = _base_config(model, deployment)
    if base is None:
        return PlanProblem(server, deployment.model, why_not or "no base config")
    drift = (
        config_drift(deployment.config, model.loaded_config)
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
    new = desired - ready
    old = ready - desired
    if not new and not old and not drift and not backend_change:
        return None
    target = merge(base, deployment.config)
    sequence = _sequence_policy(deployment, target)
    revert = _revert_steps(server, deployment.model, model, ready)
    if backend_change:
        assert deployment.backend is not None
        return _swap_in_place(
            server,
            deployment,
            target,
            ready,
            sequence or SequencePolicy(idle=2.0),
            f"backend {deployment.backend.name} {applied_backend} -> {deployment.backend.revision}",
            deployment.backend,
            revert,
        )
    if new and ready:
        needed_each = deployment.memory_per_version or history.footprints.get(
            (server, deployment.model)
        )
        if needed_each is not None and observed.memory_free is not None:
            needed = needed_each * len(new)
            if needed > observed.memory_free:
                room = (
                    f"{len(new)} new version(s) need {needed / 2**20:.0f} MiB beside the old, "
                    f"{observed.memory_free / 2**20:.0f} MiB free"
                )
                if deployment.when_no_headroom != "replace":
                    return PlanProblem(
                        server,
                        deployment.model,
                        f"no memory headroom: {room}; the old versions keep serving "
                        "(rollout.whenNoHeadroom: replace swaps instead, one server at a time)",
                        "no-headroom",
                    )
                return _swap_in_place(
                    server,
                    deployment,
                    target,
                    ready,
                    sequence,
                    f"no room beside the old ({room})",
                    None,
                    revert,
                )
    steps: list[Step] = []
    if (new or drift) and ready and sequence is not None:
        steps.append(_drain_step(server, deployment.model, ready, sequence))
    if new or drift:
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
                _versions(loading),
                "; ".join(why),
                config=with_versions(target, deployment.model, loading),
            )
        )
        old_serving = ready - desired
        steps.append(
            _verify_step(
                server,
                deployment,
                desired,
                desired if drift else new,
                bool(ready),
                max(old_serving) if old_serving and new else None,
            )
        )
    if deployment.analysis is not None and (new or drift):
        watched = desired if drift else new
        spec = deployment.analysis
        note = ""
        if ready and max(watched) < max(ready):
            note = (
                f"; unversioned requests keep reaching {max(ready)} until it is unloaded, "
                f"so the new versions see only version-pinned traffic (noTraffic: "
                f"{spec.no_traffic})"
            )
        steps.append(
            Step(
                server,
                deployment.model,
                Action.ANALYZE,
                _versions(watched),
                f"watch {', '.join(map(str, sorted(watched)))} for {spec.duration:g}s, every "
                f"{spec.interval:g}s: {', '.join(c.name for c in spec.checks)}; old versions "
                f"stay loaded{note}",
                analysis=spec,
                baseline=_versions(ready - desired),
            )
        )
    if old:
        steps.append(
            Step(
                server,
                deployment.model,
                Action.UNLOAD,
                _versions(desired),
                f"drop old version(s) {', '.join(map(str, sorted(old)))}"
                + (" once the new ones are verified" if new or drift else ""),
                config=with_versions(target, deployment.model, desired),
                dropped=_versions(old),
            )
        )
    return ModelChange(
        server,
        deployment.model,
        deployment.name,
        _versions(ready),
        _versions(desired),
        tuple(steps),
        exclusive=deployment.name if sequence is not None and ready else None,
        interface_baseline=(
            max(ready)
            if ready and (new or drift) and not deployment.allow_interface_change
            else None
        ),
        revert=revert,
    )


def _drain_step(server: str, model: str, ready: frozenset[int], policy: SequencePolicy) -> Step:
    return Step(
        server,
        model,
        Action.DRAIN,
        _versions(ready),
        f"wait until {model} is idle here (no pending request, no new inference for "
        f"{policy.idle:g}s; at most {policy.drain_timeout:g}s)"
        + (", after telling the load balancer" if policy.drain_webhook else ""),
        drain=policy,
    )


def _verify_step(
    server: str,
    deployment: ModelDeployment,
    desired: frozenset[int],
    smoke_versions: frozenset[int],
    check_interface: bool,
    old_version: int | None = None,
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
    return Step(
        server,
        deployment.model,
        Action.VERIFY,
        _versions(desired),
        "; ".join(notes),
        smoke=deployment.smoke,
        smoke_versions=_versions(smoke_versions),
        timeout=deployment.verify_timeout,
        interface_check=interface,
        shadow=shadow,
        shadow_against=old_version if shadow is not None else None,
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
) -> ModelChange:
    """Swap in place on this server (old out, then new in): a backend library change, or no
    memory for both. The model does not serve here in between: one server at a time."""
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
            f"{why}: unload here and wait until it is gone",
            until_unavailable=True,
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
            _versions(desired),
            f"serve {', '.join(map(str, sorted(desired)))} again",
            config=with_versions(target, model, desired),
        )
    )
    steps.append(_verify_step(server, deployment, desired, desired, False))
    return ModelChange(
        server,
        model,
        deployment.name,
        _versions(ready),
        _versions(desired),
        tuple(steps),
        revert=revert,
        exclusive=deployment.name,
    )


def _revert_steps(
    server: str, model_name: str, model: ModelState, ready: frozenset[int]
) -> tuple[Step, ...]:
    if not ready:
        return (Step(server, model_name, Action.UNLOAD, (), "revert: it served nothing before"),)
    previous = model.loaded_config or {}
    return (
        Step(
            server,
            model_name,
            Action.LOAD,
            _versions(ready),
            f"revert: serve only {', '.join(map(str, sorted(ready)))} as before",
            config=with_versions(previous, model_name, ready),
        ),
        Step(
            server,
            model_name,
            Action.VERIFY,
            _versions(ready),
            f"revert: {', '.join(map(str, sorted(ready)))} READY",
        ),
    )


def _plan_held(
    server: str, deployment: ModelDeployment, hold: Hold, observed: ServerState
) -> ModelChange | PlanProblem | None:
    """Keep (or bring back) what served before the failed rollout; never the failed spec."""
    previous = hold.previous.get(server)
    config = hold.configs.get(server)
    if previous is None:
        # This server took no part in the failed rollout. Serving the model, it is left as
        # it is; serving none of it (an instance DNS added since, or one restarted empty),
        # it gets the last good versions: what the rollout's servers served before, when
        # they agree, never the failed spec's.
        before = set(hold.previous.values())
        if observed.model(deployment.model).ready or len(before) != 1:
            return None
        previous = before.pop()
        config = next((c for c in hold.configs.values() if c is not None), None)
    if not previous:
        return _plan_removal(server, deployment.model, observed)
    restored = replace(
        deployment,
        versions=previous,
        config=config if config is not None else deployment.config,
        smoke=(),
        analysis=None,
    )
    return _plan_model(server, restored, observed)


def _plan_removal(server: str, model_name: str, observed: ServerState) -> ModelChange | None:
    model = observed.model(model_name)
    if not model.ready:
        return None
    return ModelChange(
        server,
        model_name,
        None,
        _versions(model.ready),
        (),
        (
            Step(
                server,
                model_name,
                Action.UNLOAD,
                (),
                "no ModelDeployment places this model on this server any more",
                dropped=_versions(model.ready),
            ),
        ),
    )


def emptied_servers(
    desired: DesiredState, history: History, discovered: Iterable[str] = ()
) -> list[str]:
    """Servers that served declared models at the last applied revision and would get none.

    A discovered instance that DNS no longer lists is gone, not emptied (``<server>/<addr>``
    of a server that is still declared).
    """
    instances_of = set(discovered) | {
        s.instance_of for s in desired.servers.values() if s.instance_of
    }
    return sorted(
        server
        for server, models in history.managed.items()
        if models
        and not desired.placements.get(server)
        and server.partition("/")[0] not in instances_of
    )


def _as_before(observed: ServerState, deployment: ModelDeployment, history: History) -> ServerState:
    """A server a stopped staged rollout was in the middle of: seen as it served before,
    so its verify and analysis run again (loading what is already loaded is no reload)."""
    record = history.staged.get(deployment.name)
    if record is None or record.fingerprint != deployment.fingerprint:
        return observed
    before = record.started.get(observed.server)
    if before is None or observed.server in record.completed:
        return observed
    model = observed.model(deployment.model)
    versions = tuple(
        v if v.version in before or v.state != "READY" else replace(v, state="LOADING")
        for v in model.versions
    )
    return replace(
        observed, models={**observed.models, model.name: replace(model, versions=versions)}
    )


def _await_load_in_progress(
    outcome: ModelChange | PlanProblem | None, model: ModelState
) -> ModelChange | PlanProblem | None:
    """Never start a second load of a model Triton is still loading (an earlier pass's load,
    cut off by its load timeout, goes on on the server): a second one would queue behind it
    and hold this pass as long. The verify step waits for it instead."""
    loading = frozenset(v.version for v in model.versions if v.state == "LOADING")
    if not loading or not isinstance(outcome, ModelChange):
        return outcome
    loads = [s for s in outcome.steps if s.action is Action.LOAD]
    if any(not set(s.versions) <= model.ready | loading for s in loads):
        return PlanProblem(
            outcome.server,
            outcome.model,
            f"version(s) {', '.join(map(str, sorted(loading)))} still LOADING on the server "
            "(a load started earlier goes on); no other load of this model starts until it ends",
        )
    note = f"; the load already running on the server ({', '.join(map(str, sorted(loading)))} "
    steps = tuple(
        replace(s, reason=s.reason + note + "LOADING) is waited for, not started again")
        if s.action is Action.VERIFY
        else s
        for s in outcome.steps
        if s.action is not Action.LOAD
    )
    return replace(outcome, steps=steps)


def _order(
    server: str,
    changes: list[ModelChange],
    placements: Mapping[str, Placement],
    observed: ServerState,
) -> tuple[list[ModelChange], list[PlanProblem]]:
    """Order one server's changes by their dependencies and refuse the ones with Triton side
    effects nobody asked for.

    Loading an ensemble loads its composing models (with their default versions) and
    unloading a composing model forces its ensembles out, so: composing models and
    dependsOn targets load first; an ensemble is never loaded while one of its composing
    models is placed nowhere on the server; a model is never removed while an ensemble that
    stays needs it; when both go, the ensemble goes first (its removal is named on the
    composing model's unload).
    """
    problems: list[PlanProblem] = []
    if not changes:
        return [], problems
    placed = set(placements)
    placed_by_deployment: dict[str, set[str]] = {}
    for model, placement in placements.items():
        placed_by_deployment.setdefault(placement.deployment.name, set()).add(model)
    needs: dict[str, set[str]] = {}
    for model, placement in placements.items():
        deployment = placement.deployment
        target = target_config(observed.model(model), deployment)
        needs[model] = set(composing_models(target)).union(
            *(placed_by_deployment.get(name, ()) for name in deployment.depends_on)
        )
    removed = {c.model for c in changes if c.deployment is None}
    for model in removed:
        needs[model] = set(composing_models(observed.model(model).loaded_config))
    kept: list[ModelChange] = []
    for change in changes:
        if change.deployment is not None:
            loads = any(s.action is Action.LOAD for s in change.steps)
            missing = sorted(needs.get(change.model, set()) - placed)
            if loads and missing:
                problems.append(
                    PlanProblem(
                        server,
                        change.model,
                        f"needs {', '.join(missing)}, which no ModelDeployment places on this "
                        "server: loading it would make Triton load them with their default "
                        "versions",
                        "dependency",
                    )
                )
                continue
            kept.append(change)
            continue
        staying = sorted(m for m in placed if change.model in needs.get(m, set()))
        if staying:
            problems.append(
                PlanProblem(
                    server,
                    change.model,
                    f"not unloaded: {', '.join(staying)} still need(s) it here, and unloading "
                    "it would force them out; remove them too, or keep it",
                    "dependency",
                )
            )
            continue
        going = tuple(sorted(m for m in removed if change.model in needs.get(m, set())))
        if going:
            unload = replace(
                change.steps[0],
                dependents=going,
                reason=f"{change.steps[0].reason}; after {', '.join(going)}, which need it",
            )
            change = replace(change, steps=(unload, *change.steps[1:]))
        kept.append(change)
    # Depth-first: a model after everything it needs; removals after loads, and a removed
    # model after the removed models that need it.
    by_model = {c.model: c for c in kept}
    ordered: list[ModelChange] = []
    seen: set[str] = set()

    def visit(model: str, stack: tuple[str, ...]) -> None:
        if model in seen or model in stack or model not in by_model:
            return
        change = by_model[model]
        if change.deployment is not None:
            for dependency in sorted(needs.get(model, set())):
                if by_model.get(dependency) is not None and by_model[dependency].deployment:
                    visit(dependency, (*stack, model))
        else:
            for dependent in sorted(m for m in removed if model in needs.get(m, set())):
                visit(dependent, (*stack, model))
        seen.add(model)
        ordered.append(change)

    for change in [c for c in kept if c.deployment is not None]:
        visit(change.model, ())
    for change in [c for c in kept if c.deployment is None]:
        visit(change.model, ())
    return ordered, problems


def settle_key(
    server: str, desired: DesiredState, observed: ServerState | None, history: History
) -> tuple[Any, ...] | None:
    """Everything ``plan`` reads to plan ``server``, as one comparable value; None when that
    cannot be told (an observation without a token, a deployment without a fingerprint).

    Two passes with equal keys plan the server alike: a server that had nothing to do in the
    first has nothing to do in the second (see ``plan``'s ``settled``).
    """
    if observed is None or observed.token is None or not observed.reachable:
        return None
    placements = desired.placements.get(server, {})
    deployments = [p.deployment for _, p in sorted(placements.items())]
    if any(not d.fingerprint for d in deployments):
        return None
    names = {d.name for d in deployments}
    return (
        observed.token,
        repr(desired.servers.get(server)),
        tuple((d.model, d.name, d.fingerprint) for d in deployments),
        history.managed.get(server, frozenset()),
        tuple(
            (n, h.fingerprint, h.previous.get(server), repr(h.configs.get(server)))
            for n, h in sorted(history.holds.items())
            if n in names
        ),
        tuple(sorted((n, r) for n, r in history.backends.items() if n in names)),
        tuple(
            (n, r.fingerprint, server in r.completed, r.started.get(server))
            for n, r in sorted(history.staged.items())
            if n in names
        ),
    )


def plan(
    desired: DesiredState,
    serving: ServingState,
    history: History,
    revision: str,
    skip: Mapping[str, str] | None = None,
    settled: frozenset[str] = frozenset(),
) -> Plan:
    """Diff what the manifests ask for against what the servers serve.

    Servers in ``skip`` (name -> why, e.g. backing off after failures) are reported as
    problems and left alone. Servers in ``settled`` are known to plan nothing: an earlier
    plan of the same ``settle_key`` had no change and no problem for them. They are reported
    in sync (or held, or suspended) without planning each model again, which is what keeps a
    no-op pass over a large fleet cheap.
    """
    changes: list[ModelChange] = []
    problems: list[PlanProblem] = []
    in_sync: list[tuple[str, str]] = []
    held: list[Held] = []
    suspended: list[tuple[str, str]] = []
    for server in sorted(desired.placements):
        if skip and server in skip:
            problems.append(PlanProblem(server, None, skip[server]))
            continue
        observed = serving.get(server)
        if observed is None or not observed.reachable:
            why = observed.error if observed is not None and observed.error else "not observed"
            problems.append(PlanProblem(server, None, why))
            continue
        placements = desired.placements[server]
        server_changes: list[ModelChange] = []
        for model_name in sorted(placements):
            deployment = placements[model_name].deployment
            if deployment.suspend:
                suspended.append((server, model_name))
                continue
            hold = history.holds.get(deployment.name)
            if hold is not None and hold.fingerprint != deployment.fingerprint:
                hold = None  # a commit changed the failed spec: the hold is over
            if hold is not None and (previous := hold.previous.get(server)) is not None:
                held.append(
                    Held(server, model_name, deployment.name, hold.revision, hold.reason, previous)
                )
            if server in settled:
                in_sync.append((server, model_name))
                continue
            if hold is not None:
                outcome = _plan_held(server, deployment, hold, observed)
            else:
                outcome = _plan_model(
                    server, deployment, _as_before(observed, deployment, history), history
                )
                outcome = _await_load_in_progress(outcome, observed.model(model_name))
            if outcome is None:
                in_sync.append((server, model_name))
            elif isinstance(outcome, PlanProblem):
                problems.append(outcome)
            else:
                server_changes.append(outcome)
        if server in settled:
            continue
        for model_name in sorted(history.managed.get(server, frozenset()) - set(placements)):
            removal = _plan_removal(server, model_name, observed)
            if removal is not None:
                server_changes.append(removal)
        ordered, dependency_problems = _order(server, server_changes, placements, observed)
        changes.extend(ordered)
        problems.extend(dependency_problems)
    return Plan(
        revision,
        tuple(changes),
        tuple(problems),
        tuple(in_sync),
        tuple(held),
        tuple(suspended),
        _rollouts(desired, changes, history),
    )


def _count(value: int | str, total: int) -> int:
    """A count, or a percentage of ``total`` rounded up; at least 1, at most ``total``."""
    number = -(-total * int(value.rstrip("%")) // 100) if isinstance(value, str) else value
    return max(1, min(total, number))


def _rollouts(
    desired: DesiredState, changes: list[ModelChange], history: History
) -> tuple[RolloutPlan, ...]:
    by_deployment: dict[str, list[ModelChange]] = {}
    resumed: dict[str, list[str]] = {}
    for change in changes:
        if change.deployment is None:
            continue
        loads = any(s.action is Action.LOAD for s in change.steps)
        record = history.staged.get(change.deployment)
        fingerprint = desired.deployments[change.deployment].fingerprint
        if loads:
            by_deployment.setdefault(change.deployment, []).append(change)
        elif record and record.fingerprint == fingerprint and change.server in record.completed:
            # Touched before the reconciler stopped: new versions loaded and verified, old
            # ones still loaded. It waits for the rest of the rollout, as it would have.
            by_deployment.setdefault(change.deployment, []).append(change)
            resumed.setdefault(change.deployment, []).append(change.server)
    plans = []
    for name, staged in sorted(by_deployment.items()):
        deployment = desired.deployments[name]
        spec = deployment.rollout
        if not spec.staged:
            continue
        already = sorted(resumed.get(name, ()))
        servers = sorted(c.server for c in staged if c.server not in already)
        preview = tuple(s for s in servers if spec.previews(desired.servers[s]))
        production = [s for s in servers if s not in preview]
        stages: list[tuple[str, ...]] = []
        names: list[str] = []
        if already:
            stages.append(tuple(already))
            names.append("resumed")
        if preview:
            stages.append(preview)
            names.append("preview")
        # Step targets count every production server, those a stopped pass already took
        # included, so a resumed rollout goes on from the step it had reached.
        total = len(production) + len([s for s in already if not spec.previews(desired.servers[s])])
        done = total - len(production)
        steps = list(spec.steps) or ["100%"]
        for index, step in enumerate(steps):
            target = _count(step, total) if total else 0
            if index == len(steps) - 1:
                target = total  # the last step takes every server that is left
            if target > done:
                stages.append(
                    tuple(
                        production[
                            done - (total - len(production)) : target - (total - len(production))
                        ]
                    )
                )
                names.append(f"step {index + 1} of {len(steps)}")
                done = target
        plans.append(
            RolloutPlan(
                name,
                deployment.model,
                deployment.fingerprint,
                tuple(stages),
                tuple(names),
                tuple(
                    _count(spec.max_parallel, len(stage)) if spec.max_parallel else len(stage)
                    for stage in stages
                ),
                spec.pre_step,
                spec.post_step,
            )
        )
    return tuple(plans)


def step_json(step: Step) -> dict[str, Any]:
    data: dict[str, Any] = {
        "server": step.server,
        "model": step.model,
        "action": str(step.action),
        "versions": list(step.versions),
        "reason": step.reason,
    }
    if step.action is Action.UNLOAD:
        data["dropped"] = list(step.dropped)
    if step.action is Action.VERIFY:
        data["smoke_cases"] = [case.name for case in step.smoke]
        data["smoke_versions"] = list(step.smoke_versions)
    if step.action is Action.ANALYZE and step.analysis is not None:
        data["analysis"] = {
            "interval_seconds": step.analysis.interval,
            "duration_seconds": step.analysis.duration,
            "failure_limit": step.analysis.failure_limit,
            "no_traffic": str(step.analysis.no_traffic),
            "checks": [c.name for c in step.analysis.checks],
            "baseline_versions": list(step.baseline),
        }
    return data


def plan_steps_json(plan_: Plan) -> list[dict[str, Any]]:
    """The plan's steps as JSON-ready data: what a saved plan commits to."""
    return [step_json(step) for step in plan_.steps]
