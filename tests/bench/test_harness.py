"""The benchmark harness's own pieces (``bench/harness``), without Triton: the probe the
pass's hooks and ports report to, the statistics and the report tables."""

from __future__ import annotations

import pytest

from bench.harness.probe import Probe
from bench.harness.report import fixed, md_table, number
from bench.harness.stats import percentile, slope_per_100, summary


class Port:
    def __init__(self) -> None:
        self.entered = False

    def load(self, model: str) -> str:
        return f"loaded {model}"

    def __enter__(self) -> Port:
        self.entered = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.entered = False


def test_phases_and_port_calls_nest_under_the_phase_that_ran() -> None:
    probe = Probe()
    port = probe.timed(Port(), "triton", {"unload": "triton unload"})
    probe.phase_started("apply")
    assert port.load("echo") == "loaded echo"
    assert port.load("other") == "loaded other"
    probe.phase_ended("apply", 0.5)
    port.load("outside")
    assert probe.seconds["apply"] == 0.5
    assert probe.calls == {"apply": 1, "apply > triton load": 2, "triton load": 1}
    assert list(probe.seconds) == ["apply", "apply > triton load", "triton load"]
    probe.reset()
    assert not probe.seconds and not probe.calls


def test_a_timed_port_is_still_a_context_manager_and_passes_failures_on() -> None:
    probe = Probe()
    real = Port()
    with probe.timed(real, "triton") as timed:
        assert real.entered and timed.entered
    assert not real.entered
    with pytest.raises(TypeError):
        probe.timed(real, "triton").load()  # type: ignore[call-arg]
    assert probe.calls["triton load"] == 1  # timed although it raised


def test_statistics() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 90) == 4.0
    assert summary([None, None]) is None
    assert summary([0.001, None, 0.003], 1000) == {
        "median": 2.0,
        "p90": 3.0,
        "max": 3.0,
        "min": 1.0,
        "mean": 2.0,
    }
    assert slope_per_100([1.0, 2.0], [1.0, 2.0]) is None  # too few points
    assert slope_per_100([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) is None  # one x only
    assert slope_per_100([0.0, 1.0, 2.0], [5.0, 7.0, 9.0]) == pytest.approx(200.0)


def test_tables() -> None:
    assert md_table(("ms", "median"), [("a", "1"), ("b", "-")]) == [
        "| ms | median |",
        "|---|---:|",
        "| a | 1 |",
        "| b | - |",
    ]
    assert fixed(("name", 1, "2.5"), (6, 4, 5)) == "name     1  2.5"
    assert number(None) == "-"
    assert number(1234.5, 1) == "1234.5"
    assert number(1234.5, 0, thousands=True) == "1,234"
