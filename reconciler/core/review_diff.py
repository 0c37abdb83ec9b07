"""What a change to the manifests does to the desired state, for the people who review it.

``diff(base, head)`` compares the DesiredState of two revisions (a pull request's base and
head) with no server in sight: per server and model, the versions added and removed, the
``spec.config`` keys changed, models newly placed or no longer placed (= unloaded), servers
added, changed or removed, ModelDeployments added or removed. ``plan_warnings(plan)`` finds
the same risks in a Plan, where the configs really loaded are known. Both return
``ReviewWarning``s: what a reviewer must not miss. The renderers are in ``review.py``; the CLI's
``diff`` and ``plan --output markdown`` call them. Pure: no I/O.

A diff sees ``spec.config`` only, not the base config it is merged over (config.pbtxt or the
loaded config): an interface it does not declare is invisible here, and a key removed from
``spec.config`` does not change a loaded model, whose loaded config is the base of every load.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from reconciler.core.interface import interface_changes
from reconciler.core.triton_config import canonical, config_drift
from reconciler.model.plan import Action, ModelChange, Plan, Step
from reconciler.model.servers import TritonServer
from reconciler.model.spec import DesiredState, ModelDeployment

# Since Triton 2.49 these config changes are applied to a loaded model in place; a change of
# any other key reloads every version of the model (in the background, the old instance
# serving meanwhile). See triton-on-cpu.md, "Model-control facts".
IN_PLACE_KEYS = frozenset({"version_policy", "instance_group"})


class Change(StrEnum):
    ADDED = "added"
    REMOVED = "removed"
    CHANGED = "changed"


class WarningKind(StrEnum):
    """What a reviewer must see, most serious first (the order warnings are listed in)."""

    UNLOAD = "unload"  # a model leaves a server
    SERVER_EMPTIED = "server-emptied"  # a server loses every model, or leaves the manifests
    INTERFACE = "interface"  # inputs or outputs change: clients may break
    FULL_RELOAD = "full-reload"  # a config change Triton cannot apply in place
    KEPT_CONFIG = "kept-config"  # a key removed from spec.config stays as loaded
    NO_ANALYSIS = "no-analysis"  # new versions take traffic with no metrics watched


_KIND_ORDER = {kind: index for index, kind in enumerate(WarningKind)}


@dataclass(frozen=True)
class FieldChange:
    """One top-level key of a config (or a server field); None on a side where it is absent."""

    key: str
    old: Any = None
    new: Any = None


@dataclass(frozen=True)
class ModelDiff:
    """One model on one server: placed newly (added), no longer (removed), or changed."""

    server: str
    model: str
    change: Change
    deployment: str  # the ModelDeployment at head (at base when removed)
    old_versions: tuple[int, ...]  # empty when added
    new_versions: tuple[int, ...]  # empty when removed
    config: tuple[FieldChange, ...] = ()  # spec.config keys changed (changed only)
    verify: tuple[str, ...] = ()  # spec.verify parts changed: analysis, smoke, timeout

    @property
    def versions_added(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.new_versions) - set(self.old_versions)))

    @property
    def versions_removed(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.old_versions) - set(self.new_versions)))


@dataclass(frozen=True)
class ServerDiff:
    """A TritonServer added to, removed from, or changed in the manifests."""

    server: str
    change: Change
    fields: tuple[FieldChange, ...] = ()  # changed: grpc, metrics, modelRepository, labels
    # added: the models head places there; removed: the models base placed there, which
    # nothing reconciles any more
    models: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReviewWarning:
    kind: WarningKind
    model: str | None
    deployment: str | None
    servers: tuple[str, ...]
    message: str

    def __str__(self) -> str:
        where = f"model {self.model}" if self.model else ""
        if self.servers:
            where += (" on " if where else "server(s) ") + ", ".join(self.servers)
        return f"{self.kind}: {where}: {self.message}" if where else f"{self.kind}: {self.message}"


@dataclass(frozen=True)
class DesiredDiff:
    models: tuple[ModelDiff, ...] = ()  # by server, then model
    servers: tuple[ServerDiff, ...] = ()  # by name
    deployments_added: tuple[str, ...] = ()
    deployments_removed: tuple[str, ...] = ()
    warnings: tuple[ReviewWarning, ...] = ()

    @property
    def servers_added(self) -> tuple[str, ...]:
        return tuple(s.server for s in self.servers if s.change is Change.ADDED)

    @property
    def servers_removed(self) -> tuple[str, ...]:
        return tuple(s.server for s in self.servers if s.change is Change.REMOVED)

    @property
    def has_changes(self) -> bool:
        return bool(
            self.models or self.servers or self.deployments_added or self.deployments_removed
        )


def _normal(key: str, value: Any) -> str:
    """A value as Triton would read it (int64 as text, defaults dropped), for comparison."""
    try:
        return json.dumps(canonical({key: value}).get(key), sort_keys=True)
    except ValueError:  # validation reports it; compare what was written
        return json.dumps(value, sort_keys=True, default=str)


def config_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[FieldChange, ...]:
    """Top-level keys whose value differs between two ``spec.config``s, by key."""
    changes = []
    for key in sorted(set(old) | set(new)):
        if key in old and key in new and _normal(key, old[key]) == _normal(key, new[key]):
            continue
        changes.append(FieldChange(key, old.get(key), new.get(key)))
    return tuple(changes)


def reloading_keys(keys: Iterable[str]) -> tuple[str, ...]:
    """Of the config keys a load changes, those Triton cannot apply in place."""
    return tuple(sorted(set(keys) - IN_PLACE_KEYS))


def _server_fields(old: TritonServer, new: TritonServer) -> tuple[FieldChange, ...]:
    pairs = (
        ("grpc", old.grpc, new.grpc),
        ("http", old.http, new.http),
        ("metrics", old.metrics, new.metrics),
        ("modelRepository", old.model_repository, new.model_repository),
        ("labels", dict(old.labels), dict(new.labels)),
    )
    return tuple(FieldChange(key, a, b) for key, a, b in pairs if a != b)


def _verify_changes(old: ModelDeployment, new: ModelDeployment) -> tuple[str, ...]:
    parts = (
        ("analysis", old.analysis != new.analysis),
        ("smoke", old.smoke != new.smoke),
        ("timeout", old.verify_timeout != new.verify_timeout),
    )
    return tuple(name for name, changed in parts if changed)


def _model_diff(
    server: str, model: str, old: ModelDeployment | None, new: ModelDeployment | None
) -> ModelDiff | None:
    if old is None and new is not None:
        return ModelDiff(server, model, Change.ADDED, new.name, (), new.versions)
    if new is None and old is not None:
        return ModelDiff(server, model, Change.REMOVED, old.name, old.versions, ())
    assert old is not None and new is not None
    config = config_changes(old.config, new.config)
    verify = _verify_changes(old, new)
    if old.versions == new.versions and not config and not verify:
        return None
    return ModelDiff(
        server, model, Change.CHANGED, new.name, old.versions, new.versions, config, verify
    )


def _list(values: Iterable[object]) -> str:
    return ", ".join(map(str, values)) or "none"


def _warnings_for(
    change: ModelDiff, old: ModelDeployment | None, new: ModelDeployment | None
) -> list[ReviewWarning]:
    def warn(kind: WarningKind, message: str) -> ReviewWarning:
        return ReviewWarning(kind, change.model, change.deployment, (change.server,), message)

    found = []
    if change.change is Change.REMOVED:
        found.append(warn(WarningKind.UNLOAD, _unload_message(change.old_versions)))
    if change.change is Change.CHANGED and old is not None and new is not None:
        interface = interface_changes(old.config, new.config, whole=False)
        if interface:
            found.append(warn(WarningKind.INTERFACE, "; ".join(interface)))
        changed = [c.key for c in change.config if c.new is not None]
        reloading = reloading_keys(changed)
        if reloading:
            found.append(warn(WarningKind.FULL_RELOAD, _full_reload_message(reloading)))
        for c in change.config:
            if c.new is None:
                found.append(
                    warn(
                        WarningKind.KEPT_CONFIG,
                        f"{c.key} is removed from spec.config, but where the model is loaded "
                        f"it keeps {json.dumps(c.old, sort_keys=True)} (the loaded config is "
                        f"the base of every load): set {c.key} explicitly to change it",
                    )
                )
    return found


def _no_analysis(deployment: ModelDeployment, changes: list[ModelDiff]) -> ReviewWarning | None:
    loading = [c for c in changes if c.versions_added]
    if deployment.analysis is not None or not loading:
        return None
    new = sorted({v for c in loading for v in c.versions_added})
    return ReviewWarning(
        WarningKind.NO_ANALYSIS,
        deployment.model,
        deployment.name,
        tuple(sorted(c.server for c in loading)),
        _no_analysis_message(new, len(deployment.smoke)),
    )


def _unload_message(serving: Iterable[int]) -> str:
    return f"unloaded (serving {_list(serving)}): no ModelDeployment places it there any more"


def _full_reload_message(keys: Iterable[str]) -> str:
    return (
        f"a change of {', '.join(keys)} reloads every version fully (Triton applies only "
        "version_policy and instance_group in place): each is loaded again beside the serving "
        "instance, which costs memory and load time"
    )


def _no_analysis_message(new: Iterable[int], smoke: int) -> str:
    judged = (
        f"readiness and {smoke} smoke case{'s' if smoke > 1 else ''}"
        if smoke
        else "readiness (no smoke case)"
    )
    return (
        f"no spec.verify.analysis: new version(s) {_list(new)} are judged only by {judged}; "
        "no metrics are watched once they take traffic"
    )


def merged(warnings: Iterable[ReviewWarning]) -> tuple[ReviewWarning, ...]:
    """One warning per (kind, model, deployment, message), naming every server it applies to;
    most serious kind first, then by model and server."""
    servers: dict[tuple[WarningKind, str | None, str | None, str], set[str]] = {}
    for w in warnings:
        servers.setdefault((w.kind, w.model, w.deployment, w.message), set()).update(w.servers)
    result = [
        ReviewWarning(kind, model, deployment, tuple(sorted(names)), message)
        for (kind, model, deployment, message), names in servers.items()
    ]
    return tuple(
        sorted(
            result,
            key=lambda w: (_KIND_ORDER[w.kind], w.model or "", w.servers, w.message),
        )
    )


def diff(base: DesiredState, head: DesiredState) -> DesiredDiff:
    """What going from ``base`` to ``head`` changes, and what a reviewer must see."""
    servers: list[ServerDiff] = []
    warnings: list[ReviewWarning] = []
    for name in sorted(set(base.servers) | set(head.servers)):
        if name not in base.servers:
            placed = tuple(sorted(head.placements.get(name, {})))
            servers.append(ServerDiff(name, Change.ADDED, models=placed))
        elif name not in head.servers:
            left = tuple(sorted(base.placements.get(name, {})))
            servers.append(ServerDiff(name, Change.REMOVED, models=left))
            if left:
                warnings.append(
                    ReviewWarning(
                        WarningKind.SERVER_EMPTIED,
                        None,
                        None,
                        (name,),
                        f"removed from the manifests while it serves {_list(left)}: apply "
                        "refuses this revision unless --allow-empty; with it, the server keeps "
                        "serving what it has and is no longer reconciled",
                    )
                )
        else:
            fields = _server_fields(base.servers[name], head.servers[name])
            if fields:
                servers.append(ServerDiff(name, Change.CHANGED, fields))
            if base.placements.get(name) and not head.placements.get(name):
                warnings.append(
                    ReviewWarning(
                        WarningKind.SERVER_EMPTIED,
                        None,
                        None,
                        (name,),
                        "no model is placed on it any more: apply refuses this revision unless "
                        "--allow-empty, with which every model it serves is unloaded",
                    )
                )
    models: list[ModelDiff] = []
    by_deployment: dict[str, list[ModelDiff]] = {}
    for server in sorted(head.servers):
        before = base.placements.get(server, {}) if server in base.servers else {}
        after = head.placements.get(server, {})
        for model in sorted(set(before) | set(after)):
            old = before[model].deployment if model in before else None
            new = after[model].deployment if model in after else None
            change = _model_diff(server, model, old, new)
            if change is None:
                continue
            models.append(change)
            warnings.extend(_warnings_for(change, old, new))
            if new is not None:
                by_deployment.setdefault(new.name, []).append(change)
    for name, changes in by_deployment.items():
        missing = _no_analysis(head.deployments[name], changes)
        if missing is not None:
            warnings.append(missing)
    return DesiredDiff(
        models=tuple(models),
        servers=tuple(servers),
        deployments_added=tuple(sorted(set(head.deployments) - set(base.deployments))),
        deployments_removed=tuple(sorted(set(base.deployments) - set(head.deployments))),
        warnings=merged(warnings),
    )


def _first(steps: tuple[Step, ...], action: Action) -> Step | None:
    return next((s for s in steps if s.action is action), None)


def _plan_change_warnings(change: ModelChange) -> list[ReviewWarning]:
    def warn(kind: WarningKind, message: str) -> ReviewWarning:
        return ReviewWarning(kind, change.model, change.deployment, (change.server,), message)

    if change.deployment is None:
        return [warn(WarningKind.UNLOAD, _unload_message(change.serving))]
    found = []
    load = _first(change.steps, Action.LOAD)
    # A model that served before is put back by a load of the config it was loaded with.
    before = _first(change.revert, Action.LOAD)
    if load is not None and load.config and before is not None and before.config:
        interface = interface_changes(before.config, load.config, whole=True)
        if interface:
            found.append(warn(WarningKind.INTERFACE, "; ".join(interface)))
        reloading = reloading_keys(config_drift(load.config, before.config))
        if reloading:
            found.append(warn(WarningKind.FULL_RELOAD, _full_reload_message(reloading)))
    new = sorted(set(change.desired) - set(change.serving))
    if new and _first(change.steps, Action.ANALYZE) is None:
        verify = _first(change.steps, Action.VERIFY)
        smoke = len(verify.smoke) if verify is not None else 0
        found.append(warn(WarningKind.NO_ANALYSIS, _no_analysis_message(new, smoke)))
    return found


def plan_warnings(plan: Plan) -> tuple[ReviewWarning, ...]:
    """The warnings of ``diff``, from what the servers really run: a plan knows the loaded
    configs, so it sees interface and reload changes that come from the base config too."""
    return merged(w for change in plan.changes for w in _plan_change_warnings(change))
