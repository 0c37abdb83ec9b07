"""The metric readers against a real tritonserver and a real Prometheus scraping it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from reconciler.adapters.metrics import (
    PrometheusQuery,
    TritonScrape,
    instance_of,
    metrics_reader,
)
from reconciler.adapters.triton import TritonServerClient
from reconciler.core.triton_config import parse_pbtxt, with_versions
from reconciler.model.analysis import Figures
from reconciler.model.errors import VerifyFailed
from reconciler.model.spec import Tensor
from reconciler.ports import FiguresSource
from testkit.local_triton import LocalTriton, free_port
from testkit.manifests import MODELS

if TYPE_CHECKING:
    from tests.services import StartPrometheus

pytest_plugins = ("tests.services",)

ONES = Tensor("INPUT0", "FP32", (1, 4), (1.0, 1.0, 1.0, 1.0))
# A model whose execute raises on every other call. Triton counts those requests as failures
# (reason BACKEND); an InferenceResponse carrying an error is counted as a success.
FLAKY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0

    def execute(self, requests):
        self.calls += 1
        if self.calls % 2 == 0:
            raise pb_utils.TritonModelException(f"call {self.calls} fails on purpose")
        return [
            pb_utils.InferenceResponse(
                output_tensors=[pb_utils.get_input_tensor_by_name(r, "INPUT0")]
            )
            for r in requests
        ]
"""


def _wait_for(
    reader: FiguresSource, model: str, versions: tuple[int, ...], success: float, timeout: float
) -> Figures:
    """The figures once ``success`` requests show. Triton counts a request a moment after
    answering it, and Prometheus sees it at its next scrape."""
    deadline = time.monotonic() + timeout
    while True:
        figures = reader.figures(model, versions)
        if figures.success == success or time.monotonic() > deadline:
            return figures
        time.sleep(0.05)


def _serve(triton: LocalTriton, model_repository: Path, versions: list[int]) -> TritonServerClient:
    client = TritonServerClient("edge-a", triton.grpc_address)
    base = parse_pbtxt((model_repository / "echo" / "config.pbtxt").read_text())
    client.load("echo", with_versions(base, "echo", versions))
    return client


def _infer(client: TritonServerClient, version: int, times: int) -> None:
    for _ in range(times):
        client.infer("echo", version, (ONES,), ("OUTPUT0",))


def test_scrape_counts_only_the_versions_asked(triton: LocalTriton, model_repository: Path) -> None:
    client = _serve(triton, model_repository, [1, 2])
    scrape = TritonScrape(triton.metrics_url)
    before = {v: scrape.figures("echo", (v,)) for v in (1, 2)}
    assert before[2].error is None
    assert before[2].success == 0 and before[2].duration_us == 0
    assert before[2].failure == 0  # Triton 2.51 exports every reason at 0 once loaded

    _infer(client, 2, 5)
    client.close()

    after = {2: _wait_for(scrape, "echo", (2,), 5, timeout=5), 1: scrape.figures("echo", (1,))}
    assert after[2].success == 5
    assert after[2].failure == 0
    assert after[2].duration_us is not None and after[2].duration_us > 0
    assert (after[1].success, after[1].failure, after[1].duration_us) == (0, 0, 0)
    both = scrape.figures("echo", (1, 2))
    assert both.success == 5 and both.duration_us == after[2].duration_us
    assert after[2].memory_bytes is not None and after[2].memory_bytes > 0


def test_scrape_sums_failures_over_every_reason(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    (repository / "flaky" / "1").mkdir(parents=True)
    (repository / "flaky" / "1" / "model.py").write_text(FLAKY)
    config = (MODELS / "echo" / "config.pbtxt").read_text().replace('"echo"', '"flaky"')
    (repository / "flaky" / "config.pbtxt").write_text(config)
    with LocalTriton(repository, log_file=tmp_path / "triton.log") as triton:
        client = TritonServerClient("edge-a", triton.grpc_address)
        client.load("flaky", with_versions(parse_pbtxt(config), "flaky", [1]))
        for call in range(1, 6):
            try:
                client.infer("flaky", 1, (ONES,), ("OUTPUT0",))
            except VerifyFailed:
                assert call % 2 == 0
        client.close()
        figures = _wait_for(TritonScrape(triton.metrics_url), "flaky", (1,), 3, timeout=5)
    assert (figures.success, figures.failure) == (3, 2)


def test_scrape_of_absent_series_reads_none_and_queries_are_unsupported(
    triton: LocalTriton,
) -> None:
    scrape = TritonScrape(f"http://{triton.host}:{triton.metrics_port}")  # /metrics added
    figures = scrape.figures("echo", (1,), {"p99": "histogram_quantile(0.99, x)"})
    assert figures.error is None
    assert (figures.success, figures.failure, figures.duration_us) == (None, None, None)
    assert figures.queries == {"p99": None}
    # Memory reads 0 until Triton's first poll, 2 s after start: absent, not zero.
    deadline = time.monotonic() + 5
    while figures.memory_bytes is None and time.monotonic() < deadline:
        time.sleep(0.1)
        figures = scrape.figures("echo", (1,))
    assert figures.memory_bytes is not None and figures.memory_bytes > 0


def test_scrape_of_an_unreachable_server_is_an_error_not_an_exception() -> None:
    url = f"http://metrics:s3cret@127.0.0.1:{free_port()}/metrics"
    figures = TritonScrape(url, timeout=2).figures("echo", (1,), {"q": "up"})
    assert figures.error is not None
    assert "127.0.0.1" in figures.error and "refused" in figures.error
    assert "s3cret" not in figures.error
    assert figures.success is None and figures.queries == {"q": None}


def test_prometheus_agrees_with_a_direct_scrape(
    triton: LocalTriton, model_repository: Path, start_prometheus: StartPrometheus
) -> None:
    # Prometheus takes its first scrape about 5 s after it starts: start it before the load.
    prometheus = start_prometheus([f"{triton.host}:{triton.metrics_port}"], scrape_interval="1s")
    client = _serve(triton, model_repository, [1, 2])
    _infer(client, 2, 5)
    client.close()
    reader = PrometheusQuery.for_metrics_url(prometheus.url, triton.metrics_url)
    assert reader.instance == f"127.0.0.1:{triton.metrics_port}"
    scrape = TritonScrape(triton.metrics_url)
    assert _wait_for(scrape, "echo", (2,), 5, timeout=5).success == 5
    assert _wait_for(reader, "echo", (2,), 5, timeout=20).success == 5, prometheus.log_tail()

    direct_before = scrape.figures("echo", (1, 2))
    through = reader.figures(
        "echo",
        (1, 2),
        {
            "v2": 'sum(nv_inference_request_success{model="echo",version="2"})',
            "scalar": "scalar(vector(2))",
            "nothing": 'sum(nv_inference_request_success{model="absent"})',
            "broken": "sum(",
            "nan": "vector(0) / 0",
        },
    )
    direct_after = scrape.figures("echo", (1, 2))

    assert through.error is None
    # Counters stopped growing with the last request: they agree exactly.
    assert (through.success, through.failure, through.duration_us) == (
        direct_after.success,
        direct_after.failure,
        direct_after.duration_us,
    )
    # Memory is the host's, a gauge that moves between scrapes.
    assert direct_before.memory_bytes and direct_after.memory_bytes and through.memory_bytes
    low = min(direct_before.memory_bytes, direct_after.memory_bytes)
    high = max(direct_before.memory_bytes, direct_after.memory_bytes)
    assert low - (512 << 20) <= through.memory_bytes <= high + (512 << 20)
    assert through.queries == {
        "v2": 5.0,
        "scalar": 2.0,
        "nothing": None,
        "broken": None,
        "nan": None,
    }

    only_1 = reader.figures("echo", (1,))
    assert only_1.success == 0 and only_1.duration_us == 0
    # Label values are escaped: an odd name finds nothing rather than breaking the query.
    odd = reader.figures('ec"ho\\', (1,))
    assert odd.error is None and odd.success is None and odd.memory_bytes is not None


def test_unreachable_prometheus_is_an_error_not_an_exception() -> None:
    url = f"http://prom:s3cret@127.0.0.1:{free_port()}"
    reader = PrometheusQuery(url, "127.0.0.1:8002", timeout=2)
    started = time.monotonic()
    figures = reader.figures("echo", (1,), {"q": "up"})
    assert time.monotonic() - started < 2
    assert figures.error is not None and "127.0.0.1" in figures.error
    assert "s3cret" not in figures.error and "s3cret" not in repr(reader)
    assert figures.success is None and figures.queries == {"q": None}


@pytest.mark.parametrize(
    ("metrics_url", "instance"),
    [
        ("http://127.0.0.1:8002/metrics", "127.0.0.1:8002"),
        ("http://user:pw@triton-a:8002/metrics", "triton-a:8002"),
        ("http://triton-a/metrics", "triton-a:80"),
        ("https://triton-a/metrics", "triton-a:443"),
        ("http://[::1]:8002/metrics", "[::1]:8002"),
    ],
)
def test_instance_is_the_targets_host_and_port(metrics_url: str, instance: str) -> None:
    assert instance_of(metrics_url) == instance


def test_reader_factory_prefers_prometheus() -> None:
    metrics = "http://127.0.0.1:8002/metrics"
    prometheus = metrics_reader("http://127.0.0.1:9090", metrics)
    assert isinstance(prometheus, PrometheusQuery)
    assert prometheus.instance == "127.0.0.1:8002"
    assert isinstance(metrics_reader(None, metrics), TritonScrape)
    assert metrics_reader("http://127.0.0.1:9090", None) is None
    assert metrics_reader(None, None) is None
