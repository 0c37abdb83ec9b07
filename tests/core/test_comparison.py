"""Comparing two versions' answers against the serving version's own noise
(core/comparison.py): tolerances per output, top-k, exact types, the verdict net of noise,
latency quantiles."""

from __future__ import annotations

import random

import numpy as np

from reconciler.core.comparison import ROLES, disagreement, interleaved, judged
from reconciler.model.shadow import Comparison, Tolerance, quantile


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
    assert judged(Comparison(100, 32, 30), 0.99) is not None


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
