"""Views for code review and CI: a DesiredDiff or a Plan as text, JSON and a pull-request
comment in Markdown; validation problems as GitHub Actions annotations and JSON.

Called by the CLI's ``diff``, ``plan --output markdown`` and ``validate --output github|json``.
Pure: strings and dicts in, strings and dicts out; everything is sorted, so the same input
always renders the same bytes (a CI job can compare or update a comment in place). The
Markdown starts with an HTML comment (``<!-- triton-gitops diff -->`` or ``plan``) that a
workflow can search for to edit its previous comment instead of adding one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from reconciler.core.review_diff import (
    Change,
    DesiredDiff,
    FieldChange,
    ModelDiff,
    ReviewWarning,
    WarningKind,
    plan_warnings,
)
from reconciler.model.plan import Action, ModelChange, Plan, Step
from reconciler.model.problems import Problem
from reconciler.views.render import FORMAT_VERSION, plan_text

DIFF_MARKER = "<!-- triton-gitops diff -->"
PLAN_MARKER = "<!-- triton-gitops plan -->"
_CELL_LIMIT = 60  # longer config values are cut in tables; the details block has them whole

_WARNING_TITLES = {
    WarningKind.UNLOAD: "Unloads a model",
    WarningKind.SERVER_EMPTIED: "Empties a server",
    WarningKind.INTERFACE: "Changes inputs or outputs",
    WarningKind.FULL_RELOAD: "Reloads fully",
    WarningKind.KEPT_CONFIG: "Removed config stays loaded",
    WarningKind.NO_ANALYSIS: "No post-swap analysis",
}


def _list(versions: Iterable[int]) -> str:
    return ", ".join(map(str, versions)) or "none"


def short(revision: str) -> str:
    return revision[:12]


def _value(value: Any) -> str:
    return "(absent)" if value is None else json.dumps(value, sort_keys=True)


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _plural(count: int, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else (many or one + 's')}"


def plain_md(text: str) -> str:
    """Plain text made inert in Markdown: no HTML, no code spans, no table breaks. (A ">"
    starts a quote only at the start of a line, where this text never is.)"""
    return (
        text.replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace("`", "\\`")
        .replace("|", "\\|")
        .replace("\n", " ")
    )


def code(text: str, *, cell: bool = False) -> str:
    """An inline code span holding ``text`` as it is; in a table ``cell``, | is escaped (GFM
    splits cells before it reads code spans)."""
    text = text.replace("\n", " ")
    if cell:
        text = text.replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _cut(text: str) -> str:
    return text if len(text) <= _CELL_LIMIT else text[: _CELL_LIMIT - 1] + "…"


def _block(text: str, summary: str) -> list[str]:
    """A collapsed <details> block holding ``text`` verbatim in a fenced code block."""
    longest = max((len(run) for run in re.findall(r"`{3,}", text)), default=2)
    fence = "`" * (longest + 1)
    return [
        "<details>",
        f"<summary>{summary}</summary>",
        "",
        f"{fence}text",
        text,
        fence,
        "",
        "</details>",
    ]


def _warning_lines(warnings: Sequence[ReviewWarning]) -> list[str]:
    if not warnings:
        return []
    lines = ["#### Warnings", ""]
    for w in warnings:
        where = []
        if w.model:
            where.append(code(w.model))
        if w.servers:
            where.append(("on " if w.model else "server ") + ", ".join(map(code, w.servers)))
        if w.deployment and w.deployment != w.model:
            where.append(f"(ModelDeployment {code(w.deployment)})")
        lines.append(f"- **{_WARNING_TITLES[w.kind]}**: {' '.join(where)}: {plain_md(w.message)}")
    return [*lines, ""]


def markdown_table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(" --- " for _ in header) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
    ]


def _field_text(change: FieldChange) -> str:
    return f"{change.key}: {_value(change.old)} -> {_value(change.new)}"


def _model_what(change: ModelDiff) -> str:
    """What happens to one model on one server, in words (text and Markdown)."""
    if change.change is Change.ADDED:
        return f"newly placed: load {_list(change.new_versions)}"
    if change.change is Change.REMOVED:
        return "unloaded: no ModelDeployment places it here any more"
    parts = []
    if change.versions_added:
        parts.append(f"load {_list(change.versions_added)}")
    if change.versions_removed:
        parts.append(f"unload {_list(change.versions_removed)}")
    return ", then ".join(parts)


def diff_text(diff: DesiredDiff, base_rev: str, head_rev: str) -> str:
    lines = [f"base {base_rev}", f"head {head_rev}"]
    by_server: dict[str, list[ModelDiff]] = {}
    for change in diff.models:
        by_server.setdefault(change.server, []).append(change)
    servers = {s.server: s for s in diff.servers}
    for name in sorted(set(by_server) | set(servers)):
        server = servers.get(name)
        if server is not None and server.change is Change.REMOVED:
            kept = f"; it keeps serving {', '.join(server.models)}" if server.models else ""
            lines.append(f"server {name}: removed from the manifests (no longer reconciled{kept})")
            continue
        added = server is not None and server.change is Change.ADDED
        lines.append(f"server {name}" + (": added" if added else ""))
        if server is not None:
            lines.extend(f"  {_field_text(f)}" for f in server.fields)
        for change in by_server.get(name, []):
            before = _list(change.old_versions) if change.old_versions else "not placed"
            after = _list(change.new_versions) if change.new_versions else "removed"
            lines.append(
                f"  model {change.model}: {before} -> {after} (ModelDeployment {change.deployment})"
            )
            what = _model_what(change)
            if what:
                lines.append(f"    {what}")
            lines.extend(f"    config {_field_text(f)}" for f in change.config)
            if change.verify:
                lines.append(f"    verify changed: {', '.join(change.verify)}")
    if diff.deployments_added:
        lines.append(f"ModelDeployments added: {', '.join(diff.deployments_added)}")
    if diff.deployments_removed:
        lines.append(f"ModelDeployments removed: {', '.join(diff.deployments_removed)}")
    if diff.warnings:
        lines.append("warnings:")
        lines.extend(f"  {w}" for w in diff.warnings)
    lines.append(_diff_summary(diff))
    return "\n".join(lines)


def _diff_summary(diff: DesiredDiff) -> str:
    if not diff.has_changes:
        return "diff: no change to the desired state"
    servers = {c.server for c in diff.models}
    counts = [
        f"{_plural(len(diff.models), 'model change')} on {_plural(len(servers), 'server')}",
    ]
    unloaded = sum(c.change is Change.REMOVED for c in diff.models)
    placed = sum(c.change is Change.ADDED for c in diff.models)
    if placed:
        counts.append(f"{placed} newly placed")
    if unloaded:
        counts.append(f"{unloaded} unloaded")
    if diff.servers_added:
        counts.append(_plural(len(diff.servers_added), "server") + " added")
    if diff.servers_removed:
        counts.append(_plural(len(diff.servers_removed), "server") + " removed")
    if diff.deployments_removed:
        counts.append(_plural(len(diff.deployments_removed), "ModelDeployment") + " removed")
    counts.append(_plural(len(diff.warnings), "warning"))
    return "diff: " + ", ".join(counts)


def _field_json(change: FieldChange) -> dict[str, Any]:
    return {"key": change.key, "old": change.old, "new": change.new}


def diff_json(diff: DesiredDiff, base_rev: str, head_rev: str) -> dict[str, Any]:
    return {
        "format_version": FORMAT_VERSION,
        "base": base_rev,
        "head": head_rev,
        "has_changes": diff.has_changes,
        "servers": [
            {
                "server": s.server,
                "change": str(s.change),
                "fields": [_field_json(f) for f in s.fields],
                "models": list(s.models),
            }
            for s in diff.servers
        ],
        "changes": [
            {
                "server": c.server,
                "model": c.model,
                "deployment": c.deployment,
                "change": str(c.change),
                "from": list(c.old_versions),
                "to": list(c.new_versions),
                "versions_added": list(c.versions_added),
                "versions_removed": list(c.versions_removed),
                "config": [_field_json(f) for f in c.config],
                "verify": list(c.verify),
            }
            for c in diff.models
        ],
        "deployments_added": list(diff.deployments_added),
        "deployments_removed": list(diff.deployments_removed),
        "warnings": [_warning_json(w) for w in diff.warnings],
    }


def _warning_json(warning: ReviewWarning) -> dict[str, Any]:
    return {
        "kind": str(warning.kind),
        "model": warning.model,
        "deployment": warning.deployment,
        "servers": list(warning.servers),
        "message": warning.message,
    }


def _model_cell(change: ModelDiff) -> str:
    what = plain_md(_model_what(change))
    if change.change is Change.REMOVED:
        what = f"**{what}**"
    details = [
        f"{code(f.key)} {code(_cut(_value(f.old)), cell=True)} → "
        f"{code(_cut(_value(f.new)), cell=True)}"
        for f in change.config
    ]
    if change.verify:
        details.append(f"verify: {', '.join(change.verify)}")
    return "; ".join(p for p in [what, *details] if p)


def diff_markdown(diff: DesiredDiff, base_rev: str, head_rev: str) -> str:
    lines = [
        DIFF_MARKER,
        f"### triton-gitops diff {code(short(base_rev))} → {code(short(head_rev))}",
        "",
        f"**{_sentence(_diff_summary(diff).removeprefix('diff: '))}**",
        "",
    ]
    by_server: dict[str, list[ModelDiff]] = {}
    for change in diff.models:
        by_server.setdefault(change.server, []).append(change)
    servers = {s.server: s for s in diff.servers}
    for name in sorted(set(by_server) | set(servers)):
        server = servers.get(name)
        heading = f"#### Server {code(name)}"
        if server is not None and server.change is Change.ADDED:
            heading += " (new)"
        if server is not None and server.change is Change.REMOVED:
            heading += " (removed from the manifests)"
        lines += [heading, ""]
        if server is not None and server.change is Change.REMOVED:
            kept = ", ".join(map(code, server.models))
            lines += [
                "No longer reconciled" + (f": it keeps serving {kept} as it is." if kept else "."),
                "",
            ]
            continue
        if server is not None and server.fields:
            lines += [
                "Server fields: "
                + "; ".join(
                    f"{code(f.key)} {code(_cut(_value(f.old)))} → {code(_cut(_value(f.new)))}"
                    for f in server.fields
                ),
                "",
            ]
        rows = [
            (
                code(c.model),
                plain_md(_list(c.old_versions)) if c.old_versions else "—",
                plain_md(_list(c.new_versions)) if c.new_versions else "—",
                _model_cell(c),
            )
            for c in by_server.get(name, [])
        ]
        if rows:
            lines += markdown_table(("model", "from", "to", "what changes"), rows)
    if diff.deployments_removed:
        lines += [
            "ModelDeployments removed: " + ", ".join(map(code, diff.deployments_removed)),
            "",
        ]
    lines += _warning_lines(diff.warnings)
    lines += _block(diff_text(diff, base_rev, head_rev), "Full diff")
    return "\n".join(lines) + "\n"


def _step_summary(step: Step) -> str:
    if step.action is Action.UNLOAD:
        return "unload the model" if not step.versions else f"unload {_list(step.dropped)}"
    if step.action is Action.VERIFY:
        smoke = (
            f" ({_plural(len(step.smoke), 'smoke case')} on {_list(step.smoke_versions)})"
            if step.smoke
            else ""
        )
        return f"verify {_list(step.versions)}{smoke}"
    if step.action is Action.ANALYZE and step.analysis is not None:
        return f"analyze {_list(step.versions)} for {step.analysis.duration:g}s"
    return f"{step.action} {_list(step.versions)}"


def _change_row(change: ModelChange) -> tuple[str, ...]:
    return (
        code(change.model),
        plain_md(_list(change.serving)) if change.serving else "—",
        plain_md(_list(change.desired)) if change.desired else "—",
        " → ".join(plain_md(_step_summary(s)) for s in change.steps),
    )


def plan_markdown(plan: Plan) -> str:
    warnings = plan_warnings(plan)
    servers = sorted({c.server for c in plan.changes})
    summary = [
        f"{_plural(len(plan.changes), 'model change')} in {_plural(len(plan.steps), 'step')} "
        f"on {_plural(len(servers), 'server')}",
        f"{len(plan.in_sync)} in sync",
        f"{len(plan.held)} held",
        _plural(len(plan.problems), "problem"),
        _plural(len(warnings), "warning"),
    ]
    lines = [
        PLAN_MARKER,
        f"### triton-gitops plan at {code(short(plan.revision))}",
        "",
        f"**{_sentence(', '.join(summary))}**",
        "",
    ]
    if not plan.changes and not plan.problems:
        lines += ["Nothing to do: every server serves what the manifests ask for.", ""]
    for server in servers:
        rows = [_change_row(c) for c in plan.changes if c.server == server]
        lines += [f"#### Server {code(server)}", ""]
        lines += markdown_table(("model", "from", "to", "steps"), rows)
    if plan.held:
        lines += ["#### Held", ""]
        for h in sorted(plan.held, key=lambda h: (h.server, h.model)):
            reason = h.reason.strip().splitlines()[0] if h.reason.strip() else "rollout failed"
            lines.append(
                f"- {code(h.model)} on {code(h.server)}: ModelDeployment {code(h.deployment)} "
                f"kept at {plain_md(_list(h.versions))} since {code(short(h.revision))}: "
                f"{plain_md(reason)}"
            )
        lines.append("")
    if plan.problems:
        lines += ["#### Problems", ""]
        lines += [
            f"- {plain_md(str(p))}"
            for p in sorted(plan.problems, key=lambda p: (p.server, p.model or "", p.message))
        ]
        lines.append("")
    lines += _warning_lines(warnings)
    lines += _block(plan_text(plan), "Full plan")
    return "\n".join(lines) + "\n"


def _annotation_data(text: str) -> str:
    # GitHub's escaping of workflow command data (actions/toolkit, command.ts).
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _annotation_property(text: str) -> str:
    return _annotation_data(text).replace(":", "%3A").replace(",", "%2C")


def _sorted(problems: Iterable[Problem]) -> list[Problem]:
    return sorted(problems, key=lambda p: (p.file, p.line, p.message))


def github_annotations(problems: Iterable[Problem], level: str = "error") -> str:
    """One ``::error file=F,line=L::message`` workflow command per problem, one per line
    (``level`` "warning": ``::warning``).

    A problem with no line (0) is annotated on its file only.
    """
    lines = []
    for p in _sorted(problems):
        where = f"file={_annotation_property(p.file)}"
        if p.line > 0:
            where += f",line={p.line}"
        lines.append(f"::{level} {where}::{_annotation_data(p.message)}")
    return "\n".join(lines)


def problems_json(problems: Iterable[Problem], warnings: Iterable[Problem] = ()) -> dict[str, Any]:
    """``validate --output json``; ``warnings`` (said, not failed) only when there are."""
    found, said = _sorted(problems), _sorted(warnings)
    doc: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "valid": not found,
        "problems": [{"file": p.file, "line": p.line, "message": p.message} for p in found],
    }
    if said:
        doc["warnings"] = [{"file": p.file, "line": p.line, "message": p.message} for p in said]
    return doc
