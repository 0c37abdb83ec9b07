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

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from reconciler.analysis import AnalysisSpec
from reconciler.model_config import config_drift, is_complete, merge, with_versions
from reconciler.serving import ModelState, ServerState, ServingState
from reconciler.spec.model import DesiredState, ModelDeployment, SmokeCase


class Action(StrEnum):
    LOAD = "load"
    VERIFY = "verify"
    ANALYZE = "analyze"
    UNLOAD = "unload"


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


@dataclass(frozen=True)
class PlanProblem:
    """Something that stops one model (or one whole server) from being planned."""

    server: str
    model: str | None
    message: str

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
class History:
    """What the state store remembers: the last applied revision, the models it placed, holds."""

    revision: str | None = None
    managed: Mapping[str, frozenset[str]] = field(default_factory=dict)
    holds: Mapping[str, Hold] = field(default_factory=dict)


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
class Plan:
    revision: str
    changes: tuple[ModelChange, ...] = ()
    problems: tuple[PlanProblem, ...] = ()
    in_sync: tuple[tuple[str, str], ...] = ()  # (server, model) pairs that already match
    held: tuple[Held, ...] = ()
    suspended: tuple[tuple[str, str], ...] = ()  # (server, model) left alone: spec.suspend

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


def _plan_model(
    server: str, deployment: ModelDeployment, observed: ServerState
) -> ModelChange | PlanProblem | None:
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
    base, why_not = _base_config(model, deployment)
    if base is None:
        return PlanProblem(server, deployment.model, why_not or "no base config")
    target = merge(base, deployment.config)
    drift = (
        config_drift(deployment.config, model.loaded_config)
        if ready and model.loaded_config is not None
        else []
    )
    new = desired - ready
    old = ready - desired
    if not new and not old and not drift:
        return None
    steps: list[Step] = []
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
        smoke_versions = desired if drift else new
        steps.append(
            Step(
                server,
                deployment.model,
                Action.VERIFY,
                _versions(desired),
                f"{', '.join(map(str, sorted(desired)))} READY"
                + (
                    f"; {len(deployment.smoke)} smoke case(s) against "
                    f"{', '.join(map(str, sorted(smoke_versions)))}"
                    if deployment.smoke
                    else ""
                ),
                smoke=deployment.smoke,
                smoke_versions=_versions(smoke_versions),
                timeout=deployment.verify_timeout,
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
        _revert_steps(server, deployment.model, model, ready),
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
    if previous is None:
        return None  # this server took no part in the failed rollout: leave it as it is
    if not previous:
        return _plan_removal(server, deployment.model, observed)
    config = hold.configs.get(server)
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


def emptied_servers(desired: DesiredState, history: History) -> list[str]:
    """Servers that served declared models at the last applied revision and would get none."""
    return sorted(
        server
        for server, models in history.managed.items()
        if models and not desired.placements.get(server)
    )


def plan(
    desired: DesiredState,
    serving: ServingState,
    history: History,
    revision: str,
    skip: Mapping[str, str] | None = None,
) -> Plan:
    """Diff what the manifests ask for against what the servers serve.

    Servers in ``skip`` (name -> why, e.g. backing off after failures) are reported as
    problems and left alone.
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
        for model_name in sorted(placements):
            deployment = placements[model_name].deployment
            if deployment.suspend:
                suspended.append((server, model_name))
                continue
            hold = history.holds.get(deployment.name)
            if hold is not None and hold.fingerprint == deployment.fingerprint:
                previous = hold.previous.get(server)
                if previous is not None:
                    held.append(
                        Held(
                            server,
                            model_name,
                            deployment.name,
                            hold.revision,
                            hold.reason,
                            previous,
                        )
                    )
                outcome = _plan_held(server, deployment, hold, observed)
            else:
                outcome = _plan_model(server, deployment, observed)
            if outcome is None:
                in_sync.append((server, model_name))
            elif isinstance(outcome, PlanProblem):
                problems.append(outcome)
            else:
                changes.append(outcome)
        for model_name in sorted(history.managed.get(server, frozenset()) - set(placements)):
            removal = _plan_removal(server, model_name, observed)
            if removal is not None:
                changes.append(removal)
    return Plan(
        revision, tuple(changes), tuple(problems), tuple(in_sync), tuple(held), tuple(suspended)
    )


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
