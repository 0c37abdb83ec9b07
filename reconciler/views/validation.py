"""What ``validate`` prints for a ManifestReading: text (problems and warnings on stderr,
the verdict on stdout), JSON, or GitHub Actions annotations.

An empty repository (no document of this reconciler) is a warning, never ``valid``: exit 0
(a new repository, or a folder between releases, is not wrong), ``"valid": false`` and
``"empty": true`` in JSON, so a CI that requires manifests can test for them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from reconciler.core.spec.schema import API_VERSION
from reconciler.model.problems import Problem
from reconciler.model.spec import ManifestReading
from reconciler.views.review import github_annotations, problems_json


def empty_warning(reading: ManifestReading, where: str) -> Problem | None:
    """The warning for a folder with no manifest of this reconciler, or None."""
    if reading.documents or reading.problems:
        return None
    ignored = reading.ignored_count
    also = f" ({ignored} document(s) of other tools ignored)" if ignored else ""
    return Problem(
        where,
        0,
        f"no {API_VERSION} manifest here{also}: nothing to validate (wrong folder or "
        "--path? a .sourceignore excluding too much?)",
    )


def ignored_lines(reading: ManifestReading) -> list[str]:
    """One line per file whose documents of other tools were left alone."""
    lines = []
    for file, kinds in reading.ignored.items():
        counted = ", ".join(
            f"{kind} x{n}" if n > 1 else kind for kind, n in sorted(Counter(kinds).items())
        )
        lines.append(f"{file}: ignored {len(kinds)} document(s) of other tools ({counted})")
    return lines


def _counts(reading: ManifestReading) -> str:
    desired = reading.desired
    return f"{len(desired.servers)} server(s), {len(desired.deployments)} model deployment(s)"


def validation_text(reading: ManifestReading, where: str) -> tuple[str, str]:
    """(stdout, stderr) of ``validate --output text``."""
    empty = empty_warning(reading, where)
    err = [f"{p.file}:{p.line}: warning: {p.message}" for p in reading.warnings]
    err += [str(p) for p in reading.problems]
    if empty is not None:
        err.append(f"warning: {where}: {empty.message}")
    if reading.problems:
        err.append(f"{len(reading.problems)} problem(s)")
    out = [] if reading.problems or empty is not None else [f"valid: {_counts(reading)}"]
    out += ignored_lines(reading)
    return "\n".join(out), "\n".join(err)


def validation_json(reading: ManifestReading, where: str) -> dict[str, Any]:
    empty = empty_warning(reading, where)
    report = problems_json(reading.problems)
    warnings = [*reading.warnings, *([empty] if empty is not None else [])]
    report["valid"] = not reading.problems and empty is None
    report["empty"] = empty is not None
    report["warnings"] = [{"file": p.file, "line": p.line, "message": p.message} for p in warnings]
    report["ignored"] = {file: len(kinds) for file, kinds in reading.ignored.items()}
    return report


def validation_annotations(reading: ManifestReading, where: str, prefix: str) -> str:
    """GitHub annotations, files named as the repository does (``prefix``: the folder)."""

    def located(problems: Iterable[Problem]) -> list[Problem]:
        return [
            Problem(f"{prefix}/{p.file}" if prefix else p.file, p.line, p.message) for p in problems
        ]

    empty = empty_warning(reading, prefix or where)  # the folder as the repository names it
    warnings = located(reading.warnings) + ([empty] if empty is not None else [])
    return "\n".join(
        text
        for text in (
            github_annotations(located(reading.problems)),
            github_annotations(warnings, "warning"),
        )
        if text
    )
