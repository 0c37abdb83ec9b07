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
verdict is the candidate's disagreement rate minus the noise rate, against a budget widened
by the chance of two noisy counts (``NOISE_Z``); latency
is compared on quantiles (p50, p95, p99) of the calls, interleaved as they were made.

A serving version noisier than the declared tolerance disagrees with itself on most
requests, and a rate minus a rate near 100% leaves nothing to judge (issue 41: a candidate
that flipped the top class on 3% of inputs passed at "203 of 203, itself 203"). So, as
Diffy does, the noise is learned per output, from how the serving version differs from
itself: where its differences exceed the declared tolerance on more than 1% of requests,
a difference counts only beyond ``NOISE_MARGIN`` times its own p99 (the size of its
differences), and a changed top class counts on both sides (which elements); the rates are
then compared as before. A candidate that differs more, or differently, fails; one as noisy
as the serving version passes; a deterministic model is judged exactly as before. Where the
serving version disagrees with itself on nearly every request at the declared tolerance,
there is no room left to judge a pass: the comparison fails a candidate that differs beyond
the learned noise, and otherwise says it cannot judge (``unjudgeable``), never passes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from reconciler.model.shadow import Comparison, Deviation, Tolerance, quantile

Answer = Mapping[str, npt.NDArray[np.generic]]
T = TypeVar("T")

# Who is asked for each request: the serving version twice, the new version once.
ROLES = ("primary", "secondary", "candidate")

# The noise discount. The serving version's differences with itself are learned per output
# once they exceed the declared tolerance on more than 1% of requests (their p99 above it);
# a difference then counts beyond NOISE_MARGIN times that p99. Twice the p99: a candidate as
# noisy as the serving version lies beyond it on next to no request (uniform noise never;
# Laplace-tailed noise on about 1 in 10,000), while a wrong answer (a flipped class, a value
# 5% off) lies far beyond it.
NOISE_QUANTILE = 0.99
NOISE_MARGIN = 2.0
# The serving version's disagreements with itself are a count, and so is the candidate's: two
# such counts from one nondeterministic generation differ by chance. A candidate fails only
# when its disagreement exceeds the noise by more than the budget plus NOISE_Z standard
# errors of that chance difference (for two counts each about the noise count k, the
# difference's variance is about 2k): one-sided 99%. A generation that changed one token in
# 10% of streams on both sides disagreed on about 19% a side, and the difference of two such
# rates over 100 streams failed 6 of 20 windows against a 1% budget (bench.stream_shadow). A
# deterministic model (k = 0) is judged exactly as before.
NOISE_Z = 2.326
# At the declared tolerance, a serving version that disagrees with itself on this share of
# requests or more leaves no room to judge a pass.
SATURATED = 0.95


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


def deviations_of(
    answers: Mapping[str, Answer], tolerance: Tolerance
) -> tuple[Deviation, Deviation]:
    """One request's answers by role: how far the secondary and the candidate lie from the
    primary."""
    primary = answers["primary"]
    return (
        deviation(primary, answers["secondary"], tolerance),
        deviation(primary, answers["candidate"], tolerance),
    )


def compared(
    deviations: Sequence[tuple[Deviation, Deviation]],
    primary_seconds: tuple[float, ...] = (),
    candidate_seconds: tuple[float, ...] = (),
    streamed: bool = False,
) -> Comparison:
    """The comparison of the requests whose deviations (the secondary's, the candidate's)
    these are, counted at the declared tolerance; ``streamed``: of streams reassembled."""
    candidate = [theirs for _, theirs in deviations if theirs.why or theirs.unanswered]
    return Comparison(
        len(deviations),
        len(candidate),
        sum(bool(own.why) for own, _ in deviations),
        candidate[0].why if candidate else "",
        primary_seconds,
        candidate_seconds,
        tuple(deviations),
        streamed,
    )


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


def deviation(primary: Answer, other: Answer, tolerance: Tolerance) -> Deviation:
    """How far ``other`` lies from ``primary``, output by output (``model.shadow.Deviation``),
    with ``disagreement``'s reason."""
    sizes: dict[str, float] = {}
    reordered: set[str] = set()
    diverged: dict[str, int] = {}
    for name, want in primary.items():
        got = other.get(name)
        at = None if got is None else first_divergence(want, got, tolerance)
        if at is not None:
            diverged[name] = at
        if got is None or got.shape != want.shape:
            sizes[name] = math.inf
            continue
        k = tolerance.top_k.get(name)
        numeric = bool(want.size) and all(np.issubdtype(a.dtype, np.number) for a in (want, got))
        if numeric and want.ndim and want.shape[-1] > 1 and _top_changed(want, got, k or 1):
            reordered.add(name)
        if k is not None and numeric:
            sizes[name] = 0.0  # a classification output: only its classes count
        elif np.issubdtype(want.dtype, np.floating) or np.issubdtype(got.dtype, np.floating):
            sizes[name] = _size(want, got, tolerance)
        else:
            sizes[name] = 0.0 if want.tolist() == got.tolist() else math.inf
    why = disagreement(primary, other, tolerance) or ""
    return Deviation(sizes, frozenset(reordered), why=why, diverged_at=diverged)


def first_divergence(
    want: npt.NDArray[np.generic], got: npt.NDArray[np.generic], tolerance: Tolerance
) -> int | None:
    """The first position along the first axis where ``got`` differs from ``want`` (floats
    beyond the tolerance, anything else exactly), the shorter length where one is a prefix
    of the other; None where they agree. For a stream reassembled, one token a response,
    the first generated token that differs."""
    a, b = np.atleast_1d(want), np.atleast_1d(got)
    if a.shape[1:] != b.shape[1:]:
        return 0
    common = min(len(a), len(b))
    head_a, head_b = a[:common], b[:common]
    if np.issubdtype(a.dtype, np.floating) or np.issubdtype(b.dtype, np.floating):
        x, y = head_a.astype(np.float64), head_b.astype(np.float64)
        same = np.isclose(y, x, rtol=tolerance.rtol, atol=tolerance.atol, equal_nan=True)
    else:
        same = np.asarray(head_a == head_b)
    rows = same.reshape(common, -1).all(axis=1) if common else np.ones(0, dtype=bool)
    differing = np.flatnonzero(~rows)
    if differing.size:
        return int(differing[0])
    return None if len(a) == len(b) else common


def divergences(comparison: Comparison) -> str:
    """Where the candidate's and the serving version's own answers first diverged from the
    primary's, for a shadow report: the earliest and the median position over the requests
    that diverged (a generated sequence: the first token that differs). Empty where none
    did."""
    sides = []
    for label, index in (("the candidate", 1), ("the serving version itself", 0)):
        firsts = [
            min(pair[index].diverged_at.values())
            for pair in comparison.deviations
            if pair[index].diverged_at
        ]
        if firsts:
            middle = sorted(firsts)[len(firsts) // 2]
            sides.append(f"{label} from position {min(firsts)} (median {middle}) on {len(firsts)}")
    return f"first divergence: {'; '.join(sides)}" if sides else ""


def _top_changed(want: npt.NDArray[np.generic], got: npt.NDArray[np.generic], k: int) -> bool:
    """Whether some row's ``k`` highest-scoring classes are another set."""
    rows_want = want.reshape(-1, want.shape[-1])
    rows_got = got.reshape(-1, got.shape[-1])
    if k == 1:
        return bool(np.any(np.argmax(rows_want, axis=-1) != np.argmax(rows_got, axis=-1)))
    top_want = np.sort(np.argsort(-rows_want, axis=-1)[..., :k], axis=-1)
    top_got = np.sort(np.argsort(-rows_got, axis=-1)[..., :k], axis=-1)
    return bool(np.any(top_want != top_got))


def _size(
    want: npt.NDArray[np.generic], got: npt.NDArray[np.generic], tolerance: Tolerance
) -> float:
    """The largest difference in units of ``atol + rtol * |want|`` (numpy isclose's rule:
    above 1 is beyond it); equal values (NaN with NaN among them) differ by 0, a value
    against NaN, or any difference where the tolerance is 0, infinitely."""
    a, b = want.astype(np.float64), got.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        allowed = tolerance.atol + tolerance.rtol * np.abs(a)
        ratio = np.where(allowed > 0, np.abs(b - a) / np.where(allowed > 0, allowed, 1.0), np.inf)
    ratio = np.where(same, 0.0, np.nan_to_num(ratio, nan=np.inf, posinf=np.inf))
    return float(ratio.max()) if ratio.size else 0.0


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


@dataclass(frozen=True)
class NoiseDiscount:
    """The requests the candidate and the serving version asked again disagreed on once the
    serving version's own noise is discounted, over ``requests``; ``learned``: per output
    whose noise exceeded the declared tolerance, the size (in units of it) beyond which a
    difference counted; ``first``: why the first request the candidate disagreed on does."""

    requests: int
    candidate_count: int
    noise_count: int
    learned: Mapping[str, float]
    first: str = ""

    @property
    def excess(self) -> float:
        return (self.candidate_count - self.noise_count) / self.requests if self.requests else 0.0

    @property
    def chance(self) -> float:
        """How far the excess may lie above zero by the noise alone (``NOISE_Z``)."""
        return noise_margin(self.noise_count, self.requests)

    def __str__(self) -> str:
        floors = ", ".join(
            f"{name} counted by how often it differs"
            if math.isinf(size)
            else f"{name} differing beyond {size:.3g}x the tolerance ({NOISE_MARGIN:g}x its p99)"
            for name, size in sorted(self.learned.items())
        )
        return f"the serving version's own differences discounted: {floors}" if floors else ""


def noise_margin(noise_count: int, requests: int) -> float:
    """The excess disagreement the serving version's own ``noise_count`` disagreements in
    ``requests`` can make by chance (``NOISE_Z`` standard errors); 0 without noise."""
    return NOISE_Z * math.sqrt(2.0 * noise_count) / requests if requests else 0.0


def beyond_noise(
    candidate_count: int, noise_count: int, requests: int, min_agreement: float
) -> bool:
    """The rule: the candidate's disagreements beyond the serving version's own, over
    ``requests``, exceed the budget ``1 - min_agreement`` by more than the noise's chance
    (``noise_margin``)."""
    if not requests:
        return False
    excess = (candidate_count - noise_count) / requests
    return excess > 1.0 - min_agreement + noise_margin(noise_count, requests) + 1e-12


def discounted(comparison: Comparison, tolerance: Tolerance) -> NoiseDiscount:
    """The comparison with the serving version's noise learned and discounted, per output
    (the module's docstring says how). Without per-request deviations, its counts as they
    are."""
    pairs = comparison.deviations
    if not pairs:
        return NoiseDiscount(
            comparison.requests,
            comparison.candidate_count,
            comparison.noise_count,
            {},
            comparison.first_candidate,
        )
    names = sorted({name for pair in pairs for side in pair for name in side.size})
    floors: dict[str, float] = {}
    for name in names:
        sizes = [noise.size.get(name, 0.0) for noise, _ in pairs if not noise.unanswered]
        p99 = quantile(sizes, NOISE_QUANTILE) or 0.0
        floors[name] = 1.0 if p99 <= 1.0 else p99 * NOISE_MARGIN
    # Learned where the noise lifted the floor above the declared tolerance.
    learned = {name: floor for name, floor in floors.items() if floor > 1.0}
    candidate = noise = 0
    first = ""
    for itself, theirs in pairs:
        noise += _beyond(itself, floors, learned, tolerance) is not None
        why = _beyond(theirs, floors, learned, tolerance)
        if why is not None:
            candidate += 1
            first = first or why
    return NoiseDiscount(len(pairs), candidate, noise, learned, first)


def _beyond(
    answer: Deviation,
    floors: Mapping[str, float],
    learned: Mapping[str, float],
    tolerance: Tolerance,
) -> str | None:
    """Why ``answer`` differs beyond the noise: an output's difference beyond its floor
    (infinite floors: an exact output the serving version itself changes often counts only
    when it differs), or its top classes changed (a classification output's always; any
    other's where the noise is learned). None when it does not."""
    if answer.unanswered:
        return answer.why or "no answer"
    for name, size in sorted(answer.size.items()):
        floor = floors.get(name, 1.0)
        if size > floor or (math.isinf(floor) and math.isinf(size)):
            if name not in learned or math.isinf(floor):
                return answer.why or f"output {name} differs"
            return (
                f"output {name}: {size:.3g}x the tolerance, the serving version's own "
                f"differences up to {floor / NOISE_MARGIN:.3g}x (p99); {answer.why}"
            )
    for name in sorted(answer.reordered):
        if name in tolerance.top_k or name in learned:
            return answer.why if name in tolerance.top_k else f"output {name}: top class changed"
    return None


def unjudgeable(comparison: Comparison, tolerance: Tolerance) -> str | None:
    """Why the answers cannot be judged a pass: the serving version disagrees with itself on
    at least SATURATED of the requests at the declared tolerance, so any candidate would
    look as good as it (a candidate that differs beyond the learned noise still fails:
    ``judged`` says so first). None when there is room to judge."""
    if not comparison.requests:
        return None
    worst, share = "", comparison.noise_rate
    pairs = [noise for noise, _ in comparison.deviations if not noise.unanswered]
    if pairs:
        names = sorted({name for noise in pairs for name in noise.size})
        shares = {
            name: sum(
                noise.size.get(name, 0.0) > 1.0
                or (name in tolerance.top_k and name in noise.reordered)
                for noise in pairs
            )
            / len(pairs)
            for name in names
        }
        worst, share = max(shares.items(), key=lambda item: item[1], default=("", 0.0))
    if share < SATURATED:
        return None
    where = f" (output {worst})" if worst else ""
    hint = (
        "raise compare.relativeTolerance or compare.tolerance above its noise, or compare "
        "the classes (compare.topK)"
    )
    return (
        f"the serving version disagrees with itself on {share:.0%} of "
        f"{len(pairs) or comparison.requests} request(s) at atol {tolerance.atol:g} + rtol "
        f"{tolerance.rtol:g}{where}: no room to judge at that tolerance; {hint}"
    )


def judged(
    comparison: Comparison,
    min_agreement: float,
    max_latency_increase: float | None = None,
    latency_quantile: str = "p95",
    tolerance: Tolerance | None = None,
) -> str | None:
    """Why the candidate fails the comparison, or None when it does not fail: its
    disagreement rate beyond the noise rate (``discounted`` by what the serving version's
    own differences teach, with ``tolerance`` the declared one) must stay within
    ``1 - min_agreement``; its latency at ``latency_quantile`` within
    ``max_latency_increase`` of the primary's (None: not judged). Not failing is not
    passing: see ``unjudgeable``. Of streams reassembled (``Comparison.streamed``), the
    reason says where the generated sequences first diverged."""
    net = discounted(comparison, tolerance or Tolerance())
    budget = 1.0 - min_agreement
    if beyond_noise(net.candidate_count, net.noise_count, net.requests, min_agreement):
        learned = f" ({net})" if net.learned else ""
        where = divergences(comparison) if comparison.streamed else ""
        chance = f" (+{net.chance:.1%} the noise's chance)" if net.chance else ""
        return (
            f"disagrees on {net.candidate_count / net.requests:.1%} of {net.requests} "
            f"request(s), the serving version with itself on {net.noise_count / net.requests:.1%}"
            f"{learned}: {net.excess:.1%} beyond the noise, at most {budget:.1%}{chance} "
            f"allowed; first: {net.first}{f'; {where}' if where else ''}"
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
