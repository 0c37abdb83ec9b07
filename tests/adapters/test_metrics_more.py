"""The drain and headroom figures (pending, inferences, memory total) from real sources.

On a real tritonserver (CPU: ``nv_cpu_memory_*``), and for the GPU-else-CPU rule on a
metrics endpoint served by the test with GPU series, both read directly and through a real
Prometheus scraping it: used and total must always come from the same source.
"""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from reconciler.adapters.metrics import PrometheusQuery, TritonScrape
from reconciler.adapters.triton import TritonServerClient
from reconciler.core.readings import free_memory
from reconciler.core.triton_config import parse_pbtxt, with_versions
from reconciler.model.analysis import Figures
from reconciler.model.spec import Tensor
from reconciler.ports import FiguresSource
from testkit.local_triton import LocalTriton

if TYPE_CHECKING:
    from tests.services import StartPrometheus

pytest_plugins = ("tests.services",)

ONES = Tensor("INPUT0", "FP32", (1, 4), (1.0, 1.0, 1.0, 1.0))
SLOW = 5  # echo version 5 answers 25 ms late: requests queue behind its one instance


def _serve(triton: LocalTriton, model_repository: Path, versions: list[int]) -> None:
    with TritonServerClient("edge-a", triton.grpc_address) as client:
        base = parse_pbtxt((model_repository / "echo" / "config.pbtxt").read_text())
        client.load("echo", with_versions(base, "echo", versions))


def _until(
    reader: FiguresSource,
    versions: tuple[int, ...],
    done: Callable[[Figures], bool],
    timeout: float = 20.0,
) -> Figures:
    deadline = time.monotonic() + timeout
    while True:
        figures = reader.figures("echo", versions)
        if done(figures) or time.monotonic() > deadline:
            return figures
        time.sleep(0.05)


def _load(triton: LocalTriton, version: int, threads: int, each: int) -> list[threading.Thread]:
    """``threads`` clients sending ``each`` requests to ``version``, started."""

    def send() -> None:
        with TritonServerClient("edge-a", triton.grpc_address, call_timeout=30) as client:
            for _ in range(each):
                client.infer("echo", version, (ONES,), ("OUTPUT0",))

    workers = [threading.Thread(target=send) for _ in range(threads)]
    for worker in workers:
        worker.start()
    return workers


def test_pending_and_inferences_grow_then_settle(
    triton: LocalTriton, model_repository: Path
) -> None:
    _serve(triton, model_repository, [1, SLOW])
    scrape = TritonScrape(triton.metrics_url)
    before = scrape.figures("echo", (SLOW,))
    assert (before.pending, before.inferences) == (0, 0)

    workers = _load(triton, SLOW, threads=8, each=5)
    seen: list[Figures] = []
    while any(w.is_alive() for w in workers):
        seen.append(scrape.figures("echo", (SLOW,)))
        time.sleep(0.02)
    for worker in workers:
        worker.join()

    # While busy, requests queued behind the one instance; the count only ever grew.
    assert max(f.pending or 0 for f in seen) > 0
    counts = [f.inferences or 0 for f in seen]
    assert counts == sorted(counts) and 0 < counts[-1] <= 40
    # Idle: nothing queued, and the count stops at the number of requests.
    idle = _until(scrape, (SLOW,), lambda f: f.inferences == 40)
    assert (idle.pending, idle.inferences, idle.success) == (0, 40, 40)
    assert scrape.figures("echo", (SLOW,)).inferences == 40  # settled
    other = scrape.figures("echo", (1,))
    assert (other.pending, other.inferences) == (0, 0)
    both = scrape.figures("echo", (1, SLOW))
    assert (both.pending, both.inferences) == (0, 40)


def test_versions_not_loaded_have_no_drain_figures(
    triton: LocalTriton, model_repository: Path
) -> None:
    _serve(triton, model_repository, [1])
    figures = TritonScrape(triton.metrics_url).figures("echo", (2,))
    assert figures.error is None
    assert (figures.pending, figures.inferences) == (None, None)


def test_memory_total_is_the_hosts_and_above_what_is_used(triton: LocalTriton) -> None:
    scrape = TritonScrape(triton.metrics_url)
    # Both read 0 until Triton's first memory poll, 2 s after start: absent, not zero.
    figures = _until(
        scrape, (1,), lambda f: f.memory_bytes is not None and f.memory_total_bytes is not None
    )
    assert figures.memory_bytes is not None and figures.memory_total_bytes is not None
    assert 0 < figures.memory_bytes < figures.memory_total_bytes
    with open("/proc/meminfo") as meminfo:
        kib = int(meminfo.readline().split()[1])  # MemTotal
    assert abs(figures.memory_total_bytes - kib * 1024) < 0.05 * kib * 1024


def test_prometheus_agrees_on_drain_and_headroom_figures(
    triton: LocalTriton, model_repository: Path, start_prometheus: StartPrometheus
) -> None:
    prometheus = start_prometheus([f"{triton.host}:{triton.metrics_port}"], scrape_interval="1s")
    _serve(triton, model_repository, [1, SLOW])
    for worker in _load(triton, SLOW, threads=2, each=5):
        worker.join()
    scrape = TritonScrape(triton.metrics_url)
    reader = PrometheusQuery.for_metrics_url(prometheus.url, triton.metrics_url)
    direct = _until(scrape, (1, SLOW), lambda f: f.inferences == 10)
    through = _until(reader, (1, SLOW), lambda f: f.inferences == 10, timeout=30)
    assert through.error is None, prometheus.log_tail()
    assert (through.pending, through.inferences) == (direct.pending, direct.inferences) == (0, 10)
    assert through.memory_total_bytes == direct.memory_total_bytes  # the host's: constant
    assert reader.figures("echo", (2,)).inferences is None
    queries = reader.standard_queries("echo", (1,))
    assert through.memory_host_wide and direct.memory_host_wide  # a CPU server: the host's
    memory = {"nv_cpu_memory_used_bytes", "nv_gpu_memory_total_bytes"}
    assert memory | {"nv_inference_pending_request_count"} <= queries.keys()


# -- the GPU-else-CPU rule, on an endpoint that reports GPUs -------------------------------

PER_MODEL = """\
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="echo",version="1"} 2
nv_inference_pending_request_count{model="echo",version="2"} 3
# TYPE nv_inference_count counter
nv_inference_count{model="echo",version="1"} 10
nv_inference_count{model="echo",version="2"} 20
"""
CPU = """\
# TYPE nv_cpu_memory_used_bytes gauge
nv_cpu_memory_used_bytes 3000
# TYPE nv_cpu_memory_total_bytes gauge
nv_cpu_memory_total_bytes 7000
"""
GPU_USED = """\
# TYPE nv_gpu_memory_used_bytes gauge
nv_gpu_memory_used_bytes{gpu_uuid="GPU-a"} 1000
nv_gpu_memory_used_bytes{gpu_uuid="GPU-b"} 500
"""
GPU_TOTAL = """\
# TYPE nv_gpu_memory_total_bytes gauge
nv_gpu_memory_total_bytes{gpu_uuid="GPU-a"} 8000
nv_gpu_memory_total_bytes{gpu_uuid="GPU-b"} 8000
"""
ENDPOINTS = {
    # name: (metrics text, expected (memory_bytes, memory_total_bytes, memory_host_wide))
    "gpu": (PER_MODEL + GPU_USED + GPU_TOTAL + CPU, (1500.0, 16000.0, False)),
    # The CPU figures are the host's (Triton reads /proc/meminfo): said so.
    "cpu": (PER_MODEL + CPU, (3000.0, 7000.0, True)),
    # A GPU total without a GPU figure in use: CPU for both, never a GPU total over CPU use.
    "gpu-total-only": (PER_MODEL + GPU_TOTAL + CPU, (3000.0, 7000.0, True)),
    # A GPU figure in use without its total: no total, never the CPU's.
    "gpu-used-only": (PER_MODEL + GPU_USED + CPU, (1500.0, None, False)),
}


class _Endpoint(http.server.BaseHTTPRequestHandler):
    text = ""

    def do_GET(self) -> None:
        body = self.text.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def endpoints() -> Iterator[dict[str, str]]:
    """One metrics endpoint per case of ENDPOINTS, by name: ``host:port``."""
    servers = []
    for name, (text, _) in ENDPOINTS.items():
        handler = type(f"Endpoint_{name}", (_Endpoint,), {"text": text})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append((name, server))
    try:
        yield {name: f"127.0.0.1:{server.server_address[1]}" for name, server in servers}
    finally:
        for _, server in servers:
            server.shutdown()
            server.server_close()


@pytest.mark.parametrize("case", list(ENDPOINTS))
def test_scrape_pairs_used_and_total_from_one_source(endpoints: dict[str, str], case: str) -> None:
    figures = TritonScrape(f"http://{endpoints[case]}/metrics").figures("echo", (1, 2))
    assert figures.error is None
    memory = (figures.memory_bytes, figures.memory_total_bytes, figures.memory_host_wide)
    assert memory == ENDPOINTS[case][1]
    assert (figures.pending, figures.inferences) == (5, 30)


def test_prometheus_pairs_used_and_total_from_one_source(
    endpoints: dict[str, str], start_prometheus: StartPrometheus
) -> None:
    prometheus = start_prometheus(list(endpoints.values()), scrape_interval="1s")
    for case, address in endpoints.items():
        reader = PrometheusQuery(prometheus.url, address)
        figures = _until_scraped(reader)
        assert figures.error is None and figures.inferences is not None, (
            f"{case}: {figures}\n{prometheus.log_tail()}"
        )
        memory = (figures.memory_bytes, figures.memory_total_bytes, figures.memory_host_wide)
        assert memory == ENDPOINTS[case][1], case
        # Each device as the server reports it (a vector by gpu_uuid, not the sum).
        devices = {"GPU-a": 1000.0, "GPU-b": 500.0} if "gpu-used" in case or case == "gpu" else {}
        assert figures.gpu_used == devices, case
        assert (figures.pending, figures.inferences) == (5, 30)
        assert reader.figures("echo", (1,)).inferences == 10


def _until_scraped(reader: PrometheusQuery, timeout: float = 60.0) -> Figures:
    """The figures once Prometheus has scraped the reader's target (a slow, loaded machine
    can take several scrape intervals). Each figure is its own query: a first scrape that
    Prometheus ingests between two of them (its samples stamped when it began, before the
    queries' time) is seen by the later queries only, so all of them must have it."""
    deadline = time.monotonic() + timeout
    while True:
        figures = reader.figures("echo", (1, 2))
        scraped = (
            figures.error is None
            and figures.memory_bytes is not None
            and figures.inferences is not None
        )
        if scraped or time.monotonic() > deadline:
            return figures
        time.sleep(0.2)


class _Flaky(_Endpoint):
    """ENDPOINTS' "cpu" text, or a 503 while ``failing`` is set."""

    text = ENDPOINTS["cpu"][0]
    failing = threading.Event()

    def do_GET(self) -> None:
        if self.failing.is_set():
            self.send_error(503)
        else:
            super().do_GET()


def test_prometheus_says_when_its_last_scrape_of_the_server_failed(
    start_prometheus: StartPrometheus,
) -> None:
    # After a failed scrape Prometheus hides every series of the server (staleness markers):
    # the reader must say so, not hand over figures that merely lack the counters. Each
    # figure is a query of its own, so a scrape Prometheus ingests between two of them is
    # seen by the later ones only: no reading, on the way down or back, may miss a figure
    # without saying why.
    handler = type("Flaky", (_Flaky,), {"failing": threading.Event()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{server.server_address[1]}"
    readings: list[Figures] = []

    def read_until(done: Callable[[Figures], bool]) -> Figures:
        deadline = time.monotonic() + 30
        while True:
            readings.append(reader.figures("echo", (1, 2)))
            if done(readings[-1]) or time.monotonic() > deadline:
                return readings[-1]
            time.sleep(0.01)

    try:
        prometheus = start_prometheus([address], scrape_interval="1s")
        reader = PrometheusQuery(prometheus.url, address)
        served = _until_scraped(reader)
        assert served.scrape_failed is None and served.inferences == 30, prometheus.log_tail()

        handler.failing.set()
        missed = read_until(lambda f: f.scrape_failed is not None and f.memory_bytes is None)
        assert missed.scrape_failed is not None, (missed, prometheus.log_tail())
        assert f"could not scrape {address} last time (up 0)" in missed.scrape_failed
        assert (missed.error, missed.inferences, missed.memory_bytes) == (None, None, None)

        handler.failing.clear()
        again = read_until(lambda f: f.scrape_failed is None and f.inferences is not None)
        assert (again.scrape_failed, again.inferences) == (None, 30), prometheus.log_tail()
        unexplained = [
            f for f in readings if None in (f.inferences, f.memory_bytes) and not f.scrape_failed
        ]
        assert not unexplained, f"{len(unexplained)} of {len(readings)}: {unexplained[:3]}"
    finally:
        server.shutdown()
        server.server_close()


# -- per GPU device ----------------------------------------------------------------------------

# Triton's own exposition of its GPU gauges (as a 2.x server on one T4-class GPU printed them:
# the first device's uuid and figures are from such a capture), here with a second device
# that is fuller. Per-model counters carry the gpu_uuid label too on a GPU server.
TWO_GPUS = """\
# HELP nv_inference_count Number of inferences performed (does not include cached requests)
# TYPE nv_inference_count counter
nv_inference_count{gpu_uuid="@A@",model="echo",version="1"} 4.000000
nv_inference_count{gpu_uuid="@B@",model="echo",version="1"} 6.000000
# HELP nv_gpu_memory_total_bytes GPU total memory, in bytes
# TYPE nv_gpu_memory_total_bytes gauge
nv_gpu_memory_total_bytes{gpu_uuid="@A@"} 16945512448.000000
nv_gpu_memory_total_bytes{gpu_uuid="@B@"} 16945512448.000000
# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes
# TYPE nv_gpu_memory_used_bytes gauge
nv_gpu_memory_used_bytes{gpu_uuid="@A@"} 974913536.000000
nv_gpu_memory_used_bytes{gpu_uuid="@B@"} 15032385536.000000
"""
FIRST = "GPU-0e9fdafb-5adb-91cd-26a8-308d34357efc"
SECOND = "GPU-7f3d2c1b-0a9e-4d8c-b7a6-5e4f3d2c1b0a"
TWO_GPUS = TWO_GPUS.replace("@A@", FIRST).replace("@B@", SECOND)


def test_each_gpu_device_is_read_and_the_fullest_decides_the_room() -> None:
    handler = type("Endpoint_two_gpus", (_Endpoint,), {"text": TWO_GPUS})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        address = f"127.0.0.1:{server.server_port}"
        figures = TritonScrape(f"http://{address}/metrics").figures("echo", (1,))
    finally:
        server.shutdown()
        server.server_close()
    assert figures.inferences == 10  # summed over the devices
    assert figures.gpu_used == {FIRST: 974913536.0, SECOND: 15032385536.0}
    assert figures.gpu_total == {FIRST: 16945512448.0, SECOND: 16945512448.0}
    # The sum says 17.8 GB free; the second device has 1.9 GB: a version needs its room there.
    assert figures.memory_total_bytes - figures.memory_bytes == 17883725824.0  # type: ignore[operator]
    assert figures.fullest_device() == (SECOND, 1913126912.0)
    assert free_memory(figures) == 1913126912.0
    assert not figures.memory_host_wide
