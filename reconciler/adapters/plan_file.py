"""The saved-plan file written by ``plan --out`` and read by
``apply --plan`` (the CLI calls both; it gives the views of the plan to write).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from reconciler.credentials import redact
from reconciler.model.errors import StalePlan
from reconciler.model.reports import PassReport, SavedPlan
from reconciler.model.source import Source

SAVED_PLAN_KIND = "triton-gitops/saved-plan"


def save_plan(
    file: Path,
    source: Source,
    report: PassReport,
    plan_view: Mapping[str, object],
    steps: Sequence[Mapping[str, object]],
) -> None:
    """Write what ``apply --plan`` must find unchanged: revision, servers' state, ``steps``
    (``views.steps.plan_steps_json``, as ``loop.saved_plan`` compares them)."""
    file.write_text(
        json.dumps(
            {
                "format_version": "1",
                "kind": SAVED_PLAN_KIND,
                "repo": redact(source.repo),
                "ref": source.ref,
                "path": source.path,
                "revision": report.revision,
                "served": dict(report.served),
                "steps": list(steps),
                "plan": plan_view,
            },
            indent=2,
        )
        + "\n"
    )


def load_saved_plan(file: Path, source: Source) -> SavedPlan:
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise StalePlan(f"cannot read saved plan {file}: {exc}") from exc
    if not isinstance(data, dict) or data.get("kind") != SAVED_PLAN_KIND:
        raise StalePlan(f"{file} is not a saved triton-gitops plan")
    made_for = (data.get("repo"), data.get("ref"), data.get("path"))
    if made_for != (redact(source.repo), source.ref, source.path):
        raise StalePlan(
            f"{file} was made for repo {made_for[0]} ref {made_for[1]} path "
            f"{made_for[2]!r}, not this source"
        )
    return SavedPlan(str(data["revision"]), dict(data["served"]), tuple(data["steps"]))
