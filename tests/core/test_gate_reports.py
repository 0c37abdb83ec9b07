"""The gate's reports (views/gate.py), its interleaved measuring order (loop/gate.py), and
perf_analyzer's input file (adapters/perf_analyzer.py), with fakes: no server."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from reconciler.adapters.perf_analyzer import failed_requests, input_data
from reconciler.cli.gate import write_gate_reports
from reconciler.core.gate import judge, judge_alone
from reconciler.loop.gate import _measure
from reconciler.model.gate import (
    GateFinding,
    GateReport,
    GateSpec,
    GateVerdict,
    LoadFigures,
    LoadTestSpec,
    ModelGate,
)
from reconciler.model.spec import Tensor
from reconciler.views.gate import gate_annotations, gate_json, gate_markdown, gate_text

SPEC = GateSpec(max_latency_increase=0.2, min_throughput_ratio=0.9, max_memory_increase=0.3)
LINES = (("errors", 20), ("latency", 21), ("throughput", 22), ("memory", 23))


def figures(p95: float, rps: float, memory: float = 40 << 20) -> LoadFigures:
    return LoadFigures(1, 100, 0, rps, p95 / 2, p95, p95 * 1.2, memory, ((50.0, p95 / 2),))


def slow_gate() -> ModelGate:
    old = [figures(3.0, 300), figures(3.2, 290)]
    new = [figures(9.0, 100), figures(9.5, 95)]
    return ModelGate(
        "scorer", "scorer", "manifests/scorer.yaml", 3, 1, (), judge(SPEC, old, new),
        tuple(old), tuple(new), LoadTestSpec("built-in", "smoke cases"), 12.5, LINES,
    )  # fmt: skip


def refused_gate() -> ModelGate:
    finding = GateFinding("interface", GateVerdict.FAIL, "output OUTPUT0 removed | a, b", 14)
    return ModelGate("renamed", "renamed", "manifests/renamed.yaml", None, None, (finding,))


def test_a_failed_bound_is_annotated_on_its_line_and_a_refusal_on_the_config() -> None:
    report = GateReport("a" * 40, "b" * 40, (slow_gate(), refused_gate()))
    lines = gate_annotations(report).splitlines()
    assert (
        "::error file=manifests/scorer.yaml,line=21::gate: scorer version 3: latency at "
        "concurrency 1: 3.10 ms -> 9.25 ms, +198.4%25 (p95 increase <= 0.2): fail" in lines
    )
    assert any(line.startswith("::error file=manifests/scorer.yaml,line=22::") for line in lines)
    # Workflow-command escaping: % is escaped in the message (%25); commas there are data.
    assert (
        "::error file=manifests/renamed.yaml,line=14::gate: renamed: interface: output "
        "OUTPUT0 removed | a, b" in lines
    )
    assert not any("line=20" in line or "line=23" in line for line in lines)  # those passed


def test_the_markdown_table_shows_old_new_change_bound_and_spread() -> None:
    report = GateReport("a" * 40, "b" * 40, (slow_gate(), refused_gate()))
    text = gate_markdown(report, ["scorer-v3-latency.svg"])
    assert text.startswith("<!-- triton-gitops gate -->\n### triton-gitops gate `aaaaaaaaaaaa`")
    assert "**2 failed, 0 passed**" in text
    assert (
        "| latency | 1 | 3.10 ms | 9.25 ms | +198.4% | p95 increase &lt;= 0.2 | "
        "+196.9% … +200.0% | ❌ fail |" in text
    )
    assert "| memory | — | 40.0 MiB | 40.0 MiB | +0.0% | increase &lt;= 30% | — | ✅ pass |" in text
    # Table syntax in a message is made inert.
    assert "output OUTPUT0 removed \\| a, b" in text
    assert "`scorer-v3-latency.svg`" in text
    assert gate_markdown(report, ["scorer-v3-latency.svg"]) == text  # stable bytes


def test_json_keeps_every_figure_and_text_every_check() -> None:
    report = GateReport("a" * 40, "b" * 40, (slow_gate(),))
    found = json.loads(json.dumps(gate_json(report)))
    (model,) = found["models"]
    assert found["passed"] is False and model["verdict"] == "fail"
    assert [f["p95_ms"] for f in model["new_figures"]] == [9.0, 9.5]
    assert model["new_figures"][0]["quantiles"] == [[50.0, 4.5]]
    assert {c["name"] for c in model["checks"]} == {"errors", "latency", "throughput", "memory"}
    text = gate_text(report)
    assert text.splitlines()[0] == "gate aaaaaaaaaaaa -> bbbbbbbbbbbb: 1 failed, 0 passed"
    assert "  throughput @1: 295.0/s -> 97.5/s, 0.330 (ratio >= 0.9): fail, rounds " in text


def test_nothing_to_gate_passes() -> None:
    report = GateReport("a" * 40, "b" * 40)
    assert report.passed
    assert "nothing to gate" in gate_text(report)


def test_a_first_deployment_is_judged_on_its_errors_only() -> None:
    failing = LoadFigures(1, 100, 3, 50.0, 1.0, 2.0, 3.0)
    (check,) = judge_alone(GateSpec(max_latency_increase=0.1), [failing])
    assert (check.name, check.verdict, check.value) == ("errors", GateVerdict.FAIL, 0.03)


class _Tester:
    name = "fake"

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def measure(self, model, version, requests, outputs, concurrency, count, batched=False, **_):  # type: ignore[no-untyped-def]
        self.calls.append((concurrency, version))
        return LoadFigures(concurrency, count, 0, 100.0, 1.0, 2.0, 3.0)


class _Memory:
    def version_memory(self, model: str, version: int) -> int | None:
        return 1000 * version

    def server_memory(self) -> int | None:
        return None


class _Server:
    def __init__(self) -> None:
        self.load_tester = _Tester()
        self.memory = _Memory()


def test_old_and_new_are_measured_interleaved_the_order_flipping_each_round() -> None:
    server = _Server()
    spec = GateSpec(concurrency=(1, 4), rounds=3, requests=50)
    measured = _measure(server, "m", (1, 2), spec, [()], False)  # type: ignore[arg-type]
    assert server.load_tester.calls == [
        (1, 1), (1, 2), (4, 1), (4, 2),  # round 1: old first
        (1, 2), (1, 1), (4, 2), (4, 1),  # round 2: new first
        (1, 1), (1, 2), (4, 1), (4, 2),
    ]  # fmt: skip
    assert [f.memory_bytes for f in measured[2]] == [2000] * 6
    assert [f.concurrency for f in measured[1]] == [1, 4, 1, 4, 1, 4]


def test_perf_analyzer_input_keeps_each_tensor_type_and_drops_a_batch_dimension() -> None:
    request = (
        Tensor("INPUT0", "FP32", (1, 4), (1, 2, 3, 4)),
        Tensor("TEXT", "BYTES", (1, 1), ("hi",)),
    )
    assert input_data([request], batched=False) == {
        "data": [
            {
                "INPUT0": {"content": [1.0, 2.0, 3.0, 4.0], "shape": [1, 4]},
                "TEXT": {"content": ["hi"], "shape": [1, 1]},
            }
        ]
    }
    batched = input_data([request], batched=True)["data"][0]
    assert batched["INPUT0"] == {"content": [1.0, 2.0, 3.0, 4.0], "shape": [4]}


def test_memory_reads_as_a_share_or_as_a_size_as_its_bound_is_written() -> None:
    old, new = [figures(3.0, 300, memory=100 << 20)], [figures(3.0, 300, memory=150 << 20)]
    shown = {}
    for name, spec in (
        ("share", GateSpec(max_memory_increase=0.3)),
        ("size", GateSpec(max_memory_increase_bytes=64 << 20)),
        ("none", GateSpec()),
    ):
        gate = ModelGate(
            "m", "m", "m.yaml", 2, 1, (), judge(spec, old, new), tuple(old), tuple(new)
        )
        (line,) = [
            x for x in gate_text(GateReport("a", "b", (gate,))).splitlines() if "memory" in x
        ]
        shown[name] = line.strip()
    assert shown["share"] == "memory: 100.0 MiB -> 150.0 MiB, +50.0% (increase <= 30%): fail"
    assert shown["size"] == (
        f"memory: 100.0 MiB -> 150.0 MiB, +50.0 MiB (increase <= {64 << 20} bytes): pass"
    )
    assert shown["none"] == "memory: 100.0 MiB -> 150.0 MiB, +50.0% (no bound): unbounded"


def _strict(text: str) -> Any:
    """JSON as a strict parser reads it: NaN, Infinity and -Infinity are not JSON."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_figures_with_no_value_are_null_in_strict_json(tmp_path: Path) -> None:
    # A measurement that stopped at failed requests has no latency; one with NaN in its
    # distribution, and an old side that measured nothing at all.
    stopped = failed_requests(1, ["Thread [0] had error: boom"], 99)
    odd = replace(figures(3.0, 300), quantiles=((50.0, math.nan), (95.0, math.inf)))
    nothing = LoadFigures(1, 0, 0, math.nan, math.nan, math.nan, math.nan)
    old, new = [nothing, figures(3.0, 300)], [stopped, odd]
    gate = ModelGate(
        "m", "m", "m.yaml", 2, 1, (), judge(SPEC, old, new), tuple(old), tuple(new)
    )  # fmt: skip
    report = GateReport("a" * 40, "b" * 40, (gate,))
    found = _strict(json.dumps(gate_json(report)))
    (model,) = found["models"]
    assert model["new_figures"][0]["p95_ms"] is None
    assert model["new_figures"][1]["quantiles"] == [[50.0, None], [95.0, None]]
    assert model["old_figures"][0]["throughput"] is None
    latency = next(c for c in model["checks"] if c["name"] == "latency")
    assert latency["old"] == latency["new"] == 3.0  # the rounds that measured something
    # What the gate command writes (--report-dir, --output json) parses strictly too.
    write_gate_reports(report, tmp_path)
    assert _strict((tmp_path / "gate.json").read_text()) == found


def test_an_inconclusive_check_is_reported_as_noisy_never_as_a_failure() -> None:
    old = [figures(3.0, 300)] * 5
    new = [figures(3.0 * r, 300) for r in (1.5, 0.9, 1.4, 1.3, 1.0)]
    gate = ModelGate(
        "scorer", "scorer", "manifests/scorer.yaml", 3, 1, (), judge(SPEC, old, new),
        tuple(old), tuple(new), LoadTestSpec("built-in", "smoke cases"), 12.5, LINES,
    )  # fmt: skip
    report = GateReport("a" * 40, "b" * 40, (gate,))
    assert (gate.verdict, report.verdict, report.passed) == ("inconclusive", "inconclusive", False)
    text = gate_text(report)
    assert text.splitlines()[0].endswith(": 1 inconclusive (noisy), 0 passed")
    assert "  latency @1: 3.00 ms -> 3.90 ms, +30.0% (p95 increase <= 0.2): inconclusive" in text
    assert "the rounds disagree (the median lies in -10.0% … +50.0% at 90%)" in text
    markdown = gate_markdown(report)
    assert "#### ⚠️ scorer: version 3 against 1" in markdown
    assert "| ⚠️ inconclusive |" in markdown
    (line,) = gate_annotations(report).splitlines()  # a warning, not an error
    assert line.startswith("::warning file=manifests/scorer.yaml,line=21::gate: scorer version 3")
    found = gate_json(report)
    (latency,) = [c for c in found["models"][0]["checks"] if c["name"] == "latency"]
    assert (latency["verdict"], latency["rounds"], found["verdict"]) == (
        "inconclusive", 5, "inconclusive",
    )  # fmt: skip
    assert latency["interval"] == latency["spread"]  # five rounds: the lowest and highest
