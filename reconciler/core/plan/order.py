"""The order of a server's changes: ensembles after the models they
compose, unloads after loads, dependencies first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from reconciler.core.plan.changes import composing_models, target_config
from reconciler.model.plan import Action, ModelChange, PlanProblem
from reconciler.model.serving import ServerState
from reconciler.model.spec import Placement


def order_changes(
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
    if not changes:
        return [], []
    removed = {c.model for c in changes if c.deployment is None}
    needs = _needs(placements, observed, removed)
    kept: list[ModelChange] = []
    problems: list[PlanProblem] = []
    for change in changes:
        outcome = _checked(server, change, needs, set(placements), removed)
        if isinstance(outcome, PlanProblem):
            problems.append(outcome)
        else:
            kept.append(outcome)
    return _depth_first(kept, needs, removed), problems


def _needs(
    placements: Mapping[str, Placement], observed: ServerState, removed: set[str]
) -> dict[str, set[str]]:
    """What each model needs on this server: the models its ensemble config composes and
    those its dependsOn targets place here; for a removed model, what its loaded config
    composes."""
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
    for model in removed:
        needs[model] = set(composing_models(observed.model(model).loaded_config))
    return needs


def _checked(
    server: str,
    change: ModelChange,
    needs: Mapping[str, set[str]],
    placed: set[str],
    removed: set[str],
) -> ModelChange | PlanProblem:
    """The change, or why it is refused: a load that would make Triton load models nobody
    placed, a removal that would force out models that stay. A removal that takes models
    with it names them on its unload."""
    if change.deployment is not None:
        loads = any(s.action is Action.LOAD for s in change.steps)
        missing = sorted(needs.get(change.model, set()) - placed)
        if loads and missing:
            return PlanProblem(
                server,
                change.model,
                f"needs {', '.join(missing)}, which no ModelDeployment places on this "
                "server: loading it would make Triton load them with their default "
                "versions",
                "dependency",
            )
        return change
    staying = sorted(m for m in placed if change.model in needs.get(m, set()))
    if staying:
        return PlanProblem(
            server,
            change.model,
            f"not unloaded: {', '.join(staying)} still need(s) it here, and unloading "
            "it would force them out; remove them too, or keep it",
            "dependency",
        )
    going = tuple(sorted(m for m in removed if change.model in needs.get(m, set())))
    if not going:
        return change
    unload = replace(
        change.steps[0],
        dependents=going,
        reason=f"{change.steps[0].reason}; after {', '.join(going)}, which need it",
    )
    return replace(change, steps=(unload, *change.steps[1:]))


def _depth_first(
    kept: list[ModelChange], needs: Mapping[str, set[str]], removed: set[str]
) -> list[ModelChange]:
    """A model after everything it needs; removals after loads, and a removed model after
    the removed models that need it."""
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
    return ordered
