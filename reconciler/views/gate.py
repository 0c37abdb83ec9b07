"""Views of a ``gate`` run (``model/gate.GateReport``): text for a terminal, Markdown for the
pull request (a table per model: old against new, the ratio, the bound, the spread over the
rounds), JSON for tools (every figure of every round), and GitHub Actions annotations on the
manifest lines that failed.

Pure, like ``views/review.py``: the same report always renders the same bytes. The Markdown
starts with ``<!-- triton-gitops gate -->`` so a workflow can edit its previous comment.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict
from statistics import median
from typing import Any

from reconciler.model.gate import (
    GateCheck,
    GateFinding,
    GateReport,
    GateVerdict,
    LoadFigures,
    ModelGate,
)
from reconciler.model.problems import Problem
from reconciler.views.render import FORMAT_VERSION
from reconciler.views.review import (
    code,
    github_annotations,
    markdown_table,
    plain_md,
    short,
)

GATE_MARKER = "<!-- triton-gitops gate -->"

_UNITS = {
    "latency": "ms",
    "latency-p50": "ms",
    "between-responses": "ms",
    "throughput": "/s",
    "memory": "B",
    "errors": "",
}
_INCREASES = ("latency", "latency-p50", "between-responses")  # judged as a change: +12.3%
_MARKS = {GateVerdict.PASS: "✅", GateVerdict.UNBOUNDED: "·", GateVerdict.INCONCLUSIVE: "⚠️"}


def _number(value: float | None, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if unit == "B":
        return f"{value / (1 << 20):.1f} MiB"
    if unit == "ms":
        return f"{value:.2f} ms"
    if unit == "/s":
        return f"{value:.1f}/s"
    return f"{value:.4g}"


def _ratio(check: GateCheck) -> str:
    """The judged value as a person reads it: a change in percent, a ratio, a share."""
    if check.value is None or math.isnan(check.value):
        return "n/a"
    if check.name == "memory" and check.threshold.endswith("bytes"):
        return f"{check.value / (1 << 20):+.1f} MiB"  # a size bound: the growth itself
    if check.name in (*_INCREASES, "memory"):
        return f"{check.value:+.1%}"
    if check.name == "errors":
        return f"{check.value:.2%}"
    return f"{check.value:.3f}"


def _spread(check: GateCheck) -> str:
    return "" if check.spread is None else _between(check, check.spread)


def _between(check: GateCheck, bounds: tuple[float, float]) -> str:
    low, high = bounds
    if check.name in _INCREASES:
        return f"{low:+.1%} … {high:+.1%}"
    if check.name == "errors":
        return f"{low:.2%} … {high:.2%}"
    return f"{low:.3f} … {high:.3f}"


def _level(check: GateCheck) -> str:
    return "—" if check.name == "memory" else str(check.concurrency)


def _title(gate: ModelGate) -> str:
    what = f"{gate.model}"
    if gate.deployment != gate.model:
        what += f" (ModelDeployment {gate.deployment})"
    if gate.new_version is not None and gate.old_version is not None:
        what += f": version {gate.new_version} against {gate.old_version}"
    elif gate.new_version is not None:
        what += f": version {gate.new_version} (first deployment: nothing to compare with)"
    return what


def _how(gate: ModelGate) -> str:
    parts = [gate.file]
    if gate.load_test is not None:
        parts.append(f"{gate.load_test.generator} load generator")
        parts.append(f"requests: {gate.load_test.requests_from}")
    parts.append(f"{gate.seconds:.1f} s")
    return ", ".join(parts)


def _failed(gate: ModelGate) -> list[GateFinding | GateCheck]:
    bad: list[GateFinding | GateCheck] = [
        f for f in gate.findings if f.verdict is not GateVerdict.PASS
    ]
    bad += [c for c in gate.checks if c.verdict in (GateVerdict.FAIL, GateVerdict.NO_DATA)]
    return bad


def _noisy(check: GateCheck) -> str:
    """Why a check is inconclusive, in words: where its median lies, against the bound."""
    if check.interval is None:
        return ""
    return (
        f"inconclusive: the median of {check.rounds} rounds is beyond the bound, but the "
        f"rounds disagree (the median lies in {_between(check, check.interval)} at 90%): "
        "measure again (more rounds, a quieter machine)"
    )


def _summary(report: GateReport) -> str:
    if not report.models:
        return "no ModelDeployment changes its versions or config: nothing to gate"
    counts = {v: sum(1 for m in report.models if m.verdict is v) for v in GateVerdict}
    failed, noisy = counts[GateVerdict.FAIL], counts[GateVerdict.INCONCLUSIVE]
    passed = counts[GateVerdict.PASS]
    if not failed and not noisy:
        return f"all {passed} passed"
    parts = [f"{failed} failed"] if failed else []
    parts += [f"{noisy} inconclusive (noisy)"] if noisy else []
    return ", ".join([*parts, f"{passed} passed"])


# A streaming model's figures, per version and level: (JSON key, column title, unit, figure).
_STREAM_FIGURES: tuple[tuple[str, str, str, Callable[[LoadFigures], float | None]], ...] = (
    ("first_response_p50_ms", "first response p50", "ms", lambda f: f.p50_ms),
    ("first_response_p95_ms", "first response p95", "ms", lambda f: f.p95_ms),
    ("between_responses_ms", "between responses (median)", "ms", lambda f: f.gap_ms),
    ("responses_per_second", "responses/s", "/s", lambda f: f.responses_per_second),
    ("success_rate", "streams completed", "%", lambda f: f.success_rate),
)


def _spread_of(values: Sequence[float | None]) -> dict[str, float] | None:
    """The median over the rounds and the lowest and highest round (None: not measured)."""
    known = [v for v in values if v is not None and math.isfinite(v)]
    if not known:
        return None
    return {"median": median(known), "low": min(known), "high": max(known)}


def stream_figures(gate: ModelGate) -> list[dict[str, Any]]:
    """A streaming model's figures of each version at each level, each as its median over
    the rounds with the lowest and highest round; [] for a model that does not stream."""
    rows: list[dict[str, Any]] = []
    sides = ((gate.old_version, gate.old_figures), (gate.new_version, gate.new_figures))
    for version, measured in sides:
        if not any(f.streamed for f in measured):
            continue
        for level in sorted({f.concurrency for f in measured}):
            at = [f for f in measured if f.concurrency == level]
            row: dict[str, Any] = {"version": version, "concurrency": level, "rounds": len(at)}
            for key, _title, _unit, figure in _STREAM_FIGURES:
                row[key] = _spread_of([figure(f) for f in at])
            rows.append(row)
    return rows


def _spread_cell(found: dict[str, float] | None, unit: str) -> str:
    if found is None:
        return "n/a"
    if unit == "%":
        return f"{found['median']:.1%} ({found['low']:.1%} … {found['high']:.1%})"
    low, high = _number(found["low"], unit), _number(found["high"], unit)
    return f"{_number(found['median'], unit)} ({low} … {high})"


def _stream_rows(gate: ModelGate) -> list[tuple[str, ...]]:
    rows = []
    for row in stream_figures(gate):
        side = "old" if row["version"] == gate.old_version else "new"
        cells = [_spread_cell(row[key], unit) for key, _t, unit, _f in _STREAM_FIGURES]
        rows.append((f"{row['version']} ({side})", str(row["concurrency"]), *cells))
    return rows


def gate_text(report: GateReport) -> str:
    lines = [f"gate {short(report.base)} -> {short(report.head)}: {_summary(report)}"]
    for gate in report.models:
        lines.append(f"{gate.verdict.upper()} {_title(gate)} ({_how(gate)})")
        for finding in gate.findings:
            mark = "note" if finding.name == "note" else f"{finding.name} {finding.verdict}"
            lines.append(f"  {mark}: {finding.message}")
        for check in gate.checks:
            unit = _UNITS.get(check.name, "")
            where = "" if check.name == "memory" else f" @{check.concurrency}"
            text = (
                f"  {check.name}{where}: {_number(check.old, unit)} -> "
                f"{_number(check.new, unit)}, {_ratio(check)} ({check.threshold}): "
                f"{check.verdict}"
            )
            if check.spread is not None:
                text += f", rounds {_spread(check)}"
            lines.append(text)
            if check.verdict is GateVerdict.INCONCLUSIVE:
                lines.append(f"    {_noisy(check)}")
        for row in _stream_rows(gate):
            titles = [title for _k, title, _u, _f in _STREAM_FIGURES]
            named = ", ".join(f"{t} {c}" for t, c in zip(titles, row[2:], strict=True))
            lines.append(f"  streams of version {row[0]} @{row[1]}: {named}")
        for figures in gate.new_figures:
            if figures.note:
                lines.append(f"  load test of version {gate.new_version}: {figures.note}")
                break
    return "\n".join(lines) + "\n"


def _check_rows(checks: Sequence[GateCheck]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for check in checks:
        unit = _UNITS.get(check.name, "")
        mark = _MARKS.get(check.verdict, "❌")
        rows.append(
            (
                check.name,
                _level(check),
                _number(check.old, unit),
                _number(check.new, unit),
                _ratio(check),
                plain_md(check.threshold),
                _spread(check) or "—",
                f"{mark} {check.verdict}",
            )
        )
    return rows


def gate_markdown(report: GateReport, charts: Sequence[str] = ()) -> str:
    """The pull-request comment; ``charts``: the latency charts written beside it (artifact
    file names), listed so a reviewer knows where to look."""
    lines = [
        GATE_MARKER,
        f"### triton-gitops gate {code(short(report.base))} → {code(short(report.head))}",
        "",
        f"**{plain_md(_summary(report)[:1].upper() + _summary(report)[1:])}**",
        "",
    ]
    for gate in report.models:
        mark = _MARKS.get(gate.verdict, "❌")
        lines += [
            f"#### {mark} {plain_md(_title(gate))}",
            "",
            f"_{plain_md(_how(gate))}_",
            "",
        ]
        for finding in gate.findings:
            if finding.name == "note":
                lines.append(f"- note: {plain_md(finding.message)}")
            else:
                lines.append(
                    f"- **{finding.name} {finding.verdict}** (line {finding.line}): "
                    f"{plain_md(finding.message)}"
                )
        if gate.findings:
            lines.append("")
        if gate.checks:
            lines += markdown_table(
                ("check", "concurrency", "old", "new", "change", "bound", "rounds", "verdict"),
                _check_rows(gate.checks),
            )
            streams = _stream_rows(gate)
            if streams:
                lines += [
                    "Streams: each figure the median over the rounds (lowest … highest round); "
                    "latency is the time to the first response.",
                    "",
                    *markdown_table(
                        ("version", "concurrency", *(t for _k, t, _u, _f in _STREAM_FIGURES)),
                        streams,
                    ),
                ]
            noisy = [c for c in gate.checks if c.verdict is GateVerdict.INCONCLUSIVE]
            lines += [f"- {c.name} at {c.concurrency}: {plain_md(_noisy(c))}" for c in noisy]
            if noisy:
                lines.append("")
    if charts:
        lines += ["Latency charts (old against new): " + ", ".join(map(code, charts)), ""]
    return "\n".join(lines) + "\n"


def _finding_json(finding: GateFinding) -> dict[str, Any]:
    return {
        "name": finding.name,
        "verdict": str(finding.verdict),
        "message": finding.message,
        "line": finding.line,
    }


def _check_json(check: GateCheck) -> dict[str, Any]:
    return {
        "name": check.name,
        "concurrency": check.concurrency,
        "old": check.old,
        "new": check.new,
        "value": check.value,
        "threshold": check.threshold,
        "verdict": str(check.verdict),
        "spread": list(check.spread) if check.spread is not None else None,
        "interval": list(check.interval) if check.interval is not None else None,
        "rounds": check.rounds,
    }


def _figures_json(figures: LoadFigures) -> dict[str, Any]:
    found = asdict(figures)
    found["quantiles"] = [list(q) for q in figures.quantiles]
    found["success_rate"] = figures.success_rate
    return found


def _nulls(value: Any) -> Any:
    """``value`` with every figure that has no value (NaN, an infinity) as None: JSON has no
    NaN (``json.dumps`` would write one, which strict parsers refuse), and null says "not
    measured" to a tool."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _nulls(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_nulls(v) for v in value]
    return value


def gate_json(report: GateReport) -> dict[str, Any]:
    """Every finding, check and figure; strict JSON (no NaN: a missing figure is null)."""
    found = {
        "format_version": FORMAT_VERSION,
        "base": report.base,
        "head": report.head,
        "passed": report.passed,
        "verdict": str(report.verdict),
        "models": [
            {
                "deployment": gate.deployment,
                "model": gate.model,
                "file": gate.file,
                "new_version": gate.new_version,
                "old_version": gate.old_version,
                "verdict": str(gate.verdict),
                "seconds": round(gate.seconds, 3),
                "load_generator": gate.load_test.generator if gate.load_test else None,
                "requests_from": gate.load_test.requests_from if gate.load_test else None,
                "findings": [_finding_json(f) for f in gate.findings],
                "checks": [_check_json(c) for c in gate.checks],
                "old_figures": [_figures_json(f) for f in gate.old_figures],
                "new_figures": [_figures_json(f) for f in gate.new_figures],
                "streams": stream_figures(gate),
            }
            for gate in report.models
        ],
    }
    return dict(_nulls(found))


def gate_annotations(report: GateReport) -> str:
    """One ``::error`` per failed finding or check, on the manifest line it points at (the
    bound in ``spec.verify.gate``, the config's outputs, the smoke cases); one ``::warning``
    per inconclusive check."""
    problems, warnings = [], []
    for gate in report.models:
        for check in gate.checks:
            if check.verdict is GateVerdict.INCONCLUSIVE:
                version = f" version {gate.new_version}" if gate.new_version is not None else ""
                warnings.append(
                    Problem(
                        gate.file,
                        gate.line(check.name),
                        f"gate: {gate.model}{version}: {check.name} at concurrency "
                        f"{check.concurrency}: {_ratio(check)} ({check.threshold}): "
                        f"{_noisy(check)}",
                    )
                )
        file = gate.file  # as the repository names it (the manifests are read from Git)
        for item in _failed(gate):
            if isinstance(item, GateFinding):
                line, text = item.line, f"{item.name}: {item.message}"
            else:
                line = gate.line(item.name)
                unit = _UNITS.get(item.name, "")
                at = "" if item.name == "memory" else f" at concurrency {item.concurrency}"
                text = (
                    f"{item.name}{at}: {_number(item.old, unit)} -> {_number(item.new, unit)}, "
                    f"{_ratio(item)} ({item.threshold}): {item.verdict}"
                )
            version = f" version {gate.new_version}" if gate.new_version is not None else ""
            problems.append(Problem(file, line, f"gate: {gate.model}{version}: {text}"))
    said = [github_annotations(problems), github_annotations(warnings, level="warning")]
    return "\n".join(text for text in said if text)
