"""Where the keys of a ModelDeployment that reports point at are, by line: gate
annotations, the plan's refusals of a smoke case (``verify.smoke.0``, ...) or of an analysis
check (``verify.analysis.checks.0``, ...), and the analysis's probes. Pure: a parsed document
in, ``(dotted key, line)`` pairs out (``ModelDeployment.line`` reads them).
"""

from __future__ import annotations

from typing import Any

from reconciler.core.spec.yaml import Document
from reconciler.model.gate import GATE_BOUND_KEYS

_POINTED_AT = (
    ("versions",),
    ("config",),
    ("config", "input"),
    ("config", "output"),
    ("config", "max_batch_size"),
    ("verify", "smoke"),
    ("verify", "shadow"),
    ("verify", "gate"),
    *(("verify", "gate", key) for key in GATE_BOUND_KEYS),
    ("verify", "analysis"),
    ("verify", "analysis", "probes"),
)
# Lists whose every item is pointed at, under spec.verify.
_LISTED = (("smoke",), ("analysis", "checks"))


def pointed_at(doc: Document, body: dict[str, Any]) -> tuple[tuple[str, int], ...]:
    """The line of each key of ``body`` (a ModelDeployment's spec) that reports point at."""
    found = []
    for path in _POINTED_AT:
        node: Any = body
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            found.append((".".join(path), doc.line(("spec", *path))))
    for listed in _LISTED:
        node = body.get("verify")
        for key in listed:
            node = node.get(key) if isinstance(node, dict) else None
        for index in range(len(node) if isinstance(node, list) else 0):
            where = ("verify", *listed, index)
            found.append((".".join(map(str, where)), doc.line(("spec", *where))))
    return tuple(found)
