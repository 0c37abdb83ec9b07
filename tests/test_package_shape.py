"""The package's shape, checked by ./dev test beside the import contracts (.importlinter):
no module imports another's private names, and no module grows past 600 lines.

The modules still longer are listed here by name, each with the most it may have, and the
list shrinks only: a new long module fails, and so does an entry that is no longer true.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "reconciler"
LONGEST = 600

# Modules over LONGEST lines, each with the most it may have until it is split (none now:
# adapters/state.py, the last, was split into state_file.py and state_tables.py).
OWED_LONG_MODULES: dict[str, int] = {}


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _private_imports() -> set[tuple[str, str, str]]:
    """(importing file, module, name) of every ``from reconciler... import _name``."""
    found = set()
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("reconciler"):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        where = str(path.relative_to(PACKAGE))
                        found.add((where, str(node.module), alias.name))
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    found = sorted(_private_imports())

    assert not found, f"private names imported from another module (make them public): {found}"


def test_no_module_is_longer_than_600_lines() -> None:
    lengths = {
        str(path.relative_to(PACKAGE)): len(path.read_text().splitlines()) for path in _modules()
    }

    too_long = {name: n for name, n in lengths.items() if n > OWED_LONG_MODULES.get(name, LONGEST)}
    split = {name: lengths.get(name, 0) for name in OWED_LONG_MODULES}
    split = {name: n for name, n in split.items() if n <= LONGEST}
    assert not too_long, f"modules over {LONGEST} lines (or longer than owed): {too_long}"
    assert not split, f"at most {LONGEST} lines now: take them off OWED_LONG_MODULES: {split}"
