"""The scenarios' reports: one renderer (``render``) fills a scenario's Markdown template in
``bench/reports/`` from its JSON result, so that the report text is data, kept apart from the
code that measures; and fixed-width text tables (what ``print_result`` writes to the terminal).

Templates are Jinja (``trim_blocks``/``lstrip_blocks``: a ``{% ... %}`` line leaves no blank
line; an undefined name is an error, never an empty cell). Filters: ``number(digits,
thousands=False)`` and ``ratio(b, key, digits=2)``; ``md_row`` builds a table's row from cells.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2

from bench.harness.provenance import REPO_ROOT

TEMPLATES = Path(__file__).resolve().parent.parent / "reports"


def md_row(cells: Iterable[object]) -> str:
    """``| a | b | c |``"""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def md_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """A Markdown table: the first column left-aligned, the others right-aligned."""
    rule = "|---|" + "---:|" * (len(header) - 1)
    return [md_row(header), rule, *(md_row(r) for r in rows)]


def fixed(cells: Sequence[object], widths: Sequence[int]) -> str:
    """One line of a text table: the first cell left-aligned in its width, the others
    right-aligned in theirs."""
    first, *rest = cells
    return f"{first!s:<{widths[0]}}" + "".join(
        f"{c!s:>{w}}" for c, w in zip(rest, widths[1:], strict=True)
    )


def number(value: float | None, digits: int = 0, *, thousands: bool = False) -> str:
    """``value`` with ``digits`` decimals, or ``-`` when there is none."""
    if value is None:
        return "-"
    return f"{value:,.{digits}f}" if thousands else f"{value:.{digits}f}"


def machine_line(m: Mapping[str, Any]) -> str:
    """``machine: ...``: the first line of a terminal report, from ``provenance.machine``."""
    return (
        f"machine: {m['nproc']} CPU ({m['cpu_model']}), {m['ram_gib']} GiB, Python {m['python']}, "
        f"Triton {m['triton_server']} (nvidia-pytriton {m['nvidia_pytriton']})"
    )


# Where the code a profile names lives: the installed packages, this checkout (and the main
# one, where the results in BENCHMARKS.md were measured), the standard library.
_PREFIXES = ("/site-packages/", "/work/main/", f"{REPO_ROOT}/", "/lib/python3.11/")


def short_path(file: str) -> str:
    """``file`` from its package or module path on, for a profile's or a trace's rows."""
    for marker in _PREFIXES:
        if marker in file:
            return file.split(marker, 1)[1]
    return file


def ratio(a: Mapping[str, Any], b: Mapping[str, Any], key: str, digits: int = 2) -> str:
    """``a[key] / b[key]`` with ``digits`` decimals."""
    return f"{a[key] / b[key]:.{digits}f}"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
        autoescape=False,  # Markdown, not HTML
    )
    env.filters.update(number=number, ratio=ratio, short_path=short_path)
    env.globals.update(md_row=md_row)
    return env


_ENVIRONMENT = _environment()


def render(scenario: str, result: Mapping[str, Any], **extra: Any) -> str:
    """The Markdown section of ``scenario`` (``bench/reports/<scenario>.md``) from its JSON
    ``result`` (the template's ``r``) and what ``extra`` adds."""
    return _ENVIRONMENT.get_template(f"{scenario}.md").render(r=result, **extra)
