"""The pre-merge gate as the gate benchmarks run it (``bench/gate.py``,
``bench/gate_streams.py``): one ``loop.gate.run_gate`` on a tritonserver of its own
(``wiring.isolated_server``, as ``triton-gitops gate`` runs it, without the Git part), its
verdict, checks and round-by-round figures as a JSON record, and the summary of repeated runs.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from reconciler import wiring
from reconciler.core.spec.desired import load_desired_state
from reconciler.loop.gate import gated, run_gate
from reconciler.model.gate import GateCheck, LoadFigures, ModelGate
from reconciler.model.spec import DesiredState

# The server the manifests name; the gate places the deployment on its isolated one instead.
SERVER = """\
apiVersion: triton-gitops.dev/v1alpha1
kind: TritonServer
metadata: {name: prod}
spec: {grpc: "10.0.0.1:8001", modelRepository: /models}
"""


def desired_state(*documents: str) -> DesiredState:
    """The desired state of ``documents`` (YAML), as one manifest file."""
    return load_desired_state({"m.yaml": "---\n".join(documents).encode()})


def check_key(check: GateCheck) -> str:
    """``latency@4``; ``memory`` (judged once, not per level)."""
    return check.name if check.name == "memory" else f"{check.name}@{check.concurrency}"


def _figures(figures: LoadFigures) -> dict[str, Any]:
    return {
        "concurrency": figures.concurrency,
        "requests": figures.requests,
        "errors": figures.errors,
        "throughput": figures.throughput,
        "p50_ms": figures.p50_ms,
        "p95_ms": figures.p95_ms,
        "gap_ms": figures.gap_ms,
        "responses_per_second": figures.responses_per_second,
    }


def record(gate: ModelGate, seconds: float) -> dict[str, Any]:
    """One run as the benchmarks keep it: the verdict, each check (its value, the median of
    the old's and the new's figure, the spread and interval of the per-round values, its
    verdict), the findings, and every measurement round by round (old and new side by
    side). ``seconds``: the whole run, the server's start and stop included."""
    return {
        "verdict": str(gate.verdict),
        "seconds": seconds,
        "measuring_seconds": gate.seconds,
        "load_generator": gate.load_test.generator if gate.load_test else None,
        "checks": {
            check_key(c): {
                "value": c.value,
                "old": c.old,
                "new": c.new,
                "spread": c.spread,
                "interval": c.interval,
                "rounds": c.rounds,
                "verdict": str(c.verdict),
            }
            for c in gate.checks
        },
        "findings": [f.message for f in gate.findings],
        "rounds": [
            {"old": _figures(old), "new": _figures(new)}
            for old, new in zip(gate.old_figures, gate.new_figures, strict=True)
        ],
    }


def isolated_run(
    repository: Path,
    workdir: Path,
    base: DesiredState,
    head: DesiredState,
    perf: str | None,
    aiperf: str | None = None,
) -> dict[str, Any]:
    """The gate on the one deployment that changes from ``base`` to ``head``, on a
    tritonserver of its own over ``repository`` (stopped by its pid on the way out), with
    perf_analyzer (``perf``: its binary) or the built-in load generator, and AIPerf
    (``aiperf``: its binary) for a streaming model when given: its ``record``."""
    (target,) = gated(base, head)
    started = time.monotonic()
    with wiring.isolated_server(repository, workdir, perf_analyzer=perf, aiperf=aiperf) as server:
        (gate,) = run_gate(target, server)
    return record(gate, time.monotonic() - started)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Repeated runs of one arm: the verdicts, the seconds a run took, and for each check
    the median and range of its value over the runs, the widest spread of its rounds within
    one run, and how many runs it failed."""
    names = sorted({name for run in runs for name in run["checks"]})
    per_check = {}
    for name in names:
        values = [r["checks"][name]["value"] for r in runs if name in r["checks"]]
        values = [v for v in values if v is not None]
        within = [
            r["checks"][name]["spread"] for r in runs if r["checks"].get(name, {}).get("spread")
        ]
        per_check[name] = {
            "median": statistics.median(values) if values else None,
            "min": min(values) if values else None,
            "max": max(values) if values else None,
            "widest_round_spread": max((hi - lo for lo, hi in within), default=None),
            "failed_runs": sum(
                1 for r in runs if r["checks"].get(name, {}).get("verdict") == "fail"
            ),
        }
    return {
        "runs": len(runs),
        "verdicts": [r["verdict"] for r in runs],
        "seconds_median": statistics.median(r["seconds"] for r in runs),
        "seconds_max": max(r["seconds"] for r in runs),
        "checks": per_check,
    }
