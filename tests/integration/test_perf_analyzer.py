"""perf_analyzer as the gate's load generator (adapters/perf_analyzer.py) against a real
tritonserver: a measurement is a fixed one (three windows, merged), so perf_analyzer's own
search for stable windows (which fails on a busy machine, exit 2) never reads as failed
requests; only requests that really fail are failures, and a run that cannot measure is an
error.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as triton_grpc

from reconciler.adapters.perf_analyzer import PerfAnalyzer
from reconciler.core.triton_config import parse_pbtxt
from reconciler.model.errors import StepFailed
from reconciler.model.spec import Tensor
from testkit.local_triton import LocalTriton, shared_between_tests
from testkit.manifests import SCORER, write_scorer_repository
from tests.services import perf_analyzer_or_skip

# Figures asserted present and failures counted, nothing compared (perf_analyzer's own search
# for stable windows is asked to fail): beside other tests is fine, as test_aiperf.py.
pytestmark = pytest.mark.triton

REQUEST = (Tensor("INPUT0", "FP32", (1, 4), (1, 2, 3, 4)),)
GOOD, FAILING = 1, 4  # testkit/models/scorer/model.py


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalTriton, Path, Path]]:
    """The scorer model with a good version and one that fails every request, loaded."""
    binary = perf_analyzer_or_skip()
    root = tmp_path_factory.mktemp("perf")
    repository = write_scorer_repository(root / "models")
    server = LocalTriton(repository, log_file=root / "triton.log").start()

    def load_both(server: LocalTriton) -> None:
        config = parse_pbtxt((repository / SCORER / "config.pbtxt").read_text())
        config["version_policy"] = {"specific": {"versions": [GOOD, FAILING]}}
        client = triton_grpc.InferenceServerClient(server.grpc_address)
        try:
            client.load_model(SCORER, config=json.dumps(config))
        finally:
            client.close()

    try:
        load_both(server)
        (root / "work").mkdir()
        # Started again, with both versions loaded, before the next test if Triton aborts.
        with shared_between_tests(server, load_both):
            yield server, Path(binary), root / "work"
    finally:
        server.stop()


def test_a_run_that_would_not_stabilize_still_gives_the_real_figures(
    served: tuple[LocalTriton, Path, Path],
) -> None:
    server, binary, work = served
    tester = PerfAnalyzer(str(binary), server.grpc_address, work)
    # perf_analyzer's own stability search, held to 0.1%: it gives up (exit 2) and reports
    # nothing, though every request was answered. The gate used to record that as every
    # request failed.
    tester._data_file([REQUEST], False)
    (data,) = work.glob("input-*.json")
    searched = subprocess.run(
        [
            str(binary), "-i", "grpc", "-u", server.grpc_address, "-m", SCORER,
            "-x", str(GOOD), "--concurrency-range", "2:2", "--input-data", str(data),
            "--measurement-mode", "count_windows", "--measurement-request-count", "20",
            "--stability-percentage", "0.1", "--max-trials", "3",
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert searched.returncode == 2, (searched.stdout, searched.stderr)
    assert "Failed to obtain stable measurement" in searched.stderr
    # The gate's measurement: three windows of at least 60 requests, all answered, with
    # their figures.
    figures = tester.measure(SCORER, GOOD, [REQUEST], (), 2, 60)
    assert figures.requests >= 3 * 60 and (figures.errors, figures.note) == (0, "")
    assert figures.throughput > 0
    assert 2.0 < figures.p50_ms <= figures.p95_ms <= figures.p99_ms  # the model sleeps 3 ms
    assert [q for q, _ in figures.quantiles] == [50, 90, 95, 99]


def test_requests_that_really_fail_are_the_failures(
    served: tuple[LocalTriton, Path, Path],
) -> None:
    server, binary, work = served
    figures = PerfAnalyzer(str(binary), server.grpc_address, work).measure(
        SCORER, FAILING, [REQUEST], (), 2, 60
    )
    assert 1 <= figures.errors == figures.requests <= 2  # each worker stops at its first
    assert "version 4 fails every request" in figures.note


def test_a_run_that_cannot_measure_is_an_error_not_failed_requests(
    served: tuple[LocalTriton, Path, Path],
) -> None:
    server, binary, work = served
    with pytest.raises(StepFailed, match=r"could not measure scorer version 3 .*exit 99"):
        PerfAnalyzer(str(binary), server.grpc_address, work).measure(
            SCORER, 3, [REQUEST], (), 1, 20
        )  # version 3 is not loaded
