"""``bench.gate_streams``'s pure pieces, without Triton: its manifests (parsed by the
reconciler's own loader and diffed as the gate diffs them), the options, and a run's record
counted and tabled as the benchmark's goals count it."""

from __future__ import annotations

from typing import Any

import pytest

from bench.gate_streams import (
    CONCURRENCY,
    GENERATORS,
    REQUESTS,
    ROUNDS,
    SCENARIOS,
    _state,
    markdown,
    parse_args,
    summarize_arm,
)
from reconciler.loop.gate import gated


@pytest.mark.parametrize("generator", GENERATORS)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_each_arm_gates_the_generator_at_the_tests_settings(scenario: str, generator: str) -> None:
    (target,) = gated(_state(1, generator), _state(SCENARIOS[scenario], generator))
    assert target.head.versions == (SCENARIOS[scenario],)
    assert target.base is not None and target.base.versions == (1,)
    gate = target.head.gate
    assert gate is not None
    assert (gate.concurrency, gate.rounds, gate.requests) == ((CONCURRENCY,), ROUNDS, REQUESTS)
    assert gate.max_latency_increase == 0.2
    # perf_analyzer measures no time between responses: a bound on it would fail every run.
    bound = gate.max_between_responses_increase
    assert bound == (None if generator == "perf_analyzer" else 0.5)
    (smoke,) = target.head.smoke
    assert smoke.inputs[0].data == (1, 2, 3)


def test_the_perf_analyzer_and_aiperf_arms_need_their_binaries() -> None:
    assert parse_args([]).generators == ["built-in"]
    assert parse_args(["--perf-analyzer", "pa"]).generators == ["built-in", "perf_analyzer"]
    both = parse_args(["--perf-analyzer", "pa", "--aiperf", "ap"]).generators
    assert both == list(GENERATORS)
    with pytest.raises(SystemExit):
        parse_args(["--generators", "perf_analyzer"])
    with pytest.raises(SystemExit):
        parse_args(["--generators", "aiperf"])
    with pytest.raises(SystemExit):
        parse_args(["--scenarios", "fast"])


def _run(verdict: str, latency: str, ratio: float, *, expected: bool) -> dict[str, Any]:
    checks = {"latency@2": {"value": ratio - 1, "spread": [ratio - 1.1, ratio - 0.9],
                            "verdict": latency}}  # fmt: skip
    return {
        "verdict": verdict, "seconds": 20.0, "checks": checks, "ttfr_p95_ratio": ratio,
        "rounds_measured": 3, "caught_on_first_response": latency == "fail",
        "as_expected": expected,
    }  # fmt: skip


def test_a_summary_counts_the_verdicts_and_the_table_shows_them() -> None:
    runs = [
        _run("fail", "fail", 1.5, expected=True),
        _run("inconclusive", "inconclusive", 1.3, expected=False),
        _run("fail", "fail", 1.6, expected=True),
    ]
    summary = summarize_arm(runs)
    assert (summary["passed"], summary["failed"], summary["inconclusive"]) == (0, 2, 1)
    assert (summary["as_expected"], summary["caught_on_first_response"]) == (2, 2)
    assert summary["ttfr_p95_ratio"] == {"median": 1.5, "min": 1.3, "max": 1.6}
    result = {
        "settings": {"runs": 3, "parameters": {"first_ms": "6"}},
        "machine": {"wall_minutes": 1.0},
        "arms": {"built-in/slow": {"generator": "built-in", "scenario": "slow",
                                   "summary": summary}},
    }  # fmt: skip
    table = markdown(result)
    assert "| built-in | slow | 3 | 0 | 2 | 1 | 0 | 2/3 | 1.50 (1.30-1.60) | 20 (max 20) |" in table
