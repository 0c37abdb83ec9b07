"""Comparing two versions' answers against the serving version's own noise
(core/comparison.py): tolerances per output, top-k, exact types, the verdict net of noise,
latency quantiles."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from reconciler.core.comparison import (
    ROLES,
    beyond_noise,
    compared,
    deviation,
    deviations_of,
    disagreement,
    discounted,
    divergences,
    first_divergence,
    interleaved,
    judged,
    noise_margin,
    unjudgeable,
)
from reconciler.core.shadow import shadow_checks
from reconciler.model.analysis import Verdict
from reconciler.model.shadow import Comparison, LiveShadow, ShadowFigures, Tolerance, quantile


def answer(values: list[float], dtype: str = "float32") -> dict[str, np.ndarray]:
    return {"OUTPUT0": np.array([values], dtype=dtype)}


def test_floats_agree_within_absolute_and_relative_tolerance_and_say_how_they_differ() -> None:
    old = answer([100.0, 1.0])
    assert disagreement(old, answer([100.0, 1.0]), Tolerance()) is None
    # GPU-kernel noise: 1e-5 relative. Exact comparison fails it; a relative bound does not.
    noisy = answer([100.001, 1.00001])
    assert disagreement(old, noisy, Tolerance()) is not None
    assert disagreement(old, noisy, Tolerance(rtol=1e-4)) is None
    # 5% off on one value: beyond 1e-4 relative, and said with the values.
    wrong = disagreement(old, answer([105.0, 1.0]), Tolerance(rtol=1e-4))
    assert wrong == (
        "output OUTPUT0: 1 of 2 value(s) beyond atol 0 + rtol 0.0001, e.g. 105 against 100"
    )
    assert disagreement(old, answer([100.0, 1.2]), Tolerance(atol=0.25)) is None


def test_integers_and_strings_are_exact_and_shapes_and_outputs_must_match() -> None:
    ints = {"LABEL": np.array([3, 7], dtype=np.int64)}
    assert disagreement(ints, {"LABEL": np.array([3, 7])}, Tolerance(atol=10)) is None
    assert disagreement(ints, {"LABEL": np.array([3, 8])}, Tolerance(atol=10)) == (
        "output LABEL: differs (compared exactly: int64)"
    )
    words = {"TEXT": np.array([b"cat"], dtype=np.object_)}
    assert disagreement(words, {"TEXT": np.array([b"dog"], dtype=np.object_)}, Tolerance())
    assert disagreement(ints, {}, Tolerance()) == "output LABEL missing"
    assert disagreement(ints, {"LABEL": np.array([[3, 7]])}, Tolerance()) == (
        "output LABEL: shape [1, 2] against [2]"
    )


def test_a_classification_output_agrees_on_its_top_k_classes_whatever_the_scores() -> None:
    old = {"PROBS": np.array([[0.1, 0.6, 0.05, 0.25]], dtype=np.float32)}
    reordered = {"PROBS": np.array([[0.1, 0.3, 0.05, 0.55]], dtype=np.float32)}
    top2 = Tolerance(top_k={"PROBS": 2})
    assert disagreement(old, reordered, top2) is None  # {1, 3} both times
    other = {"PROBS": np.array([[0.5, 0.3, 0.05, 0.15]], dtype=np.float32)}
    assert disagreement(old, other, top2) == (
        "output PROBS: top 2 classes [0, 1] against [1, 3] (row 0)"
    )


def test_the_verdict_is_the_disagreement_beyond_the_noise() -> None:
    # 2 requests of 100 answered 5% off: caught with a 99% agreement budget.
    caught = Comparison(100, 2, 0, "output OUTPUT0: ...")
    assert judged(caught, 0.99) == (
        "disagrees on 2.0% of 100 request(s), the serving version with itself on 0.0%: "
        "2.0% beyond the noise, at most 1.0% allowed; first: output OUTPUT0: ..."
    )
    # A nondeterministic model: the serving version disagrees with itself as often as the
    # candidate disagrees with it: nothing beyond the noise.
    noisy = Comparison(100, 30, 30)
    assert judged(noisy, 0.99) is None
    assert judged(Comparison(100, 31, 30), 0.99) is None  # 1% allowed
    # Two noisy counts differ by chance: 30 of 100 itself allows 1% plus 2.326 * sqrt(60)
    # / 100 = 18.0% beyond it (one-sided 99%).
    assert judged(Comparison(100, 48, 30), 0.99) is None
    beyond = judged(Comparison(100, 50, 30), 0.99)
    assert beyond is not None and "at most 1.0% (+18.0% the noise's chance) allowed" in beyond, (
        beyond
    )
    # The chance shrinks with the count compared: at 2,000 the same rates fail.
    assert judged(Comparison(2000, 960, 600), 0.99) is not None
    assert noise_margin(0, 500) == 0.0  # a deterministic model: the budget alone
    # A 3% class flipper against a serving version whose noise flipped one near tie, as a
    # clean-clone CI run measured it: 6 of 273 against 1 is within the chance (excess 1.8%,
    # allowed 1% + 1.2%); at 1,000 compared requests (30 flips against 4) it is far beyond.
    assert not beyond_noise(6, 1, 273, 0.99)
    assert beyond_noise(30 + 4, 4, 1000, 0.99)
    # One input in 10 flipped is beyond it from 200 compared requests on.
    assert beyond_noise(20 + 1, 1, 200, 0.99)


def test_latency_is_judged_on_the_p95_of_interleaved_calls() -> None:
    primary = tuple([0.010] * 95 + [0.050] * 5)
    slower = tuple([0.020] * 95 + [0.100] * 5)
    comparison = Comparison(100, 0, 0, "", primary, slower)
    assert comparison.latency()["p50"] == (0.010, 0.020)
    assert comparison.latency()["p99"] == (0.050, 0.100)
    assert judged(comparison, 1.0, max_latency_increase=0.5) == (
        "p95 latency 20.00 ms against 10.00 ms (+100%, at most +50%), calls interleaved"
    )
    assert judged(comparison, 1.0, max_latency_increase=1.5) is None
    assert judged(comparison, 1.0) is None  # not judged without a bound
    assert quantile([], 0.5) is None and quantile([3.0, 1.0, 2.0], 0.5) == 2.0


def test_each_role_is_asked_once_per_request_in_an_order_shuffled_anew_and_timed() -> None:
    """What the replay and the live comparator share: no role is always asked first (a warm
    cache would favour it), and each call's seconds are its own."""
    order = random.Random(7)
    now = [0.0]
    firsts = []
    for _ in range(60):
        asked: list[str] = []

        def ask(role: str, asked: list[str] = asked) -> str:
            asked.append(role)
            now[0] += {"primary": 1.0, "secondary": 2.0, "candidate": 4.0}[role]
            return f"{role} answer"

        answers, seconds = interleaved(order, ask, lambda: now[0])
        assert sorted(asked) == sorted(ROLES)
        assert answers == {role: f"{role} answer" for role in ROLES}
        assert seconds == {"primary": 1.0, "secondary": 2.0, "candidate": 4.0}
        firsts.append(asked[0])
    assert set(firsts) == set(ROLES), firsts


# -- the noise discount (issue 41, point 1) ------------------------------------------------


RTOL = Tolerance(rtol=1e-4)  # the README example's relativeTolerance


def _noisy_requests(
    n: int,
    noise: float,
    *,
    flip_every: int = 0,
    candidate_noise: float | None = None,
    seed: int = 1,
    tolerance: Tolerance = RTOL,
) -> Comparison:
    """``n`` requests to an echo-like scorer (four scores, the first the top class) whose
    every score is off by a relative ``noise`` drawn anew per call, as nondeterministic
    kernels are; the candidate's noise is ``candidate_noise`` (default: the same), and it
    swaps the two highest scores (flips the top class) on every ``flip_every``-th input."""
    draw = np.random.default_rng(seed)

    def called(scores: np.ndarray, level: float) -> dict[str, np.ndarray]:
        jitter = 1 + draw.uniform(-level, level, scores.shape)
        return {"SCORES": (scores * jitter).astype(np.float32)}

    pairs = []
    for i in range(n):
        scores = draw.random((1, 4)).astype(np.float32)
        scores[0][0] = 1.0
        answers = {role: called(scores, noise) for role in ("primary", "secondary")}
        answers["candidate"] = called(scores, noise if candidate_noise is None else candidate_noise)
        if flip_every and i % flip_every == 0:
            flipped = answers["candidate"]["SCORES"].copy()
            top, second = np.argsort(-flipped[0])[:2]
            flipped[0][[top, second]] = flipped[0][[second, top]]
            answers["candidate"] = {"SCORES": flipped}
        pairs.append(deviations_of(answers, tolerance))
    return compared(pairs)


def test_a_saturated_noise_floor_no_longer_passes_a_candidate_that_flips_classes() -> None:
    """The measured case: relative noise 1e-3 per score against rtol 1e-4, the serving
    version disagrees with itself on every request, and a candidate that also flips the top
    class on 3% of inputs passed (203 of 203 against 203: nothing beyond the noise)."""
    bad = _noisy_requests(203, 1e-3, flip_every=33)
    assert bad.candidate_count == bad.noise_count == 203  # the rule that passed it
    why = judged(bad, 0.99, tolerance=Tolerance(rtol=1e-4))
    assert why is not None and "beyond the noise" in why, why
    assert "serving version's own differences discounted: SCORES differing beyond" in why, why
    assert "first: output SCORES:" in why and "the serving version's own differences up to" in why


def test_a_candidate_as_noisy_as_the_serving_version_passes_and_a_saturated_one_is_unjudged() -> (
    None
):
    rtol = Tolerance(rtol=1e-4)
    # Noise beyond the tolerance on some requests, not all: learned, discounted, passed.
    partly = _noisy_requests(400, 6e-5)
    assert 0.1 < partly.noise_rate < 0.9, partly.noise_rate
    assert judged(partly, 0.99, tolerance=rtol) is None
    assert unjudgeable(partly, rtol) is None
    # The same good candidate where the serving version disagrees with itself on every
    # request: no pass, and the reason says what to change.
    saturated = _noisy_requests(203, 1e-3)
    assert judged(saturated, 0.99, tolerance=rtol) is None
    assert unjudgeable(saturated, rtol) == (
        "the serving version disagrees with itself on 100% of 203 request(s) at atol 0 + rtol "
        "0.0001 (output SCORES): no room to judge at that tolerance; raise "
        "compare.relativeTolerance or compare.tolerance above its noise, or compare the "
        "classes (compare.topK)"
    )
    # Compared by classes, the same noise leaves room: the good candidate passes, the one
    # that flips 3% of classes fails.
    top1 = Tolerance(rtol=1e-4, top_k={"SCORES": 1})
    by_class = _noisy_requests(203, 1e-3, tolerance=top1)
    assert judged(by_class, 0.99, tolerance=top1) is None
    assert unjudgeable(by_class, top1) is None
    flips = _noisy_requests(203, 1e-3, flip_every=33, tolerance=top1)
    why = judged(flips, 0.99, tolerance=top1)
    assert why is not None and "top 1 classes" in why, why


def test_a_candidate_noisier_than_the_serving_version_fails() -> None:
    """Differing more: ten times the serving version's noise is beyond twice its p99."""
    louder = _noisy_requests(300, 6e-5, candidate_noise=6e-4)
    why = judged(louder, 0.99, tolerance=Tolerance(rtol=1e-4))
    assert why is not None and "beyond the noise" in why, why


def test_a_deterministic_model_is_judged_exactly_as_before() -> None:
    """No noise beyond the tolerance: nothing is learned, the counts are the verdict."""
    exact = _noisy_requests(200, 0.0, flip_every=50)
    assert exact.noise_count == 0 and exact.candidate_count == 4
    net = discounted(exact, Tolerance(rtol=1e-4))
    assert (net.candidate_count, net.noise_count, dict(net.learned)) == (4, 0, {})
    assert judged(exact, 0.99, tolerance=Tolerance(rtol=1e-4)) == judged(
        Comparison(200, 4, 0, exact.first_candidate), 0.99
    )
    assert unjudgeable(exact, Tolerance(rtol=1e-4)) is None


def test_deviation_measures_in_tolerances_and_marks_exact_differences_infinite() -> None:
    rtol = Tolerance(rtol=1e-2)
    old = {"OUT": np.array([[100.0, 1.0]], dtype=np.float32), "LABEL": np.array([3])}
    near = {"OUT": np.array([[100.5, 1.0]], dtype=np.float32), "LABEL": np.array([3])}
    assert deviation(old, near, rtol).size == {"OUT": pytest.approx(0.5), "LABEL": 0.0}
    far = {"OUT": np.array([[1.0, 100.0]], dtype=np.float32), "LABEL": np.array([4])}
    moved = deviation(old, far, rtol)
    assert moved.size["LABEL"] == math.inf and moved.reordered == {"OUT"}
    assert moved.why.startswith("output LABEL: differs")
    nan = {"OUT": np.array([[np.nan, 1.0]], dtype=np.float32), "LABEL": np.array([3])}
    assert deviation(old, nan, rtol).size["OUT"] == math.inf
    assert deviation(nan, nan, Tolerance()).size["OUT"] == 0.0
    assert deviation(old, {"LABEL": np.array([3])}, rtol).size["OUT"] == math.inf


# -- generated sequences (a stream reassembled, one token a response) ---------------------------


def test_the_first_divergence_of_two_generated_sequences() -> None:
    tokens = np.arange(30, dtype=np.int32)
    changed = tokens.copy()
    changed[20:] += 500
    exact = Tolerance()
    assert first_divergence(tokens, tokens, exact) is None
    assert first_divergence(tokens, changed, exact) == 20
    assert first_divergence(tokens, tokens[:25], exact) == 25  # a prefix: cut short
    assert first_divergence(tokens[:25], tokens, exact) == 25  # a longer generation
    floats = np.linspace(0.0, 1.0, 10)
    assert first_divergence(floats, floats + 1e-9, Tolerance(1e-6)) is None
    assert first_divergence(floats, floats + np.r_[np.zeros(4), np.ones(6)], Tolerance(1e-6)) == 4


def test_a_generation_that_diverges_on_two_percent_of_prompts_fails_and_says_where() -> None:
    exact = Tolerance()
    tokens = np.arange(30, dtype=np.int32)
    changed = tokens.copy()
    changed[20:] += 500
    pairs = []
    for n in range(200):
        candidate = changed if n % 50 == 0 else tokens
        answers = {
            "primary": {"T": tokens},
            "secondary": {"T": tokens},
            "candidate": {"T": candidate},
        }
        pairs.append(deviations_of(answers, exact))
    comparison = compared(pairs, streamed=True)
    why = judged(comparison, 0.99, tolerance=exact)
    assert why is not None and "disagrees on 2.0% of 200" in why, why
    assert "first divergence: the candidate from position 20 (median 20) on 4" in why, why
    unary = judged(compared(pairs), 0.99, tolerance=exact)
    assert unary is not None and "first divergence" not in unary, unary
    assert divergences(comparison) == (
        "first divergence: the candidate from position 20 (median 20) on 4"
    ), divergences(comparison)


def test_a_live_shadow_check_of_streams_shows_where_generations_diverged_while_it_passes() -> None:
    exact = Tolerance()
    tokens = np.arange(30, dtype=np.int32)
    noisy = tokens.copy()
    noisy[25] += 1
    pairs = [
        deviations_of(
            {"primary": {"T": tokens}, "secondary": {"T": noisy if n == 7 else tokens},
             "candidate": {"T": noisy if n == 3 else tokens}},
            exact,
        )
        for n in range(100)
    ]  # fmt: skip
    figures = ShadowFigures(received=100, comparison=compared(pairs, streamed=True))
    (answers,) = shadow_checks(LiveShadow(share=10_000, min_requests=100), figures)
    assert answers.verdict is Verdict.PASS, answers
    assert (
        "first divergence: the candidate from position 25 (median 25) on 1; the serving "
        "version itself from position 25 (median 25) on 1" in answers.detail
    ), answers.detail
