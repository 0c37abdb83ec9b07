"""How ``triton-gitops check`` shows its lines: one per check (with what to do under a
failed one), or JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence

from reconciler.model.preflight import FAIL, CheckLine


def preflight_text(lines: Sequence[CheckLine]) -> str:
    out = []
    for line in lines:
        out.append(f"{line.result.upper():<4} {line.name}: {line.detail}")
        if line.fix and line.result != "ok":
            out.append(f"     fix: {line.fix}")
    failed = sum(line.result == FAIL for line in lines)
    out.append(
        f"{failed} check(s) failed of {len(lines)}" if failed else f"all {len(lines)} checks passed"
    )
    return "\n".join(out)


def preflight_json(lines: Sequence[CheckLine]) -> str:
    return json.dumps(
        {
            "ok": not any(line.result == FAIL for line in lines),
            "checks": [
                {"name": c.name, "result": c.result, "detail": c.detail, "fix": c.fix}
                for c in lines
            ],
        },
        indent=2,
    )
