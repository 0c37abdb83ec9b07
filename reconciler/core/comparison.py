"""Comparing two versions' answers to the same requests (issue 31), against the noise the
serving version makes by itself. Pure: numpy arrays in, verdicts out; no I/O, no clock.

The design is Twitter's Diffy (primary, secondary, candidate: the secondary is the serving
version asked again, so the primary-secondary disagreement measures the noise every answer
carries, nondeterministic GPU kernels among it) with GitHub Scientist's mechanics (the calls
of one request in random order, so that neither side is always asked first and meets a warm
cache) and NVIDIA Polygraphy's tensor tolerances (per-output absolute and relative
tolerance). Per output: floating-point values agree within ``atol + rtol * |primary|``
(numpy's isclose rule), integers, booleans and strings exactly, and an output declared a
classification (``top_k``) agrees when its k highest-scoring classes are the same set. The
verdict is the candidate's disagreement rate minus the noise rate, against a budget; latency
is compared on quantiles (p50, p95, p99) of the calls, interleaved as they were made.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from reconciler.model.shadow import Comparison, Tolerance

Answer = Mapping[str, npt.NDArray[np.generic]]
T = TypeVar("T")

# Who is asked for each request: the serving version twice, the new version once.
ROLES = ("primary", "secondary", "candidate")


def interleaved(
    order: random.Random, ask: Callable[[str], T], clock: Callable[[], float]
) -> tuple[dict[str, T], dict[str, float]]:
    """Ask each of ROLES once, one call after another, in an order ``order`` shuffles anew
    for each request; every role's answer and the seconds its call took (by ``clock``).
    Used by the recorded replay and the live comparator alike."""
    roles = list(ROLES)
    order.shuffle(roles)
    answers: dict[str, T] = {}
    seconds: dict[str, float] = {}
    for role in roles:
        started = clock()
        answers[role] = ask(role)
        seconds[role] = clock() - started
    return answers, seconds


def disagreement(primary: Answer, other: Answer, tolerance: Tolerance) -> str | None:
    """Why ``other`` does not agree with ``primary`` (the first output that differs, and
    how), or None when every output agrees."""
    missing = sorted(set(primary) - set(other))
    if missing:
        return f"output {', '.join(missing)} missing"
    for name in sorted(primary):
        why = _output_differs(name, primary[name], other[name], tolerance)
        if why is not None:
            return why
    return None


def _output_differs(
    name: str, want: npt.NDArray[np.generic], got: npt.NDArray[np.generic], tolerance: Tolerance
) -> str | None:
    if want.shape != got.shape:
        return f"output {name}: shape {list(got.shape)} against {list(want.shape)}"
    k = tolerance.top_k.get(name)
    if k is not None and np.issubdtype(want.dtype, np.number) and want.size:
        ranked_want = np.argsort(-want.reshape(-1, want.shape[-1]), axis=-1)[..., :k]
        ranked_got = np.argsort(-got.reshape(-1, got.shape[-1]), axis=-1)[..., :k]
        for row, (a, b) in enumerate(zip(ranked_want, ranked_got, strict=True)):
            if set(a.tolist()) != set(b.tolist()):
                top, against = sorted(b.tolist()), sorted(a.tolist())
                return f"output {name}: top {k} classes {top} against {against} (row {row})"
        return None
    if np.issubdtype(want.dtype, np.floating) or np.issubdtype(got.dtype, np.floating):
        a, b = want.astype(np.float64), got.astype(np.float64)
        close = np.isclose(b, a, rtol=tolerance.rtol, atol=tolerance.atol, equal_nan=True)
        if bool(np.all(close)):
            return None
        worst = int(np.argmax(np.abs(b - a) - (tolerance.atol + tolerance.rtol * np.abs(a))))
        flat_a, flat_b = a.reshape(-1), b.reshape(-1)
        return (
            f"output {name}: {int(close.size - close.sum())} of {close.size} value(s) beyond "
            f"atol {tolerance.atol:g} + rtol {tolerance.rtol:g}, e.g. {flat_b[worst]:.6g} "
            f"against {flat_a[worst]:.6g}"
        )
    if want.tolist() != got.tolist():
        return f"output {name}: differs (compared exactly: {want.dtype})"
    return None


def judged(
    comparison: Comparison,
    min_agreement: float,
    max_latency_increase: float | None = None,
    latency_quantile: str = "p95",
) -> str | None:
    """Why the candidate fails the comparison, or None when it passes: its disagreement
    rate beyond the noise rate must stay within ``1 - min_agreement``; its latency at
    ``latency_quantile`` within ``max_latency_increase`` of the primary's (None: not
    judged)."""
    excess = comparison.candidate_rate - comparison.noise_rate
    budget = 1.0 - min_agreement
    if excess > budget + 1e-12:
        first = comparison.first_candidate
        return (
            f"disagrees on {comparison.candidate_rate:.1%} of {comparison.requests} "
            f"request(s), the serving version with itself on {comparison.noise_rate:.1%}: "
            f"{excess:.1%} beyond the noise, at most {budget:.1%} allowed; first: {first}"
        )
    if max_latency_increase is None:
        return None
    old, new = comparison.latency()[latency_quantile]
    if old is None or new is None or old <= 0:
        return None
    increase = new / old - 1
    if increase > max_latency_increase:
        return (
            f"{latency_quantile} latency {new * 1000:.2f} ms against {old * 1000:.2f} ms "
            f"({increase:+.0%}, at most +{max_latency_increase:.0%}), calls interleaved"
        )
    return None
