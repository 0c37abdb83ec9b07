"""Views of a Plan and of a pass's outcome: human text and JSON (``format_version`` 1)."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from statistics import median
from typing import Any

from reconciler.core.probes import failures_in_sight
from reconciler.core.records import checks_json, rfc3339
from reconciler.model.analysis import ProbeFigures
from reconciler.model.history import ALL_DEPLOYMENTS, OperatorAction, Rollout
from reconciler.model.plan import Action, ModelChange, Plan, Step
from reconciler.model.reports import Condition, PassReport, StatusReport
from reconciler.model.results import ApplyResult, ChangeResult, Outcome, StepResult
from reconciler.model.shadow import quantile
from reconciler.model.traffic import TrafficPlan
from reconciler.views.steps import step_json

FORMAT_VERSION = "1"


def _list(versions: tuple[int, ...]) -> str:
    return ", ".join(map(str, versions)) if versions else "none"


def _planned_step_json(step: Step) -> dict[str, Any]:
    """A planned step; a load's with the whole config it sends (the repository's
    config.pbtxt merged with spec.config, version_policy set): what Triton will be given."""
    config = {"config": step.config} if step.action is Action.LOAD and step.config else {}
    return {**step_json(step), **config}


def plan_json(plan: Plan) -> dict[str, Any]:
    return {
        "format_version": FORMAT_VERSION,
        "revision": plan.revision,
        "steps": [_planned_step_json(step) for step in plan.steps],
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
        "rollouts": [
            {
                "deployment": r.deployment,
                "model": r.model,
                "stages": [
                    {"name": name, "servers": list(stage), "max_parallel": parallel}
                    for name, stage, parallel in zip(
                        r.stage_names, r.stages, r.max_parallel, strict=True
                    )
                ],
                **({"traffic": _traffic_json(r.traffic)} if r.traffic is not None else {}),
            }
            for r in plan.rollouts
        ],
        "routes": [
            {
                "router": u.router,
                "weights": dict(u.weights),
                "mirror": dict(u.mirror),
                "reason": u.reason,
            }
            for u in plan.routes
        ],
        "suspended": [{"server": s, "model": m} for s, m in plan.suspended],
        "held": [
            {
                "server": h.server,
                "model": h.model,
                "deployment": h.deployment,
                "revision": h.revision,
                "versions": list(h.versions),
                "reason": h.reason,
            }
            for h in plan.held
        ],
    }


def _traffic_json(plan: TrafficPlan) -> dict[str, Any]:
    return {
        "router": plan.router,
        "strategy": str(plan.strategy),
        "old_pool": plan.old_pool,
        "new_pool": plan.new_pool,
        "phases": [
            {
                "name": p.name,
                "weights": dict(p.weights),
                "mirror": dict(p.mirror),
                "watch_seconds": p.watch,
            }
            for p in plan.phases
        ],
        "on_failure": dict(plan.restore.weights),
        "final": dict(plan.final.weights),
        "splits_sequences": plan.splits_sequences,
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
    for rollout in plan.rollouts:
        lines.append(f"rollout of {rollout.deployment} in stages (old versions go after the last):")
        for name, stage, parallel in zip(
            rollout.stage_names, rollout.stages, rollout.max_parallel, strict=True
        ):
            lines.append(f"  {name}: {', '.join(stage)} ({parallel} at once)")
            traffic = rollout.traffic
            if traffic is not None and name == f"{traffic.new_pool} pool":
                lines.append(
                    f"  then through router {traffic.router} ({traffic.strategy}), the "
                    f"analysis watching {traffic.new_pool} under each:"
                )
                if traffic.drop_old_first:
                    lines.append(
                        f"  (old versions leave {', '.join(traffic.drop_old_first)} first: the "
                        "new ones are below them and would take none of the pool's requests; "
                        + (
                            f"the phases after probe them on {traffic.old_probed_on})"
                            if traffic.old_probed_on
                            else "no server of the old pool serves them to probe)"
                        )
                    )
                lines.extend(
                    f"    {phase.name}" + (f" ({phase.watch:g}s)" if phase.watch else "")
                    for phase in traffic.phases
                )
                if traffic.splits_sequences:
                    lines.append(
                        f"  (a sequence model through a router without sequence affinity, "
                        "as allowWithoutSequenceAffinity allows: each step moves requests "
                        f"between {traffic.old_pool} and {traffic.new_pool} on their own; "
                        "its clients must keep each sequence on one server)"
                    )
        if rollout.traffic is not None:
            lines.append(
                f"  then router {rollout.traffic.router}: {rollout.traffic.final.reason}; on "
                f"any failure at once: {rollout.traffic.restore.reason}"
            )
    if plan.routes:
        lines.append("routers:")
        lines.extend(f"  {u.reason}" for u in plan.routes)
    if plan.held:
        lines.append("held (a rollout of this spec failed; kept at what served before):")
        for h in plan.held:
            reason = h.reason.strip().splitlines()[0] if h.reason else ""
            lines.append(
                f"  {h.server}/{h.model}: ModelDeployment {h.deployment} at revision "
                f"{h.revision[:12]} held at {_list(h.versions)}: {reason}"
            )
        lines.append(
            "  (a commit that changes the ModelDeployment releases its hold; "
            "triton-gitops retry lifts it for the same spec)"
        )
    if plan.suspended:
        lines.append("suspended (spec.suspend: true, or triton-gitops suspend; left as they are):")
        lines.extend(f"  {s}/{m}" for s, m in plan.suspended)
    if plan.problems:
        lines.append("problems:")
        lines.extend(f"  {p}" for p in plan.problems)
    lines.append(
        f"plan: {len(plan.changes)} model(s) to change in {len(plan.steps)} step(s), "
        f"{len(plan.in_sync)} in sync, {len(plan.held)} held, {len(plan.problems)} problem(s)"
    )
    if not plan.changes and not plan.problems and not plan.routes:
        lines.append(
            "nothing to do: every server serves what the manifests ask for"
            if not plan.held
            else "nothing to do: held ModelDeployments stay as they are"
        )
    return "\n".join(lines)


def _change_result_text(result: ChangeResult) -> list[str]:
    change = result.change
    lines = [f"{change.server}/{change.model}: {result.outcome}"]
    for r in result.steps:
        mark = "ok" if r.ok else "FAILED"
        versions = _list(r.step.versions)
        lines.append(f"    {r.step.action:<7} {versions:<10} {mark} ({_took(r)})")
        for evaluation in r.evaluations:
            lines.append(
                f"      evaluation {evaluation.index + 1} at {evaluation.at:.1f}s: "
                f"{evaluation.verdict}"
            )
            lines.extend(f"        {check}" for check in evaluation.results)
            if evaluation.probes is not None:
                lines.append(f"        {evaluation.probes}")
        if r.error:
            lines.append(textwrap.indent(r.error.strip(), "      "))
    for r in result.revert:
        mark = "ok" if r.ok else "FAILED"
        lines.append(f"    revert {r.step.action:<7} {_list(r.step.versions):<10} {mark}")
        if r.cut is not None:
            lines.append(f"      {r.cut.text(_list(r.step.versions))}")
        if r.error:
            lines.append(textwrap.indent(r.error.strip(), "      "))
    if result.outcome is Outcome.REVERTED:
        lines.append(f"    serving {_list(change.serving)} as before")
        if result.rollback_seconds is not None:
            lines.append(
                f"    old versions alone again {result.rollback_seconds * 1000:.0f} ms after "
                "the failing evaluation"
            )
    return lines


def progress_line(result: StepResult) -> str:
    """One line as a step finishes, for watching a long apply."""
    step = result.step
    mark = "ok" if result.ok else "FAILED"
    what = "revert " if result.reverting else ""
    return (
        f"{step.server}/{step.model}: {what}{step.action} {_list(step.versions)} "
        f"{mark} ({_took(result)})"
    )


def _took(result: StepResult) -> str:
    """A step's time; an unload's wait for the streams in flight on the versions it drops;
    what a streaming model's analysis that passed could see of streams failing midway."""
    if result.step.action is Action.ANALYZE and result.ok and result.step.streaming:
        windows = [e.probes for e in result.evaluations if e.probes is not None]
        sight = failures_in_sight(sum(p.sent for p in windows), sum(p.failed for p in windows))
        if sight is not None:
            return f"{result.seconds:.2f}s; {sight}"
    if result.cut is not None:
        return f"{result.seconds:.2f}s; {result.cut.text(_list(result.step.versions))}"
    if result.stream_wait is None:
        return f"{result.seconds:.2f}s"
    return (
        f"{result.seconds:.2f}s; waited {result.stream_wait:.2f}s for the streams in flight on "
        f"{_list(result.step.dropped)} to end"
    )


def result_text(result: ApplyResult) -> str:
    lines = [f"applied revision {result.revision}"]
    for change in result.changes:
        lines.extend(_change_result_text(change))
    converged = sum(c.outcome is Outcome.CONVERGED for c in result.changes)
    lines.append(f"apply: {converged} of {len(result.changes)} change(s) converged")
    return "\n".join(lines)


def _cut_json(result: StepResult) -> dict[str, Any]:
    """A switch back's drain not waited for: what it cut (``model.results.Cut``)."""
    if result.cut is None:
        return {}
    rate = None if result.cut.rate is None else round(result.cut.rate, 3)
    return {"cut": {"requests_per_second": rate, "seconds": round(result.cut.seconds, 3)}}


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
                        **(
                            {"stream_wait_seconds": round(r.stream_wait, 4)}
                            if r.stream_wait is not None
                            else {}
                        ),
                        "error": r.error,
                        # Each phase's analysis of a traffic rollout (its shadow comparison
                        # among them), not only the last.
                        **({"analysis": _analysis_json(r)} if r.evaluations else {}),
                    }
                    for r in c.steps
                ],
                "revert": [
                    {**step_json(r.step), "ok": r.ok, "error": r.error, **_cut_json(r)}
                    for r in c.revert
                ],
                "analysis": _analysis_json(c.analysis),
                "rollback_seconds": c.rollback_seconds,
            }
            for c in result.changes
        ],
    }


def _analysis_json(analysis: StepResult | None) -> dict[str, Any] | None:
    if analysis is None:
        return None
    return {
        "verdict": str(analysis.verdict) if analysis.verdict else None,
        "evaluations": [
            {
                "index": e.index,
                "at_seconds": round(e.at, 3),
                "verdict": str(e.verdict),
                "checks": list(checks_json(e)),
                "probes": _probes_json(e.probes),
                "counted": e.counted,
                "aborted": e.aborted,
            }
            for e in analysis.evaluations
        ],
    }


def _probes_json(probes: ProbeFigures | None) -> dict[str, Any] | None:
    if probes is None:
        return None
    return {
        "sent": probes.sent,
        "failed": probes.failed,
        "mean_ms": round(probes.seconds / probes.sent * 1e3, 3) if probes.sent else None,
        "old_sent": probes.old_sent,
        "old_failed": probes.old_failed,
        "old_mean_ms": (
            round(probes.old_seconds / probes.old_sent * 1e3, 3) if probes.old_sent else None
        ),
        # What the latency check compares (core/analysis: medians, not means).
        "median_ms": round(median(probes.latencies) * 1e3, 3) if probes.latencies else None,
        "old_median_ms": (
            round(median(probes.old_latencies) * 1e3, 3) if probes.old_latencies else None
        ),
        # A streaming model's probes are streams: those that did not end with Triton's
        # final flag, and the median of each stream's median time between responses.
        "streamed": probes.streamed,
        "cut": probes.cut,
        "gap_median_ms": round(median(probes.gaps) * 1e3, 3) if probes.gaps else None,
        "p95_ms": (
            round((quantile(probes.latencies, 0.95) or 0.0) * 1e3, 3) if probes.latencies else None
        ),
        "old_gap_median_ms": round(median(probes.old_gaps) * 1e3, 3) if probes.old_gaps else None,
        # The old version probed under its clients' load before the new versions loaded.
        "old_loaded_sent": len(probes.old_loaded),
        "old_loaded_median_ms": (
            round(median(probes.old_loaded) * 1e3, 3) if probes.old_loaded else None
        ),
        "skipped": probes.skipped,
        "last_error": probes.last_error if probes.failed else None,
        "note": probes.note,
    }


def report_json(report: PassReport) -> str:
    data = plan_json(report.plan)
    if report.result is not None:
        data["result"] = result_json(report.result)
        data["reverts"] = list(report.reverts)
    data["ok"] = report.ok
    return json.dumps(data, indent=2)


def report_text(report: PassReport) -> str:
    parts = [plan_text(report.plan)]
    if report.result is not None and report.result.changes:
        parts.append(result_text(report.result))
    parts.extend(report.reverts)
    return "\n".join(parts)


def history_text(rollouts: list[Rollout], actions: Sequence[OperatorAction] = ()) -> str:
    lines = [] if rollouts else ["no rollouts recorded"]
    for r in rollouts:
        when = datetime.fromtimestamp(r.finished_at, UTC).strftime("%Y-%m-%d %H:%M:%S")
        verdict = f", analysis {r.verdict}" if r.verdict else ""
        lines.append(
            f"{when}Z {r.revision[:12]} {r.server}/{r.model} {_list(r.from_versions)} -> "
            f"{_list(r.to_versions)}: {r.outcome}{verdict}"
        )
        for check in r.checks:
            value = "n/a" if check["value"] is None else f"{check['value']:.6g}"
            lines.append(f"    {check['check']}={value} ({check['threshold']}): {check['verdict']}")
        if r.error and r.outcome != "converged":
            lines.append(f"    {r.error.strip().splitlines()[0]}")
    if actions:
        lines.append("on-call actions:")
        for a in actions:
            detail = f": {a.detail}" if a.detail else ""
            target = "every ModelDeployment" if a.target == ALL_DEPLOYMENTS else a.target
            lines.append(f"{a.at} {a.verb} {target} by {a.by}{detail}")
    return "\n".join(lines)


def history_json(rollouts: list[Rollout], actions: Sequence[OperatorAction] = ()) -> str:
    return json.dumps(
        {
            "format_version": FORMAT_VERSION,
            "rollouts": [
                {
                    "revision": r.revision,
                    "deployment": r.deployment,
                    "server": r.server,
                    "model": r.model,
                    "from_versions": list(r.from_versions),
                    "to_versions": list(r.to_versions),
                    "outcome": r.outcome,
                    "verdict": r.verdict,
                    "checks": list(r.checks),
                    "error": r.error,
                    "rollback_seconds": r.rollback_seconds,
                    "finished_at": rfc3339(r.finished_at),
                }
                for r in rollouts
            ],
            "operator_actions": [
                {"at": a.at, "verb": a.verb, "target": a.target, "by": a.by, "detail": a.detail}
                for a in actions
            ],
        },
        indent=2,
    )


def status_text(report: StatusReport) -> str:
    lines = [
        f"revision {report.revision} (last applied: {report.last_applied or 'none'})",
    ]
    if report.invalid:
        lines.append(
            f"MANIFESTS INVALID at {report.revision[:12]}: {len(report.invalid)} problem(s); "
            f"the rows are what the last applied revision {str(report.declared_at)[:12]} "
            "declares, and nothing is applied until a commit fixes them"
        )
        lines.extend(f"  {problem}" for problem in report.invalid)
    server = None
    for m in report.models:
        if m.server != server:
            server = m.server
            why = report.unreachable.get(server)
            lines.append(f"server {server}" + (f": UNREACHABLE ({why})" if why else ""))
        line = (
            f"  {m.model:<20} desired {_list(m.desired):<10} serving {_list(m.serving):<10} "
            f"{m.state}" + (" (streaming)" if m.streaming else "")
        )
        lines.append(line + (f": {m.detail}" if m.detail else ""))
        if m.last_rollout is not None:
            r = m.last_rollout
            lines.append(
                f"    last rollout {r.revision[:12]} {_list(r.from_versions)} -> "
                f"{_list(r.to_versions)}: {r.outcome}"
                + (
                    f" ({r.error.strip().splitlines()[0]})"
                    if r.error and r.outcome != "converged"
                    else ""
                )
            )
    for router, route in report.routes.items():
        lines.append(f"router {router}: {route}")
    if report.last_pass is not None:
        ok = "ok" if report.last_pass["ok"] else "with problems"
        lines.append(f"last pass: revision {str(report.last_pass['revision'])[:12]}, {ok}")
    return "\n".join(lines)


def status_json(report: StatusReport) -> str:
    return json.dumps(
        {
            "format_version": FORMAT_VERSION,
            "revision": report.revision,
            "last_applied": report.last_applied,
            # Argo CD's ComparisonError, as one condition of the whole source.
            "manifests": {
                "valid": not report.invalid,
                "declared_at": report.declared_at or report.revision,
                "problems": [
                    {"file": p.file, "line": p.line, "message": p.message} for p in report.invalid
                ],
            },
            "unreachable": dict(report.unreachable),
            "routes": dict(report.routes),
            "last_pass": _last_pass_json(report.last_pass),
            "deployments": [
                {"name": name, "conditions": [_condition_json(c) for c in listed]}
                for name, listed in report.conditions.items()
            ],
            "models": [
                {
                    "server": m.server,
                    "model": m.model,
                    "deployment": m.deployment,
                    "desired": list(m.desired),
                    "serving": list(m.serving),
                    "state": m.state,
                    "detail": m.detail,
                    "streaming": m.streaming,
                    "last_rollout": None
                    if m.last_rollout is None
                    else {
                        "revision": m.last_rollout.revision,
                        "from_versions": list(m.last_rollout.from_versions),
                        "to_versions": list(m.last_rollout.to_versions),
                        "outcome": m.last_rollout.outcome,
                        "error": m.last_rollout.error,
                        "finished_at": rfc3339(m.last_rollout.finished_at),
                    },
                }
                for m in report.models
            ],
        },
        indent=2,
    )


def _condition_json(condition: Condition) -> dict[str, str]:
    """metav1.Condition's field names, as ``kubectl get -o json`` shows them."""
    return {
        "type": condition.type,
        "status": condition.status,
        "reason": condition.reason,
        "message": condition.message,
        "lastTransitionTime": condition.last_transition_time,
    }


def _last_pass_json(last: Mapping[str, object] | None) -> dict[str, object] | None:
    if last is None:
        return None
    finished = last.get("finished_at")
    # The state store keeps epoch seconds; the JSON says RFC 3339 like every other time.
    when = rfc3339(finished) if isinstance(finished, int | float) else finished
    return {**last, "finished_at": when}
