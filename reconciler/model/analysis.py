"""What an analysis is asked to check, what it reads and what it
concludes: check definitions, metric figures, evaluations and verdicts (values only; the
judging is in ``core/analysis.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from statistics import median

from reconciler.model.shadow import quantile


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
    # Ended early by an operator's ``promote``: passed without the rest of its duration.
    PROMOTED = "promoted"
    # Stopped by an operator's ``abort`` (held, as after a failed analysis), or by a shutdown
    # (put back, not held): what the rollout record shows as the analysis's verdict.
    ABORTED = "aborted"
    INTERRUPTED = "interrupted"


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
    # latency: the time to the (first) response, or a stream's time between responses.
    of: str = "firstResponse"


@dataclass(frozen=True)
class ProbeSpec:
    """The reconciler's own requests to the new versions during an analysis: how many, how
    fast. Defaults are the schema's (``verify.analysis.probes``)."""

    enabled: bool = True
    rate: float = 20.0  # probes per second, at most
    concurrency: int = 1  # probes in flight at once
    timeout: float = 1.0  # a probe not answered by then failed
    # One probe slot keeps the server busy at most this share of the time: after a probe
    # that took t seconds, the next waits at least t / max_share - t.
    max_share: float = 0.05


@dataclass(frozen=True)
class EarlyAbort:
    """When an analysis fails before its interval is up (``verify.analysis.earlyAbort``)."""

    consecutive_probe_failures: int = 3  # failed probes in a row
    # The success rate since READY is below a successRate check's min with this confidence
    # (the Wilson score bound); 0 turns the rule off.
    confidence: float = 0.999
    every: float = 0.1  # seconds between reads of the counters for it; 0: at evaluations only


@dataclass(frozen=True)
class AnalysisSpec:
    interval: float
    duration: float
    failure_limit: int = 0
    no_traffic: NoTraffic = NoTraffic.WAIT
    checks: tuple[Check, ...] = ()
    inconclusive_limit: int = 0  # evaluations without data tolerated (one more: inconclusive)
    min_evidence: int = 10  # requests or probes seen on the new versions before a pass
    initial_delay: float = 0.0  # evaluations in this time after READY do not count
    probes: ProbeSpec = field(default_factory=ProbeSpec)
    early_abort: EarlyAbort = field(default_factory=EarlyAbort)

    @property
    def needs_prometheus(self) -> bool:
        return any(c.kind == "promql" for c in self.checks)


@dataclass(frozen=True)
class PoolFigures:
    """A router's cumulative statistics for one pool, as its clients saw them: gRPC
    requests answered (``total``), those answered OK, and the summed upstream request time
    (``time_ms`` over ``timed`` requests). None where the router reports none."""

    total: float | None = None
    success: float | None = None
    time_ms: float | None = None
    timed: float | None = None


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
    # Why the figures are not fresh though the source answered: its last scrape of the
    # server failed, and Prometheus hides every series of a server it could not scrape
    # (staleness markers) until a scrape succeeds again.
    scrape_failed: str | None = None
    pending: float | None = None
    inferences: float | None = None
    memory_total_bytes: float | None = None
    # In a traffic rollout: the router's statistics for the new versions' pool, what its
    # clients saw (a gRPC error response included, which Triton's counters miss).
    routed: PoolFigures | None = None
    # True when the memory figures are the host's (``nv_cpu_memory_*``: a server with no GPU
    # figure), which every process on the host moves, not the server's devices'.
    memory_host_wide: bool = False
    # Per GPU device (Triton's label gpu_uuid; a MIG instance is a device of its own): the
    # memory in use and in all. Empty where the server reports no GPU.
    gpu_used: Mapping[str, float] = field(default_factory=dict)
    gpu_total: Mapping[str, float] = field(default_factory=dict)

    def fullest_device(self) -> tuple[str, float] | None:
        """The GPU device with the least memory free, and how much (bytes); None without
        per-device figures. A model whose instances run on every GPU (Triton's default for
        KIND_GPU) needs its room on each: the fullest decides."""
        free = {
            uuid: self.gpu_total[uuid] - used
            for uuid, used in self.gpu_used.items()
            if uuid in self.gpu_total
        }
        if not free:
            return None
        uuid = min(sorted(free), key=lambda u: free[u])
        return uuid, free[uuid]


@dataclass(frozen=True)
class ProbeOutcome:
    """One probe as the analysis counts it: one exchange with a version, a unary call or a
    stream (``core/exchange.py``). ``seconds`` is its latency: a unary call's time, a
    stream's time to its first response. For a stream, ``gap`` is the median time between
    its responses (None with fewer than two), and ``cut`` says it did not end with Triton's
    final flag (none by its deadline, more responses than its cap, the server closing it)
    rather than with an error the version sent."""

    error: str | None  # why it failed; None: it passed
    seconds: float
    streamed: bool = False
    gap: float | None = None
    cut: bool = False


@dataclass(frozen=True)
class ProbeFigures:
    """The reconciler's own probes so far (cumulative), to the new versions and, for a
    baseline, to an old one. ``consecutive`` is the current run of failures on the new
    versions; ``last_error`` says why the last failed probe failed. A streaming model's
    probes are streams: ``cut`` of the failed ones did not end (``ProbeOutcome.cut``), and
    ``gaps`` holds each stream's median time between responses."""

    sent: int = 0
    failed: int = 0
    seconds: float = 0.0  # summed latency of the probes to the new versions
    old_sent: int = 0
    old_failed: int = 0
    old_seconds: float = 0.0
    consecutive: int = 0
    last_error: str | None = None
    skipped: int = 0  # synthesized requests left out: the old version fails them too
    note: str | None = None  # why no probe was sent, when none could be
    # Each probe's seconds in the order sent, to the new versions and to the old: the probes
    # compare new with old by their medians (``core/analysis``).
    latencies: tuple[float, ...] = field(default=(), repr=False)
    old_latencies: tuple[float, ...] = field(default=(), repr=False)
    streamed: bool = False
    cut: int = 0
    old_cut: int = 0
    gaps: tuple[float, ...] = field(default=(), repr=False)
    old_gaps: tuple[float, ...] = field(default=(), repr=False)
    # The old version's probes before the new versions loaded, while it carried the
    # clients' streams (``Step.old_under_load``): each probe's seconds to the first response.
    old_loaded: tuple[float, ...] = field(default=(), repr=False)

    def counted(self, outcome: ProbeOutcome, old: bool) -> ProbeFigures:
        """These figures with one more probe, to an old version or to the new ones."""
        failed = outcome.error is not None
        gap = () if outcome.gap is None else (outcome.gap,)
        if old:
            return replace(
                self,
                old_sent=self.old_sent + 1,
                old_failed=self.old_failed + failed,
                old_seconds=self.old_seconds + outcome.seconds,
                old_latencies=(*self.old_latencies, outcome.seconds),
                old_cut=self.old_cut + outcome.cut,
                old_gaps=(*self.old_gaps, *gap),
                streamed=self.streamed or outcome.streamed,
            )
        return replace(
            self,
            sent=self.sent + 1,
            failed=self.failed + failed,
            seconds=self.seconds + outcome.seconds,
            latencies=(*self.latencies, outcome.seconds),
            consecutive=self.consecutive + 1 if failed else 0,
            last_error=outcome.error if failed else self.last_error,
            cut=self.cut + outcome.cut,
            gaps=(*self.gaps, *gap),
            streamed=self.streamed or outcome.streamed,
        )

    def since(self, before: ProbeFigures) -> ProbeFigures:
        """The probes between ``before`` and these."""
        return replace(
            self,
            sent=self.sent - before.sent,
            failed=self.failed - before.failed,
            seconds=self.seconds - before.seconds,
            old_sent=self.old_sent - before.old_sent,
            old_failed=self.old_failed - before.old_failed,
            old_seconds=self.old_seconds - before.old_seconds,
            latencies=self.latencies[len(before.latencies) :],
            old_latencies=self.old_latencies[len(before.old_latencies) :],
            cut=self.cut - before.cut,
            old_cut=self.old_cut - before.old_cut,
            gaps=self.gaps[len(before.gaps) :],
            old_gaps=self.old_gaps[len(before.old_gaps) :],
        )

    def __str__(self) -> str:
        if self.note and not self.sent:
            return f"probes: none sent ({self.note})"
        what = "probe streams" if self.streamed else "probes"
        text = f"{what}: {self.failed} of {self.sent} failed"
        if self.cut:
            text += f" ({self.cut} cut: no final flag)"
        if self.sent:
            first = " to the first response" if self.streamed else ""
            text += f", mean {self.seconds / self.sent * 1e3:.1f}ms{first}"
        if self.streamed and len(self.latencies) >= 2:
            text += f" (p50 {_ms(self.latencies, 0.5)}, p95 {_ms(self.latencies, 0.95)})"
        if self.gaps:
            gap = median(self.gaps)
            text += f", {gap * 1e3:.1f}ms between responses"
            text += f" ({1 / gap:.0f}/s)" if gap > 0 else ""
        if self.old_sent:
            text += f" (old version {self.old_seconds / self.old_sent * 1e3:.1f}ms"
            text += f", {self.old_failed} of {self.old_sent} failed)"
        if self.skipped:
            text += f"; {self.skipped} synthesized request(s) left out (the old version fails them)"
        if self.failed and self.last_error:
            text += f"; last failure: {self.last_error}"
        return text


def _ms(values: tuple[float, ...], q: float) -> str:
    """The ``q`` quantile (nearest rank) of ``values`` (seconds), in milliseconds."""
    return f"{(quantile(values, q) or 0.0) * 1e3:.1f}ms"


@dataclass(frozen=True)
class Baseline:
    """What the new versions are compared with, taken as the analysis starts."""

    mean_latency_us: float | None  # the old versions' mean request latency before the swap
    memory_bytes: float | None  # the server's memory with old and new versions loaded
    has_old: bool = True  # False for a first deployment: latency has nothing to compare with
    # The old versions' mean latency over the same time as the new ones' (the old pool of a
    # staged or traffic rollout keeps serving beside them): the baseline measured in the same
    # conditions, preferred when it has enough requests. Set at each evaluation; None: none.
    same_time_latency_us: float | None = None


@dataclass(frozen=True)
class CheckResult:
    check: str
    verdict: Verdict
    value: float | None
    threshold: str
    detail: str = ""
    # Skipped only until the probes it is judged by are enough: not a pass, so an analysis
    # that ends with it so runs on, then ends inconclusive (``core.analysis.judge``).
    awaiting: bool = False

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
    probes: ProbeFigures | None = None  # the probes in this evaluation's window
    # Ended the analysis before its interval was up (early abort): fails it whatever the
    # failureLimit.
    aborted: bool = False
    counted: bool = True  # False within initialDelay: shown, not counted

    @property
    def failed(self) -> tuple[CheckResult, ...]:
        return tuple(r for r in self.results if r.verdict is Verdict.FAIL)
