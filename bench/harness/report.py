"""Tables for the scenarios' output: Markdown tables (the sections BENCHMARKS.md carries)
and fixed-width text tables (what ``print_result`` writes to the terminal).

Cells are text: each scenario formats its own numbers (they differ in digits and units),
this module only lays them out, so that a report function is its rows and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bench.harness.provenance import REPO_ROOT


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
