"""The ``triton-gitops`` CLI run in this process, its output captured.

Used by the end-to-end tests and by ``bench.swap_under_load`` (which times ``apply`` as a
user runs it): ``cli(*args)`` is one command line, ``Reconciler`` one manifest remote with
its own state store and cache.
"""

from __future__ import annotations

import contextlib
import io
import json
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
