"""The ``triton-gitops`` CLI run in this process, its output captured.

Used by the end-to-end tests and by ``bench.swap_under_load`` (which times ``apply`` as a
user runs it): ``cli(*args)`` is one command line, ``Reconciler`` one manifest remote with
its own state store and cache.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.cli import main


@dataclass
class CliRun:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def explain(self) -> str:
        """Why the command ended as it did, for a failing test's message (see ``explain``)."""
        try:
            report = json.loads(self.out)
        except ValueError:
            report = self.out
        return f"exit {self.code}\n" + explain(report, self.err)


def explain(report: Mapping[str, Any] | str, err: str = "", tail: int = 40) -> str:
    """An apply's outcome in words, for a failing test's message: each change's outcome and
    error, every step that failed, the last analysis's evaluations (each check's verdict,
    value, threshold and detail, and the probes), then the last ``tail`` lines of its stderr
    (each step and evaluation as it happened). A plain string: pytest cuts the repr of a dict
    given as an assertion's message to 240 characters, which hid the verdicts."""
    lines: list[str] = []
    if isinstance(report, str):
        lines.append(report[-4000:])
    else:
        result = report.get("result", report)
        for change in result.get("changes", []) if isinstance(result, Mapping) else []:
            lines.append(
                f"{change.get('server')} {change.get('model')}: {change.get('outcome')}"
                + (f": {change['error']}" if change.get("error") else "")
            )
            for step in (*change.get("steps", []), *change.get("revert", [])):
                if not step.get("ok", True):
                    lines.append(f"  failed {step.get('action')}: {step.get('error')}")
            analysis = change.get("analysis") or {}
            if analysis:
                lines.append(f"  analysis {analysis.get('verdict')}:")
            for evaluation in analysis.get("evaluations", []):
                lines.append(
                    f"    #{evaluation.get('index')} at {evaluation.get('at_seconds')}s "
                    f"{evaluation.get('verdict')}"
                    + ("" if evaluation.get("counted", True) else " (not counted)")
                    + (" (early abort)" if evaluation.get("aborted") else "")
                    + f" probes={evaluation.get('probes')}"
                )
                for check in evaluation.get("checks", []):
                    lines.append(
                        f"      {check.get('check')}: {check.get('verdict')} "
                        f"value={check.get('value')} threshold={check.get('threshold')} "
                        f"{check.get('detail') or ''}"
                    )
        for problem in result.get("problems", []) if isinstance(result, Mapping) else []:
            lines.append(f"problem: {problem}")
    if err:
        lines.append(f"--- stderr (last {tail} lines) ---")
        lines.extend(err.rstrip().splitlines()[-tail:])
    return "\n".join(lines)


def cli(*args: str) -> CliRun:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse errors and --help
            code = int(exc.code or 0)
    return CliRun(code, out.getvalue(), err.getvalue())


class Reconciler:
    """The CLI pointed at one manifest remote, with its own state store and cache."""

    def __init__(self, repo_url: str, workdir: Path) -> None:
        self.repo_url = repo_url
        self.options = [
            "--repo",
            repo_url,
            "--state",
            str(workdir / "state.db"),
            "--cache-dir",
            str(workdir / "cache"),
        ]

    def plan(self, *extra: str) -> CliRun:
        return cli("plan", *self.options, *extra)

    def apply(self, *extra: str) -> CliRun:
        return cli("apply", *self.options, *extra)
