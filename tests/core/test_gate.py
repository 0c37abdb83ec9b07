"""The quality gate's judgement on interleaved measurements (core/gate.py)."""

from __future__ import annotations

from reconciler.core.gate import judge
from reconciler.core.spec.desired import load_desired_state
from reconciler.model.gate import GateSpec, GateVerdict, LoadFigures, ModelGate


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


def test_figures_without_a_bound_are_reported_never_judged() -> None:
    old = [figures(1, 2.0, 500, memory=100e6)]
    new = [figures(1, 9.0, 100, memory=900e6)]  # far worse, but nothing is bounded
    checks = judge(GateSpec(), old, new)
    assert verdicts(checks) == {
        ("errors", 1): GateVerdict.PASS,
        ("latency", 1): GateVerdict.UNBOUNDED,
        ("throughput", 1): GateVerdict.UNBOUNDED,
        ("memory", 0): GateVerdict.UNBOUNDED,
    }
    latency = next(c for c in checks if c.name == "latency")
    assert latency.value == 3.5 and latency.threshold == "no bound"
    gate = ModelGate("m", "m", "m.yaml", 2, 1, checks=checks)
    assert gate.verdict is GateVerdict.PASS


def test_a_declared_bound_that_cannot_be_measured_fails_the_gate() -> None:
    old, new = [figures(1, 2.0, 500)], [figures(1, 2.0, 500)]  # no memory figure
    checks = judge(GateSpec(max_memory_increase=0.3), old, new)
    assert verdicts(checks)[("memory", 0)] is GateVerdict.NO_DATA
    assert ModelGate("m", "m", "m.yaml", 2, 1, checks=checks).verdict is GateVerdict.FAIL


def _gate_of(bounds: str) -> GateSpec | None:
    text = (
        "apiVersion: triton-gitops/v1alpha1\nkind: TritonServer\nmetadata: {name: s}\n"
        "spec: {grpc: 'h:1', modelRepository: /m}\n---\n"
        "apiVersion: triton-gitops/v1alpha1\nkind: ModelDeployment\nmetadata: {name: m}\n"
        f"spec:\n  servers: {{names: [s]}}\n  versions: [1]\n  verify:\n    gate: {bounds}\n"
    )
    return load_desired_state({"m.yaml": text.encode()}).deployments["m"].gate


def test_a_memory_bound_is_a_share_or_a_size_and_each_bound_keeps_its_line() -> None:
    share = _gate_of("{maxMemoryIncrease: 25%, maxLatencyIncrease: 0.1}")
    assert share is not None
    assert (share.max_memory_increase, share.max_memory_increase_bytes) == (0.25, None)
    size = _gate_of("{maxMemoryIncrease: 512Mi}")
    assert size is not None and size.max_memory_increase_bytes == 512 << 20
    assert (size.concurrency, size.rounds, size.requests) == ((1, 4), 3, 500)
    text = (
        "apiVersion: triton-gitops/v1alpha1\nkind: TritonServer\nmetadata: {name: s}\n"
        "spec: {grpc: 'h:1', modelRepository: /m}\n---\n"
        "apiVersion: triton-gitops/v1alpha1\nkind: ModelDeployment\nmetadata: {name: m}\n"
        "spec:\n  servers: {names: [s]}\n  versions: [1]\n  verify:\n    gate:\n"
        "      maxLatencyIncrease: 0.1\n"
    )
    deployment = load_desired_state({"m.yaml": text.encode()}).deployments["m"]
    assert deployment.line("verify.gate.maxLatencyIncrease") == 14
    assert deployment.line("verify.gate.minThroughputRatio", "verify.gate") == 13
    assert deployment.line("config.output", "versions") == 11
