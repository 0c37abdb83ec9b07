"""What every scenario's ``main`` does around its run: quiet the reconciler's log, turn a
void measurement into ``benchmark failed: ...`` and exit code 1, write the JSON result.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from bench.harness.errors import VOID
from bench.harness.provenance import provenance

R = TypeVar("R")


def quiet_reconciler_log() -> None:
    """Leave out the reconciler's JSON log lines (one per alert, per reverted rollout...):
    they would interleave with the progress lines and the report."""
    logging.getLogger("triton_gitops").addHandler(logging.NullHandler())
    logging.getLogger("triton_gitops").propagate = False


def measured(run: Callable[[], R]) -> R | None:
    """``run()``; None, said on stderr, when the measurement is void."""
    try:
        return run()
    except VOID as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return None


def write_json(path: Path, value: Any, **options: Any) -> None:
    """``value`` as indented JSON at ``path`` (its folder made first)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2, **options) + "\n")


def read_json(path: Path) -> Any:
    """A result saved by ``write_json``, for a report made again from it."""
    return json.loads(path.read_text())


def markdown_main(
    args: argparse.Namespace,
    run: Callable[[argparse.Namespace], dict[str, Any]],
    markdown: Callable[[dict[str, Any]], str],
    *,
    beside: bool = False,
) -> int:
    """The ``main`` of a scenario whose report is a Markdown section: with ``--report JSON``
    the section again from a saved result; else run, save the JSON, print the section (and
    with ``beside``, write it next to the JSON: ``<output>.md``)."""
    if args.report is not None:
        print(markdown(read_json(args.report)))
        return 0
    quiet_reconciler_log()
    result = measured(lambda: run(args))
    if result is None:
        return 1
    write_json(args.output, result)
    section = markdown(result)
    if beside:
        text = section if section.endswith("\n") else section + "\n"
        args.output.with_suffix(".md").write_text(text)
    print(section)
    print(f"JSON result: {args.output}", file=sys.stderr)
    return 0


def envelope(benchmark: str, load_at_start: tuple[float, ...], **parts: Any) -> dict[str, Any]:
    """A result's common part: the benchmark, its command line as run, the code measured
    (``provenance``) and the machine's load average at its start and end, then ``parts``."""
    return {
        "benchmark": benchmark,
        "command": " ".join([f"python -m bench.{benchmark}", *sys.argv[1:]]),
        **provenance(),
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
        **parts,
    }


def section_head(result: Mapping[str, Any], how: str) -> list[str]:
    """A section's first lines: the command in a code block, the load average, ``how``."""
    return [
        "```sh",
        str(result["command"]),
        "```",
        "",
        f"Load average {result['load_average_at_start'][0]:.2f} at the start, "
        f"{result['load_average_at_end'][0]:.2f} at the end. {how}",
        "",
    ]
