"""Metric sources for the post-swap analysis: Triton's own endpoint, or a Prometheus server.

The analysis loop (``core/analysis.py`` judges, this module reads) asks a ``FiguresSource``
(the port in ``ports.py``) for the cumulative ``Figures`` of some versions of one model on one
server, every analysis interval. Two readers:

- ``TritonScrape`` reads the server's Prometheus text endpoint directly (no Prometheus
  needed); it cannot run PromQL, so every requested query reads as None.
- ``PrometheusQuery`` asks a Prometheus server that scrapes the Triton server, with instant
  queries all evaluated at one timestamp (so success and duration come from the same scrape),
  and also runs the deployment's own PromQL checks. It reads the server's ``up`` too: after a
  failed scrape (a busy host, a slow endpoint) Prometheus hides the server's series, and
  ``Figures.scrape_failed`` says so, so that the analysis waits for the next scrape instead
  of taking the gap for a missing counter.

A reader never raises for a source it cannot read: it returns ``Figures(error=...)`` naming
the URL (credentials hidden) and the reason, which the analysis turns into ``no-data``. The
only module that imports prometheus_client's parser and prometheus_api_client.
"""

from __future__ import annotations

import json
import logging
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from reconciler.credentials import basic_auth, redact
from reconciler.model.analysis import Figures
from reconciler.ports import FiguresSource

log = logging.getLogger(__name__)

SUCCESS = "nv_inference_request_success"
FAILURE = "nv_inference_request_failure"
DURATION = "nv_inference_request_duration_us"
PENDING = "nv_inference_pending_request_count"  # a gauge: queued, not executing
INFERENCES = "nv_inference_count"
GPU_MEMORY = "nv_gpu_memory_used_bytes"
CPU_MEMORY = "nv_cpu_memory_used_bytes"
GPU_MEMORY_TOTAL = "nv_gpu_memory_total_bytes"
CPU_MEMORY_TOTAL = "nv_cpu_memory_total_bytes"
_PER_MODEL = (SUCCESS, FAILURE, DURATION, PENDING, INFERENCES)
# In the order ``_memory_figures`` takes them.
_MEMORY = (GPU_MEMORY, GPU_MEMORY_TOTAL, CPU_MEMORY, CPU_MEMORY_TOTAL)
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _unanswered() -> type[Exception]:
    """What a query raises when Prometheus does not answer (imported on first use, as
    PrometheusQuery's client is)."""
    import requests

    return requests.RequestException


def _refused() -> type[Exception]:
    """What a query raises when Prometheus refuses it (a bad query, an error status)."""
    from prometheus_api_client.exceptions import PrometheusApiClientException

    return PrometheusApiClientException


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _measured(memory: float | None) -> float | None:
    """Triton reports 0 bytes in use until its first memory poll (``--metrics-interval-ms``,
    2 s by default, after start); a baseline of 0 would make any server look like a leak."""
    return memory if memory else None


def _memory_figures(
    gpu_used: float | None,
    gpu_total: float | None,
    cpu_used: float | None,
    cpu_total: float | None,
) -> tuple[float | None, float | None, bool]:
    """Memory in use and in all, and whether they are the host's: the GPU figures where the
    server reports any, else the CPU ones, which are the whole host's (Triton reads them
    from /proc/meminfo). Used and total always come from one source: a GPU total beside a
    CPU figure in use would make a headroom of nothing real."""
    if gpu_used is not None:
        return gpu_used, gpu_total, False
    return cpu_used, cpu_total, cpu_used is not None


class TritonScrape:
    """Figures read from one Triton server's metrics endpoint (``http://host:8002/metrics``)."""

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        if not urllib.parse.urlsplit(url).path.strip("/"):
            url = url.rstrip("/") + "/metrics"
        self.url = url
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"TritonScrape({redact(self.url)!r})"

    def _text(self) -> str:
        url, headers = basic_auth(self.url)
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            return bytes(response.read()).decode("utf-8", errors="replace")

    def figures(
        self, model: str, versions: tuple[int, ...], queries: Mapping[str, str] = {}
    ) -> Figures:
        unsupported: dict[str, float | None] = dict.fromkeys(queries)
        try:
            text = self._text()
        except urllib.error.HTTPError as exc:
            return Figures(queries=unsupported, error=self._error(f"HTTP {exc.code} {exc.reason}"))
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            return Figures(queries=unsupported, error=self._error(str(reason)))
        wanted = {str(v) for v in versions}
        sums: dict[str, float | None] = dict.fromkeys((*_PER_MODEL, *_MEMORY))
        devices: dict[str, dict[str, float]] = {GPU_MEMORY: {}, GPU_MEMORY_TOTAL: {}}
        try:
            for family in text_string_to_metric_families(text):
                if family.name not in sums:
                    continue
                # The parser names counter samples ``<family>_total``; ``_created`` samples
                # (timestamps, not counts) are left out.
                names = (family.name, f"{family.name}_total")
                for sample in family.samples:
                    if sample.name not in names:
                        continue
                    if family.name in _PER_MODEL and (
                        sample.labels.get("model") != model
                        or sample.labels.get("version") not in wanted
                    ):
                        continue
                    sums[family.name] = (sums[family.name] or 0.0) + float(sample.value)
                    if family.name in devices and "gpu_uuid" in sample.labels:
                        devices[family.name][sample.labels["gpu_uuid"]] = float(sample.value)
        except ValueError as exc:  # not Prometheus text
            return Figures(queries=unsupported, error=self._error(f"unreadable metrics: {exc}"))
        memory, total, host_wide = _memory_figures(
            sums[GPU_MEMORY], sums[GPU_MEMORY_TOTAL], sums[CPU_MEMORY], sums[CPU_MEMORY_TOTAL]
        )
        return Figures(
            success=sums[SUCCESS],
            failure=sums[FAILURE],
            duration_us=sums[DURATION],
            memory_bytes=_measured(memory),
            queries=unsupported,
            pending=sums[PENDING],
            inferences=sums[INFERENCES],
            memory_total_bytes=_measured(total),
            memory_host_wide=host_wide,
            gpu_used=devices[GPU_MEMORY],
            gpu_total=devices[GPU_MEMORY_TOTAL],
        )

    def _error(self, reason: str) -> str:
        return redact(f"cannot read metrics from {self.url}: {reason}")


def _quoted(value: str) -> str:
    """A PromQL string literal: JSON's escapes are Go's, which PromQL uses.

    Non-ASCII stays as is, since Go refuses JSON's surrogate-pair escapes.
    """
    return json.dumps(value, ensure_ascii=False)


def instance_of(metrics_url: str) -> str:
    """The ``instance`` label Prometheus gives a target scraped at ``metrics_url``."""
    parts = urllib.parse.urlsplit(metrics_url)
    host = parts.netloc.rpartition("@")[2]
    if parts.port is None:  # Prometheus 2 adds the scheme's port to the target address
        host = f"{host}:{_DEFAULT_PORTS.get(parts.scheme, 80)}"
    return host


class PrometheusQuery:
    """Figures from a Prometheus server that scrapes the Triton server as ``instance``."""

    def __init__(
        self,
        url: str,
        instance: str,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url.rstrip("/")
        self.instance = instance
        self.timeout = timeout
        self.clock = clock
        # Imported here, not with the module: requests and prometheus-api-client cost the
        # service ~5 MB of RSS, and one without --prometheus-url never needs them.
        from prometheus_api_client.prometheus_connect import PrometheusConnect
        from urllib3.util.retry import Retry

        plain, headers = basic_auth(self.url)
        # No retries here: the analysis asks again at its next interval, and one call must
        # not outlast its timeout several times over.
        self._client = PrometheusConnect(
            url=plain,
            headers=headers,
            retry=Retry(total=0),
            # Annotated int, handed to requests, which takes float seconds.
            timeout=timeout,  # type: ignore[arg-type]
        )

    @classmethod
    def for_metrics_url(
        cls, prometheus_url: str, metrics_url: str, timeout: float = 5.0
    ) -> PrometheusQuery:
        return cls(prometheus_url, instance_of(metrics_url), timeout)

    def __repr__(self) -> str:
        return f"PrometheusQuery({redact(self.url)!r}, instance={self.instance!r})"

    def close(self) -> None:
        self._client.close()

    def standard_queries(self, model: str, versions: tuple[int, ...]) -> dict[str, str]:
        """The PromQL behind each of ``Figures``' figures (no counters without versions)."""
        server = f"instance={_quoted(self.instance)}"
        # Each memory figure on its own: ``figures`` takes the GPU ones where the server
        # reports any, else the CPU ones (the host's), as the scrape does.
        queries = {name: f"sum({name}{{{server}}})" for name in _MEMORY}
        if versions:
            matchers = (
                f"model={_quoted(model)}",
                f"version=~{_quoted('|'.join(str(v) for v in versions))}",
                server,
            )
            selector = "{" + ",".join(matchers) + "}"
            for name in _PER_MODEL:  # the failure sum runs over every reason
                queries[name] = f"sum({name}{selector})"
        return queries

    def _value(self, query: str, at: float) -> float | None:
        """The first sample's value; raises for an unreachable Prometheus or a refused query."""
        result = self._client.custom_query(query, params={"time": f"{at:.3f}"})
        if not result:
            return None
        if isinstance(result[0], dict):  # an instant vector
            return _number(result[0].get("value", (None, None))[1])
        return _number(result[1])  # a scalar or string: [time, "value"]

    def figures(
        self, model: str, versions: tuple[int, ...], queries: Mapping[str, str] = {}
    ) -> Figures:
        at = self.clock()
        standard: dict[str, float | None] = {}
        # Prometheus's own record of its last scrape of the server, 0 when it failed, read
        # before the figures and after them: each figure is a query of its own, and a scrape
        # ingested between two of them is seen by the later ones only (a failed one hides
        # the server's series, the next good one shows them again), so a reading that saw
        # either is not fresh.
        up = f"max(up{{instance={_quoted(self.instance)}}})"
        try:
            up_before = self._value(up, at)
            for name, query in self.standard_queries(model, versions).items():
                standard[name] = self._value(query, at)
            values = {name: self._query(name, query, at) for name, query in queries.items()}
            devices = {
                name: self._by_device(f"{name}{{instance={_quoted(self.instance)}}}", at)
                for name in (GPU_MEMORY, GPU_MEMORY_TOTAL)
            }
            up_after = self._value(up, at)
        except (_unanswered(), _refused(), LookupError, TypeError) as exc:
            return Figures(
                queries=dict.fromkeys(queries),
                error=redact(f"cannot query Prometheus at {self.url}: {exc}"),
            )
        memory, total, host_wide = _memory_figures(*(standard.get(name) for name in _MEMORY))
        return Figures(
            success=standard.get(SUCCESS),
            failure=standard.get(FAILURE),
            duration_us=standard.get(DURATION),
            memory_bytes=_measured(memory),
            queries=values,
            pending=standard.get(PENDING),
            inferences=standard.get(INFERENCES),
            memory_total_bytes=_measured(total),
            memory_host_wide=host_wide,
            gpu_used=devices[GPU_MEMORY],
            gpu_total=devices[GPU_MEMORY_TOTAL],
            scrape_failed=(
                f"Prometheus at {redact(self.url)} could not scrape {self.instance} last time"
                " (up 0): every series of the server is hidden until a scrape succeeds"
                if 0 in (up_before, up_after)
                else None
            ),
        )

    def _by_device(self, query: str, at: float) -> dict[str, float]:
        """Each sample of an instant vector by its ``gpu_uuid`` label (a device each)."""
        found: dict[str, float] = {}
        for sample in self._client.custom_query(query, params={"time": f"{at:.3f}"}) or []:
            uuid = sample.get("metric", {}).get("gpu_uuid") if isinstance(sample, dict) else None
            value = _number(sample.get("value", (None, None))[1]) if uuid else None
            if uuid and value is not None:
                found[str(uuid)] = value
        return found

    def _query(self, name: str, query: str, at: float) -> float | None:
        """One of the deployment's own queries; a query Prometheus refuses reads as None."""
        try:
            return self._value(query, at)
        except _refused() as exc:
            log.warning("query %s (%s) failed on %s: %s", name, query, redact(self.url), exc)
            return None


def metrics_reader(
    prometheus_url: str | None, server_metrics_url: str | None, timeout: float = 5.0
) -> FiguresSource | None:
    """Prometheus when there is one (it needs the server's metrics URL to find the series),
    else the server's own endpoint, else nothing to read from."""
    if server_metrics_url is None:
        return None
    if prometheus_url:
        return PrometheusQuery.for_metrics_url(prometheus_url, server_metrics_url, timeout)
    return TritonScrape(server_metrics_url, timeout)
