"""Live shadow traffic, compared (issue 31): what a ModelDeployment declares
(``rollout.traffic.shadow``), what the comparator is asked to compare in one rollout phase
(a ``ShadowTarget``, planned by ``core/plan/traffic.py``) and what it reports
(``ShadowFigures``, cumulative since the phase began). Values only: the comparison itself is
``core/comparison.py``, the judging ``core/shadow.py``, the comparator that the router
mirrors to ``adapters/comparator.py``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum


@dataclass(frozen=True)
class Tolerance:
    """How close two answers must be (``compare``: tolerance, relativeTolerance, topK)."""

    atol: float = 0.0
    rtol: float = 0.0
    top_k: Mapping[str, int] = field(default_factory=dict)  # classification outputs: k


def quantile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (nearest rank) of ``values``; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


QUANTILES = (0.5, 0.95, 0.99)


@dataclass(frozen=True)
class Deviation:
    """How far one answer lies from the primary's, output by output (``core/comparison.py``
    measures it). ``size``: the largest difference of an output's values in units of the
    declared tolerance, ``atol + rtol * |primary|`` (above 1: beyond it; infinite: compared
    exactly and different, or a shape or the output missing); ``reordered``: the outputs
    whose top classes changed (the top-k set where ``topK`` declares k, else the
    highest-scoring class of each row); ``unanswered``: no answer to compare (an error, a
    timeout); ``why``: the first difference beyond the declared tolerance, in values."""

    size: Mapping[str, float] = field(default_factory=dict)
    reordered: frozenset[str] = frozenset()
    unanswered: bool = False
    why: str = ""
    # Per output that differs: the first position along its first axis where it does (a
    # generated sequence's first divergence: the stream reassembled, one token a response);
    # the shorter length where one is a prefix of the other.
    diverged_at: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Comparison:
    """One candidate version's comparison with the serving version over the same requests:
    how many requests the candidate and the serving version asked again (the noise)
    disagreed on at the declared tolerance, the first reason of the candidate's, the seconds
    each call of primary and candidate took, interleaved as they were made, and how far
    each answer lay from the primary's."""

    requests: int
    candidate_count: int  # requests the candidate disagreed on
    noise_count: int  # requests the serving version disagreed with itself on
    first_candidate: str = ""
    primary_seconds: tuple[float, ...] = field(default=(), repr=False)
    candidate_seconds: tuple[float, ...] = field(default=(), repr=False)
    # Per compared request (the latest ones, where the comparator caps them): how far the
    # serving version asked again, and the candidate, lay from the primary's answer. What the
    # noise discount learns from (core/comparison.py); without them the counts are judged.
    deviations: tuple[tuple[Deviation, Deviation], ...] = field(default=(), repr=False)
    # The answers were streams reassembled (a streaming model's generations): where they
    # first diverged is reported.
    streamed: bool = False

    @property
    def candidate_rate(self) -> float:
        return self.candidate_count / self.requests if self.requests else 0.0

    @property
    def noise_rate(self) -> float:
        return self.noise_count / self.requests if self.requests else 0.0

    def latency(self) -> dict[str, tuple[float | None, float | None]]:
        """Per quantile (p50, p95, p99): the primary's and the candidate's seconds."""
        return {
            f"p{round(q * 100)}": (
                quantile(self.primary_seconds, q),
                quantile(self.candidate_seconds, q),
            )
            for q in QUANTILES
        }


class WhenShort(StrEnum):
    WAIT = "wait"  # up to maxWait past the duration, then inconclusive
    FAIL = "fail"


class Uncomparable(StrEnum):
    SKIP = "skip"  # the request is left out of the comparison (counted, shown)
    DISAGREE = "disagree"  # counted as a disagreement of the candidate


@dataclass(frozen=True)
class LiveShadow:
    """``rollout.traffic.shadow``: how much live traffic the router mirrors to the
    comparator, how close the answers must be, and how hard the comparator may press the
    servers. Defaults are the schema's."""

    share: int  # out of WEIGHT_SCALE
    tolerance: Tolerance = field(default_factory=Tolerance)
    min_agreement: float = 0.99
    max_latency_increase: float | None = None
    latency_quantile: str = "p99"
    min_requests: int = 100
    rate: float = 20.0  # comparisons per second, at most
    max_share: float = 0.05  # of one server's time
    timeout: float = 2.0
    when_short: WhenShort = WhenShort.WAIT
    max_wait: float = 300.0
    uncomparable: Uncomparable = Uncomparable.SKIP
    allow_side_effects: bool = False
    # A sequence model's whole sequences are compared (sampled at their start, every
    # request then, each side in a sequence of its own); else a sequence is never shadowed.
    whole_sequences: bool = False


@dataclass(frozen=True)
class ShadowTarget:
    """One comparison as a traffic phase asks for it: the mirrored requests for ``model``
    go to the serving version (primary and secondary) and to the candidate version on the
    new pool's servers, each call pinned by version."""

    deployment: str
    model: str
    primary: tuple[str, ...]  # gRPC addresses (host:port) the serving version is asked at
    primary_version: int
    candidate: tuple[str, ...]  # of the new pool's
    candidate_version: int
    spec: LiveShadow
    primary_pool: str = ""  # the pool of ``primary`` (the new one, when it holds both)
    # The same servers' HTTP endpoints (host:port, "" where a server declares none), in the
    # same order: where the SSE ``generate_stream`` copies are asked.
    primary_http: tuple[str, ...] = ()
    candidate_http: tuple[str, ...] = ()


@dataclass(frozen=True)
class ShadowFigures:
    """What the comparator did with the mirrored requests of one target, since it began.

    ``received``: requests the router mirrored for the target's model; of those,
    ``not_sampled`` were left out by the rate and the time share, ``dropped`` found the
    comparator's queue full, ``unparsable`` were no inference request, ``sequence`` belong to
    a sequence (never shadowed), ``primary_failed`` were not answered by the serving version
    (nothing to compare with), ``uncomparable`` had an answer the comparator cannot compare
    (and ``uncomparable`` says skip), ``no_http`` were SSE copies with no HTTP endpoint to
    ask them at. The rest were compared: ``comparison``. Reasons keep
    the first few of each kind (GitHub Scientist's capped samples)."""

    received: int = 0
    not_sampled: int = 0
    dropped: int = 0
    unparsable: int = 0
    sequence: int = 0
    other_model: int = 0  # mirrored requests for other models of the route
    primary_failed: int = 0
    uncomparable: int = 0
    candidate_timeouts: int = 0
    # SSE copies (HTTP generate_stream) not asked: a server of the target declares no HTTP
    # endpoint (TritonServer spec.http) to ask them at.
    no_http: int = 0
    comparison: Comparison = field(default_factory=lambda: Comparison(0, 0, 0))
    samples: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # kind -> reasons

    @property
    def compared(self) -> int:
        return self.comparison.requests

    def counts(self) -> dict[str, int]:
        """Every count by outcome, as ``/metrics`` and the report show them."""
        return {
            "compared": self.compared,
            "candidate_disagreed": self.comparison.candidate_count,
            "noise": self.comparison.noise_count,
            "not_sampled": self.not_sampled,
            "dropped": self.dropped,
            "unparsable": self.unparsable,
            "sequence": self.sequence,
            "primary_failed": self.primary_failed,
            "uncomparable": self.uncomparable,
            "candidate_timeouts": self.candidate_timeouts,
            "no_http": self.no_http,
        }

    def __str__(self) -> str:
        parts = [f"{self.compared} of {self.received} mirrored request(s) compared"]
        left = {
            "not sampled": self.not_sampled,
            "dropped (queue full)": self.dropped,
            "unparsable": self.unparsable,
            "in a sequence": self.sequence,
            "unanswered by the serving version": self.primary_failed,
            "uncomparable": self.uncomparable,
            "SSE copies with no HTTP endpoint to ask (TritonServer spec.http)": self.no_http,
        }
        parts += [f"{n} {what}" for what, n in left.items() if n]
        if self.candidate_timeouts:
            parts.append(f"{self.candidate_timeouts} candidate call(s) timed out")
        for kind in ("uncomparable", "unparsable", "primary_failed", "no_http"):
            if self.samples.get(kind):
                parts.append(f"first {kind.replace('_', ' ')}: {self.samples[kind][0]}")
        return "; ".join(parts)
