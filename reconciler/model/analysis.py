"""What an analysis is asked to check, what it reads and what it
concludes: check definitions, metric figures, evaluations and verdicts (values only; the
judging is in ``core/analysis.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class Verdict(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    NO_DATA = "no-data"
    NO_TRAFFIC = "no-traffic"
    SKIPPED = "skipped"  # nothing to compare with (a first deployment has no old versions)


class RolloutVerdict(StrEnum):
    RUNNING = "running"
    PASSED = "passed"
    FAILED = "failed"
    INCONCLUSIVE = "inconclusive"
    # Inconclusive because the metrics source could not be read (Prometheus down): the old
    # versions serve again but the spec is not held. Set by ``concluded``, never by ``judge``.
    METRICS_UNAVAILABLE = "metrics-unavailable"


class NoTraffic(StrEnum):
    WAIT = "wait"
    PASS = "pass"
    FAIL = "fail"


@dataclass(frozen=True)
class Check:
    """One check of a deployment's analysis; exactly one kind of bound is set."""

    name: str
    kind: str  # successRate | latency | memory | promql
    min: float | None = None  # successRate, promql
    max: float | None = None  # promql
    max_increase: float | None = None  # latency: relative to the old versions' mean
    max_increase_bytes: float | None = None  # memory: growth since the analysis started
    query: str | None = None  # promql


@dataclass(frozen=True)
class AnalysisSpec:
    interval: float
    duration: float
    failure_limit: int = 0
    no_traffic: NoTraffic = NoTraffic.WAIT
    checks: tuple[Check, ...] = ()

    @property
    def needs_prometheus(self) -> bool:
        return any(c.kind == "promql" for c in self.checks)


@dataclass(frozen=True)
class Figures:
    """Cumulative figures at one instant, for some versions of one model on one server.

    Counters are Triton's own (``nv_inference_request_success``, ``..._failure``,
    ``nv_inference_request_duration_us``) summed over the versions; None where the series is
    absent. ``memory_bytes`` is the server's memory in use (GPU where reported, else CPU).
    ``queries`` holds the value of each PromQL check, by check name.

    ``pending`` (``nv_inference_pending_request_count``, a gauge: requests queued, not those
    executing) and ``inferences`` (``nv_inference_count``, a counter) are summed over the
    versions too; together they tell when a model is idle. ``memory_total_bytes`` is the
    server's memory in all, from the same source as ``memory_bytes`` (GPU where reported,
    else CPU), so that the two make a headroom.
    """

    success: float | None = None
    failure: float | None = None
    duration_us: float | None = None
    memory_bytes: float | None = None
    queries: Mapping[str, float | None] = field(default_factory=dict)
    error: str | None = None  # why the figures could not be read at all
    pending: float | None = None
    inferences: float | None = None
    memory_total_bytes: float | None = None


@dataclass(frozen=True)
class Baseline:
    """What the new versions are compared with, taken as the analysis starts."""

    mean_latency_us: float | None  # the old versions' mean request latency before the swap
    memory_bytes: float | None  # the server's memory with old and new versions loaded
    has_old: bool = True  # False for a first deployment: latency has nothing to compare with


@dataclass(frozen=True)
class CheckResult:
    check: str
    verdict: Verdict
    value: float | None
    threshold: str
    detail: str = ""

    def __str__(self) -> str:
        value = "n/a" if self.value is None else f"{self.value:.6g}"
        text = f"{self.check}={value} ({self.threshold}): {self.verdict}"
        return f"{text}, {self.detail}" if self.detail else text


@dataclass(frozen=True)
class Evaluation:
    index: int
    at: float  # seconds since the analysis started
    results: tuple[CheckResult, ...]
    verdict: Verdict  # after the noTraffic policy: PASS, FAIL, NO_DATA or NO_TRAFFIC (wait)

    @property
    def failed(self) -> tuple[CheckResult, ...]:
        return tuple(r for r in self.results if r.verdict is Verdict.FAIL)
