"""The pre-merge quality gate (issue 18): what a ModelDeployment's ``verify.gate`` bounds,
what one load-test measurement of a version found, and the gate's verdict (values only; the
judging is in ``core/gate.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# The keys of ``spec.verify.gate`` that bound a check: reports point at their lines.
GATE_BOUND_KEYS = (
    "maxLatencyIncrease",
    "maxBetweenResponsesIncrease",
    "minThroughputRatio",
    "maxMemoryIncrease",
    "maxErrorRate",
)


@dataclass(frozen=True)
class GateSpec:
    """``spec.verify.gate``: each bound None when the manifest sets none."""

    # p95 new / old - 1; for a streaming model the p95 of the time to the first response
    max_latency_increase: float | None = None
    # A streaming model's median time between two responses of a stream, new / old - 1
    max_between_responses_increase: float | None = None
    min_throughput_ratio: float | None = None  # throughput new / old
    max_memory_increase: float | None = None  # a share of the old's memory (0.3: 30%)
    max_memory_increase_bytes: int | None = None  # or a size
    max_error_rate: float = 0.0
    concurrency: tuple[int, ...] = (1, 4)
    rounds: int = 5  # twice as many when a check is inconclusive after these (loop/gate.py)
    requests: int = 500


@dataclass(frozen=True)
class LoadFigures:
    """One measurement of one version at one concurrency level.

    An exchange is one request and what came back: one response, or for a streaming
    (decoupled) model a stream of them ended by Triton's final flag. Its latency is the time
    to its first response (``core/exchange.Reply.first_seconds``), so for a stream the
    percentiles are of the time to the first response and ``throughput`` counts the streams
    completed; ``errors`` counts the streams that failed (an error inside, cut, or no final
    flag by the deadline)."""

    concurrency: int
    requests: int
    errors: int
    throughput: float  # answered requests (completed streams) per second
    p50_ms: float
    p95_ms: float
    p99_ms: float
    memory_bytes: float | None = None  # what the version holds (None: not measured)
    # (percentile, milliseconds) pairs of the latency distribution, for the chart: every
    # percentile from the built-in generator, p50/p90/p95/p99 from perf_analyzer.
    quantiles: tuple[tuple[float, float], ...] = ()
    note: str = ""  # what the generator said when the measurement stopped early
    streamed: bool = False  # the exchanges were streams (a decoupled model)
    # Streams only (None otherwise, or not measured): the median time between two responses
    # of a stream, every gap of every completed stream pooled; responses per second.
    gap_ms: float | None = None
    responses_per_second: float | None = None

    @property
    def success_rate(self) -> float | None:
        """The share of the exchanges (streams) that completed; None: none were sent."""
        return (self.requests - self.errors) / self.requests if self.requests else None


class GateVerdict(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    NO_DATA = "no-data"  # a bound the manifest sets that could not be measured: fails
    UNBOUNDED = "unbounded"  # a figure the manifest sets no bound on: reported only
    # The median round is beyond the bound, but the rounds disagree too much to say so:
    # neither a pass nor a failure; measure again (more rounds, a quieter machine).
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class GateCheck:
    """One bound judged at one concurrency level, on the median of the interleaved rounds,
    with the spread (min..max) of the ratio over the rounds and the interval the median lies
    in (at 90%, from the rounds themselves: ``core/gate.py``), which decides between a
    failure and an inconclusive check."""

    name: str  # latency | between-responses | throughput | memory | errors
    concurrency: int
    old: float | None
    new: float | None
    value: float | None  # the ratio or share judged
    threshold: str
    verdict: GateVerdict
    spread: tuple[float, float] | None = None
    interval: tuple[float, float] | None = None
    rounds: int = 0  # how many rounds the value is the median of

    def __str__(self) -> str:
        value = "n/a" if self.value is None else f"{self.value:.4g}"
        text = f"{self.name}@{self.concurrency}={value} ({self.threshold}): {self.verdict}"
        if self.spread is not None:
            text += f", rounds {self.spread[0]:.4g}..{self.spread[1]:.4g}"
        return text


@dataclass(frozen=True)
class GateFinding:
    """A check of the gate that is not a load-test bound: the interface rules, the verify
    step (smoke cases, shadow replay, a synthesized request), the load itself; or a note."""

    name: str  # interface | verify | load | note
    verdict: GateVerdict
    message: str
    line: int  # the manifest line it points at


@dataclass(frozen=True)
class LoadTestSpec:
    """How one measurement is made: the load generator, which requests, how many, how hard."""

    generator: str  # built-in | perf_analyzer | aiperf
    requests_from: str  # smoke cases | shadow requests | synthesized from the metadata


@dataclass(frozen=True)
class ModelGate:
    """The gate's verdict on one new version of one ModelDeployment, with every figure."""

    deployment: str
    model: str
    file: str  # the manifest the deployment is in
    new_version: int | None  # None: nothing new to measure (config-only or refused early)
    old_version: int | None  # None: a first deployment (nothing to compare with)
    findings: tuple[GateFinding, ...] = ()
    checks: tuple[GateCheck, ...] = ()
    old_figures: tuple[LoadFigures, ...] = ()  # round by round, level by level
    new_figures: tuple[LoadFigures, ...] = ()
    load_test: LoadTestSpec | None = None
    seconds: float = 0.0
    lines: tuple[tuple[str, int], ...] = ()  # check name -> manifest line, for annotations

    @property
    def verdict(self) -> GateVerdict:
        """Fail when any finding or check fails or could not be measured (a bound the
        manifest declares that the gate cannot judge is not a pass); else inconclusive when
        a check is; else pass."""
        verdicts = [f.verdict for f in self.findings] + [c.verdict for c in self.checks]
        if any(v in (GateVerdict.FAIL, GateVerdict.NO_DATA) for v in verdicts):
            return GateVerdict.FAIL
        if GateVerdict.INCONCLUSIVE in verdicts:
            return GateVerdict.INCONCLUSIVE
        return GateVerdict.PASS

    def line(self, check: str) -> int:
        return dict(self.lines).get(check, 0)


@dataclass(frozen=True)
class GateReport:
    """One ``gate`` run: every deployment judged, between two revisions."""

    base: str
    head: str
    models: tuple[ModelGate, ...] = ()

    @property
    def passed(self) -> bool:
        return all(m.verdict is GateVerdict.PASS for m in self.models)

    @property
    def verdict(self) -> GateVerdict:
        """The run's: fail when any deployment failed, else inconclusive when any was,
        else pass."""
        verdicts = {m.verdict for m in self.models}
        for worst in (GateVerdict.FAIL, GateVerdict.INCONCLUSIVE):
            if worst in verdicts:
                return worst
        return GateVerdict.PASS
