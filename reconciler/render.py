"""Views of a Plan and of a pass's outcome: human text and JSON (``format_version`` 1)."""

from __future__ import annotations

import json
import textwrap
from typing import Any

from reconciler.apply import ApplyResult, ChangeResult, Outcome, StepResult
from reconciler.loop import PassReport
from reconciler.plan import Action, ModelChange, Plan, Step

FORMAT_VERSION = "1"


def _list(versions: tuple[int, ...]) -> str:
    return ", ".join(map(str, versions)) if versions else "none"


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
    return data


def plan_json(plan: Plan) -> dict[str, Any]:
    return {
        "format_version": FORMAT_VERSION,
        "revision": plan.revision,
        "steps": [step_json(step) for step in plan.steps],
        "changes": [
            {
                "server": c.server,
                "model": c.model,
                "deployment": c.deployment,
                "serving": list(c.serving),
                "desired": list(c.desired),
            }
            for c in plan.changes
        ],
        "problems": [
            {"server": p.server, "model": p.model, "message": p.message} for p in plan.problems
        ],
        "in_sync": [{"server": s, "model": m} for s, m in plan.in_sync],
    }


def _step_line(step: Step) -> str:
    if step.action is Action.UNLOAD:
        what = "unload" if not step.versions else f"unload {_list(step.dropped)}"
        target = "the model" if not step.versions else f"keep {_list(step.versions)}"
        return f"{what:<12} {target:<14} {step.reason}"
    return f"{step.action:<12} {_list(step.versions):<14} {step.reason}"


def _change_header(change: ModelChange) -> str:
    if change.deployment is None:
        return f"  model {change.model}: {_list(change.serving)} -> removed"
    return f"  model {change.model}: {_list(change.serving)} -> {_list(change.desired)}"


def plan_text(plan: Plan) -> str:
    lines = [f"revision {plan.revision}"]
    server = None
    for change in plan.changes:
        if change.server != server:
            server = change.server
            lines.append(f"server {server}")
        lines.append(_change_header(change))
        lines.extend(f"    {i}. {_step_line(step)}" for i, step in enumerate(change.steps, 1))
    if plan.problems:
        lines.append("problems:")
        lines.extend(f"  {p}" for p in plan.problems)
    lines.append(
        f"plan: {len(plan.changes)} model(s) to change in {len(plan.steps)} step(s), "
        f"{len(plan.in_sync)} in sync, {len(plan.problems)} problem(s)"
    )
    if not plan.changes and not plan.problems:
        lines.append("nothing to do: every server serves what the manifests ask for")
    return "\n".join(lines)


def _change_result_text(result: ChangeResult) -> list[str]:
    change = result.change
    lines = [f"{change.server}/{change.model}: {result.outcome}"]
    for r in result.steps:
        mark = "ok" if r.ok else "FAILED"
        versions = _list(r.step.versions)
        lines.append(f"    {r.step.action:<7} {versions:<10} {mark} ({r.seconds:.2f}s)")
        if r.error:
            lines.append(textwrap.indent(r.error.strip(), "      "))
    for r in result.revert:
        mark = "ok" if r.ok else "FAILED"
        lines.append(f"    revert {r.step.action:<7} {_list(r.step.versions):<10} {mark}")
        if r.error:
            lines.append(textwrap.indent(r.error.strip(), "      "))
    if result.outcome is Outcome.REVERTED:
        lines.append(f"    serving {_list(change.serving)} as before")
    return lines


def progress_line(result: StepResult) -> str:
    """One line as a step finishes, for watching a long apply."""
    step = result.step
    mark = "ok" if result.ok else "FAILED"
    what = "revert " if result.reverting else ""
    return (
        f"{step.server}/{step.model}: {what}{step.action} {_list(step.versions)} "
        f"{mark} ({result.seconds:.2f}s)"
    )


def result_text(result: ApplyResult) -> str:
    lines = [f"applied revision {result.revision}"]
    for change in result.changes:
        lines.extend(_change_result_text(change))
    converged = sum(c.outcome is Outcome.CONVERGED for c in result.changes)
    lines.append(f"apply: {converged} of {len(result.changes)} change(s) converged")
    return "\n".join(lines)


def result_json(result: ApplyResult) -> dict[str, Any]:
    return {
        "format_version": FORMAT_VERSION,
        "revision": result.revision,
        "changes": [
            {
                "server": c.change.server,
                "model": c.change.model,
                "outcome": str(c.outcome),
                "error": c.error,
                "steps": [
                    {
                        **step_json(r.step),
                        "ok": r.ok,
                        "seconds": round(r.seconds, 4),
                        "error": r.error,
                    }
                    for r in c.steps
                ],
                "revert": [{**step_json(r.step), "ok": r.ok, "error": r.error} for r in c.revert],
            }
            for c in result.changes
        ],
    }


def report_json(report: PassReport) -> str:
    data = plan_json(report.plan)
    if report.result is not None:
        data["result"] = result_json(report.result)
    data["ok"] = report.ok
    return json.dumps(data, indent=2)


def report_text(report: PassReport) -> str:
    parts = [plan_text(report.plan)]
    if report.result is not None and report.result.changes:
        parts.append(result_text(report.result))
    return "\n".join(parts)
