"""The quality gate's judgement on interleaved measurements (core/gate.py)."""

from __future__ import annotations

from reconciler.core.gate import judge
from reconciler.model.gate import GateSpec, GateVerdict, LoadFigures


def figures(
    level: int, p95: float, rps: float, errors: int = 0, memory: float | None = None
) -> LoadFigures:
    return LoadFigures(level, 500, errors, rps, p95 / 2, p95, p95 * 1.5, memory)


SPEC = GateSpec(max_latency_increase=0.2, min_throughput_ratio=0.9, max_memory_increase=0.3)


def verdicts(checks: tuple[object, ...]) -> dict[tuple[str, int], GateVerdict]:
    return {(c.name, c.concurrency): c.verdict for c in checks}  # type: ignore[attr-defined]


def test_a_version_like_the_old_passes_every_bound_with_its_spread() -> None:
    old = [figures(1, 2.0, 500, memory=100e6), figures(1, 2.2, 480, memory=100e6)]
    new = [figures(1, 2.1, 490, memory=110e6), figures(1, 2.1, 500, memory=110e6)]
    checks = judge(SPEC, old, new)
    assert set(verdicts(checks).values()) == {GateVerdict.PASS}
    latency = next(c for c in checks if c.name == "latency")
    assert latency.spread is not None and latency.spread[0] < latency.spread[1]


def test_three_times_slower_fails_on_latency_and_throughput() -> None:
    old = [figures(4, 2.0, 1000)] * 3
    new = [figures(4, 6.0, 330)] * 3
    found = verdicts(judge(SPEC, old, new))
    assert found[("latency", 4)] is GateVerdict.FAIL
    assert found[("throughput", 4)] is GateVerdict.FAIL
    assert found[("errors", 4)] is GateVerdict.PASS


def test_failed_requests_and_memory_fail_and_missing_figures_are_no_data() -> None:
    old = [figures(1, 2.0, 500, memory=100e6)]
    new = [figures(1, 2.0, 500, errors=500, memory=200e6)]
    found = verdicts(judge(SPEC, old, new))
    assert found[("errors", 1)] is GateVerdict.FAIL
    assert found[("memory", 0)] is GateVerdict.FAIL
    unmeasured = verdicts(judge(SPEC, [figures(1, 2.0, 500)], [figures(1, 2.0, 500)]))
    assert unmeasured[("memory", 0)] is GateVerdict.NO_DATA


def test_one_noisy_round_does_not_fail_a_good_version() -> None:
    old = [figures(1, 2.0, 500)] * 3
    new = [figures(1, 2.0, 500), figures(1, 9.0, 120), figures(1, 2.1, 490)]
    found = verdicts(judge(SPEC, old, new))
    assert found[("latency", 1)] is GateVerdict.PASS  # the median round decides
