"""The quality gate's judgement: interleaved load-test measurements of the old and the new
versions in, one check per bound and concurrency level out. Pure: no Triton, no clock.

Each round measures the old version, then the new, at every level (interleaved, so that a
noisy moment of a shared machine falls on both). A check is judged on the median over the
rounds of the per-round ratio (new against the old of the same round), and reports the
spread of that ratio: a reviewer sees whether a verdict stands on a stable difference.

A single round's p95 swings by 30-50% on a busy machine, either way, so the median alone
fails identical code now and then. A latency or throughput check therefore fails only when
the rounds agree on it: when the interval the median lies in, read from the rounds
themselves (the sign test's, distribution-free: the k-th lowest and k-th highest ratio,
covering the median with at least 90% confidence; the lowest and highest with fewer than
eight rounds), lies wholly beyond the bound. A median beyond the bound whose interval reaches back
inside is INCONCLUSIVE: the rounds disagree by more than the difference judged, which says
"noisy, measure again", not "the new version is worse". A median within the bound passes,
however noisy (nothing says the new version is worse). Errors and memory are judged on their
medians as they are: a failed request is no noise, and a version's memory does not swing.

A streaming (decoupled) model's measurements are judged by the same checks, not by checks of
their own: an exchange's latency is the time to its first response (a stream's whole length
measures the generation, not the version), its throughput the streams completed per second,
its errors the streams that failed. The median time between a stream's responses is one
more ratio check (``between-responses``), under the same round rule, and so is the median
time to the first response (``latency-p50``, under ``maxLatencyIncrease`` as the p95 is): a
round's p95 of a few dozen streams over HTTP swung from 1.11 to 1.71 for one version 1.5x
slower and read 0.54 on identical code on a shared machine, while its p50 kept within a few
percent (bench.gate_streams, AIPerf); a version slower on every stream moves both, and
the rule fails it when either's rounds agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from math import comb
from statistics import median

from reconciler.model.gate import GateCheck, GateSpec, GateVerdict, LoadFigures


def _known(value: float | None) -> bool:
    """A figure that was measured: a load generator that measured nothing gives NaN."""
    return value is not None and math.isfinite(value)


def _ratios(pairs: Sequence[tuple[float | None, float | None]]) -> list[float]:
    return [
        new / old
        for old, new in pairs
        if old is not None and new is not None and _known(old) and _known(new) and old > 0
    ]


Pair = tuple[float | None, float | None]  # one round's figure: old, new

COVERAGE = 0.9  # of the interval the median lies in (two-sided: a failure is 95% sure)


def _coverage(rounds: int, k: int) -> float:
    """How sure the k-th lowest and k-th highest of ``rounds`` values are to enclose their
    median: every value falls either side of it with even odds (the sign test)."""
    outside = sum(comb(rounds, i) for i in range(k))
    return 1.0 - 2.0 * outside / 2.0**rounds


def median_interval(values: Sequence[float]) -> tuple[float, float]:
    """Where the median of what ``values`` sample lies: the k-th lowest and the k-th highest
    value, k the largest that still covers it with ``COVERAGE``; the lowest and the highest
    when there are too few values for that (fewer than eight: with five, they cover it with
    94%, with three with 75%)."""
    ordered = sorted(values)
    count, k = len(ordered), 1
    while 2 * (k + 1) <= count and _coverage(count, k + 1) >= COVERAGE:
        k += 1
    return ordered[k - 1], ordered[count - k]


def _check(
    name: str,
    level: int,
    pairs: Sequence[tuple[float | None, float | None]],
    threshold: str,
    passes: float,
    *,
    at_most: bool,
    shift: float = 0.0,
) -> GateCheck:
    """A ratio check: ``value`` is the median per-round ratio new/old minus ``shift``; it
    must be at most (or at least) ``passes``. Beyond it, a failure when the interval the
    median lies in is beyond it too, else inconclusive."""
    ratios = [r - shift for r in _ratios(pairs)]
    olds = [o for o, _ in pairs if o is not None and _known(o)]
    news = [n for _, n in pairs if n is not None and _known(n)]
    old = median(olds) if olds else None
    new = median(news) if news else None
    if not ratios:
        return GateCheck(name, level, old, new, None, threshold, GateVerdict.NO_DATA)
    value = median(ratios)
    low, high = median_interval(ratios)

    def within(x: float) -> bool:
        return x <= passes if at_most else x >= passes

    if within(value):
        verdict = GateVerdict.PASS
    elif not within(low if at_most else high):
        verdict = GateVerdict.FAIL  # even the rounds most in its favour are beyond the bound
    else:
        verdict = GateVerdict.INCONCLUSIVE
    return GateCheck(
        name, level, old, new, value, threshold, verdict, (min(ratios), max(ratios)),
        (low, high), len(ratios),
    )  # fmt: skip


def judge(
    spec: GateSpec, old: Sequence[LoadFigures], new: Sequence[LoadFigures]
) -> tuple[GateCheck, ...]:
    """Every bound the spec sets, at every concurrency level measured (a figure with no
    bound is reported as unbounded): ``old`` and ``new`` are the rounds' measurements, in
    the same order (round by round, level by level). A streaming model's figures go the
    same way: its latency is the time to the first response; the time between responses is
    one more ratio check, judged by the same rule, where it was measured or is bounded."""
    checks: list[GateCheck] = []
    streamed = any(f.streamed for f in (*old, *new))
    p95 = "p95 to the first response" if streamed else "p95"
    for level in sorted({f.concurrency for f in old} | {f.concurrency for f in new}):
        rounds = [
            (o, n)
            for o, n in zip(old, new, strict=True)
            if o.concurrency == level and n.concurrency == level
        ]
        checks.append(_errors(spec, level, [o for o, _ in rounds], [n for _, n in rounds]))
        ratios: list[tuple[str, list[Pair], float | None, str, bool]] = [
            ("latency", [(o.p95_ms, n.p95_ms) for o, n in rounds], spec.max_latency_increase,
             f"{p95} increase <= ", True),
            ("latency-p50", [(o.p50_ms, n.p50_ms) for o, n in rounds],
             spec.max_latency_increase, "p50 to the first response increase <= ", True),
            ("between-responses", [(o.gap_ms, n.gap_ms) for o, n in rounds],
             spec.max_between_responses_increase, "median increase <= ", True),
            ("throughput", [(o.throughput, n.throughput) for o, n in rounds],
             spec.min_throughput_ratio, "ratio >= ", False),
        ]  # fmt: skip
        for name, pairs, bound, words, increase in ratios:
            if name == "between-responses" and not streamed and bound is None:
                continue  # a unary model has no time between responses to report
            if name == "latency-p50" and not streamed:
                continue  # a unary model's latency is judged on its p95, as ever
            unbounded = bound is None
            limit = (math.inf if increase else -math.inf) if bound is None else bound
            checks.append(
                _unbounded(
                    _check(
                        name,
                        level,
                        pairs,
                        "no bound" if unbounded else f"{words}{limit:g}",
                        limit,
                        at_most=increase,
                        shift=1.0 if increase else 0.0,
                    ),
                    unbounded,
                )
            )
    bounded = spec.max_memory_increase is not None or spec.max_memory_increase_bytes is not None
    checks.append(_unbounded(_memory(spec, old, new), not bounded))
    return tuple(checks)


def _unbounded(check: GateCheck, unbounded: bool) -> GateCheck:
    """A figure the manifest sets no bound on: reported, never judged."""
    if not unbounded:
        return check
    return replace(check, verdict=GateVerdict.UNBOUNDED, threshold="no bound")


def _memory(spec: GateSpec, old: Sequence[LoadFigures], new: Sequence[LoadFigures]) -> GateCheck:
    """What loading the new versions added against what the old added: as a share of the
    old's (``maxMemoryIncrease: 30%``) or in bytes."""
    olds = [f.memory_bytes for f in old if f.memory_bytes is not None]
    news = [f.memory_bytes for f in new if f.memory_bytes is not None]
    if not olds or not news:
        threshold = "memory"
        return GateCheck("memory", 0, None, None, None, threshold, GateVerdict.NO_DATA)
    before, after = median(olds), median(news)
    if spec.max_memory_increase_bytes is not None:
        growth = after - before
        limit = spec.max_memory_increase_bytes
        ok = growth <= limit
        return GateCheck(
            "memory", 0, before, after, growth, f"increase <= {limit} bytes",
            GateVerdict.PASS if ok else GateVerdict.FAIL,
        )  # fmt: skip
    bound = spec.max_memory_increase if spec.max_memory_increase is not None else math.inf
    if before <= 0:
        return GateCheck("memory", 0, before, after, None, "memory", GateVerdict.NO_DATA)
    share = after / before - 1.0
    ok = share <= bound
    return GateCheck(
        "memory", 0, before, after, share, f"increase <= {bound:.0%}",
        GateVerdict.PASS if ok else GateVerdict.FAIL,
    )  # fmt: skip


def _errors(
    spec: GateSpec, level: int, old: Sequence[LoadFigures], new: Sequence[LoadFigures]
) -> GateCheck:
    """The new version's error rate at one level (the median over the rounds) against
    ``maxErrorRate``; the old's rate is shown beside it (None: nothing to compare with)."""
    rates = [f.errors / f.requests for f in new if f.requests]
    before = [f.errors / f.requests for f in old if f.requests]
    rate = median(rates) if rates else None
    verdict = (
        GateVerdict.NO_DATA
        if rate is None
        else GateVerdict.PASS
        if rate <= spec.max_error_rate
        else GateVerdict.FAIL
    )
    return GateCheck(
        "errors", level, median(before) if before else None, rate, rate,
        f"<= {spec.max_error_rate:g}", verdict, (min(rates), max(rates)) if rates else None,
    )  # fmt: skip


def judge_alone(spec: GateSpec, new: Sequence[LoadFigures]) -> tuple[GateCheck, ...]:
    """A first deployment (no old version to compare with): only the error bound."""
    levels = sorted({f.concurrency for f in new})
    return tuple(_errors(spec, n, (), [f for f in new if f.concurrency == n]) for n in levels)
