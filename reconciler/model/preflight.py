"""The lines of ``triton-gitops check`` (``loop/preflight.py`` makes them, ``views/preflight.py``
shows them)."""

from __future__ import annotations

from dataclasses import dataclass

OK, FAIL, WARN = "ok", "fail", "warn"


@dataclass(frozen=True)
class CheckLine:
    """One check: its name, ``ok``/``fail``/``warn``, what was found, what to do."""

    name: str
    result: str
    detail: str
    fix: str = ""
