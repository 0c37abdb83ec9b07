"""What an ``apply --output json`` report says about a rollout, read the same way by every
rollout scenario (``bench.false_verdicts``, ``bench.streaming``): each change's outcome, why
it did not converge in the reconciler's words, the rule that caught it, the traffic phase it
failed under. Pure: dicts in, strings out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def outcomes(report: Mapping[str, Any]) -> dict[str, str]:
    result = report.get("result") or {}
    return {f"{c['server']}/{c['model']}": c["outcome"] for c in result.get("changes", [])}


def _unconverged(report: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The changes that did not converge, the ones that failed first (reverted, failed),
    then those skipped because another server's failure stopped the rollout."""
    result = report.get("result") or {}
    changes = [c for c in result.get("changes", []) if c.get("outcome") != "converged"]
    return sorted(changes, key=lambda c: c.get("outcome") == "skipped")


def phase(report: Mapping[str, Any]) -> str | None:
    """In a traffic rollout, the route its failing change had last set (the reason of its
    last route step that succeeded: the phase the analysis failed under); None outside one."""
    for change in _unconverged(report):
        routes = [s for s in change.get("steps", []) if s.get("action") == "route" and s.get("ok")]
        if routes:
            return str(routes[-1].get("reason", ""))
    return None


def verdict_text(report: Mapping[str, Any], limit: int = 400) -> str:
    """Why an apply did not converge, in the reconciler's words: each change that failed and
    its error (the servers skipped because of it, by name), the plan's problems."""
    parts: list[str] = []
    skipped: list[str] = []
    for change in _unconverged(report):
        if change.get("outcome") == "skipped" and parts:
            skipped.append(str(change["server"]))
            continue
        error = (change.get("error") or "").strip()
        parts.append(f"{change['server']}: {change.get('outcome')}: {error}"[:limit])
    if skipped:
        parts.append(f"skipped: {', '.join(skipped)}")
    for problem in report.get("problems", []):
        parts.append(f"problem: {problem.get('message', '')}"[:limit])
    return " | ".join(parts)


def caught_by(report: Mapping[str, Any]) -> str:
    """The rule that stopped a rollout: a plan problem (refused before any load), a failed
    verify, the early abort, or an evaluation's failing checks; "not caught" otherwise."""
    result = report.get("result") or {}
    changes = result.get("changes", [])
    if not changes and report.get("problems"):
        message = report["problems"][0].get("message", "")
        kind = "interface change" if "interface" in message else "plan problem"
        return f"refused before any load ({kind})"
    for change in _unconverged(report):
        failed = next((s for s in change.get("steps", []) if not s.get("ok", True)), None)
        action = failed.get("action") if failed else None
        if action == "verify":
            error = (failed or {}).get("error") or ""
            return "verify: smoke case" if "smoke" in error else "verify"
        evaluations = (change.get("analysis") or {}).get("evaluations", [])
        if action == "analyze" and evaluations:
            last = evaluations[-1]
            failing = [c for c in last.get("checks", []) if c.get("verdict") == "fail"]
            if last.get("aborted"):
                detail = " ".join(c.get("detail") or "" for c in last.get("checks", []))
                if "in a row" in detail:
                    return "early abort: probes in a row"
                return "early abort: rate"
            if failing:
                names = ", ".join(c.get("check", "?") for c in failing)
                return f"evaluation {last.get('index', 0) + 1}: {names}"
            return f"analysis {(change.get('analysis') or {}).get('verdict')}"
        return f"{action or change.get('outcome')} step"
    return "not caught"
