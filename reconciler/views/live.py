"""The live view of rollouts in progress as text: ``status --watch`` (a snapshot from
``loop/live.py``), and the lines ``apply`` prints as steps begin, while they wait and as
each evaluation is made."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconciler.model.analysis import Evaluation
from reconciler.model.plan import Action, Step

# What a step is called while it runs (a server's state in the live view).
RUNNING = {
    Action.DRAIN: "draining",
    Action.LOAD: "loading",
    Action.VERIFY: "verifying",
    Action.ANALYZE: "analyzing",
    Action.UNLOAD: "unloading",
    Action.REPLACE_LIBRARY: "replacing the library",
    Action.ROUTE: "routing",
}


def _versions(versions: Any) -> str:
    return "[" + ", ".join(map(str, versions)) + "]"


def _checks(checks: Any) -> str:
    shown = []
    for check in checks:
        value = check.get("value")
        figure = "n/a" if value is None else f"{value:.4g}"
        shown.append(f"{check['check']}={figure} ({check.get('threshold')}) {check['verdict']}")
    return "; ".join(shown)


def live_text(snapshot: Mapping[str, Any] | None, now: float) -> str:
    """What ``status --watch`` shows of the pass in progress at ``now`` (wall clock)."""
    if not snapshot or not snapshot.get("rollouts"):
        return "no rollout in progress"
    revision = str(snapshot.get("revision") or "")[:12]
    # ``abandoned``: the reconciler that wrote it holds no lock any more (it was killed):
    # nothing runs, so the view says where it stopped, without durations that keep growing.
    abandoned = bool(snapshot.get("abandoned"))
    lines = [
        f"pass at {revision}, started {snapshot.get('pass_started_at')}, "
        f"updated {snapshot.get('updated_at')}"
    ]
    if abandoned:
        lines.append(
            "not running: the reconciler that wrote this stopped mid-pass (nobody holds the "
            "reconciler lock); the next pass resumes these rollouts"
        )
    for rollout in snapshot["rollouts"]:
        lines.append(f"{rollout['deployment']} (model {rollout['model']})")
        for server, entry in sorted(rollout["servers"].items()):
            since = entry.get("since_epoch")
            running = f" for {max(0.0, now - since):.0f}s" if since is not None else ""
            state = f"{'last seen ' if abandoned else ''}{entry.get('state')}"
            line = f"  {server}: {state} {_versions(entry.get('versions', []))}"
            line += "" if abandoned else running
            ends = entry.get("analysis_ends_epoch")
            if (
                not abandoned
                and ends is not None
                and str(entry.get("state", "")).endswith("analyzing")
            ):
                line += f", {max(0.0, ends - now):.0f}s left"
            lines.append(line)
            draining = entry.get("draining")
            if draining and not abandoned:
                lines.append(f"    {drain_text(draining)}")
            evaluation = entry.get("evaluation")
            if evaluation:
                lines.append(
                    f"    evaluation {evaluation['index'] + 1} at {evaluation['at_seconds']:g}s: "
                    f"{evaluation['verdict']}: {_checks(evaluation['checks'])}"
                )
            if entry.get("error"):
                lines.append(f"    error: {entry['error']}")
    return "\n".join(lines)


def drain_text(draining: Mapping[str, Any]) -> str:
    """A drain's latest reading (``model.results.Draining.as_json``) in words."""
    rate = draining.get("requests_per_second")
    arriving = (
        "requests of the sequences in flight still arriving"
        if rate is None
        else f"{rate:.3g} request(s)/s still arriving (the sequences in flight)"
        if rate > 0
        else "no request arriving"
    )
    queued = f", {draining['pending']:g} queued" if draining.get("pending") else ""
    return (
        f"draining: {arriving}{queued}; quiet {draining.get('quiet_seconds', 0):g}s of the "
        f"{draining.get('idle_seconds', 0):g}s that end it; at most "
        f"{draining.get('seconds_left', 0):.0f}s more"
    )


def started_line(step: Step, reverting: bool) -> str:
    what = "revert " if reverting else ""
    return f"{step.server}/{step.model}: {what}{step.action} {_versions(step.versions)} ..."


def waiting_line(step: Step, seconds: float) -> str:
    """A step still running after ``seconds``: Terraform's 'Still creating... [40s elapsed]'."""
    doing = RUNNING.get(step.action, str(step.action))
    return f"{step.server}/{step.model}: still {doing}... {seconds:.0f}s"


def evaluation_line(step: Step, evaluation: Evaluation, seconds_left: float) -> str:
    checks = "; ".join(
        f"{r.check}={'n/a' if r.value is None else f'{r.value:.4g}'} ({r.threshold}) {r.verdict}"
        for r in evaluation.results
    )
    return (
        f"{step.server}/{step.model}: evaluation {evaluation.index + 1} at "
        f"{evaluation.at:.0f}s: {evaluation.verdict}: {checks} ({seconds_left:.0f}s left)"
    )
