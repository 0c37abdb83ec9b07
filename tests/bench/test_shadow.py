"""bench/shadow.py's arithmetic: the share of windows a rule catches, the binomial figure
beside it, the smallest sample size caught 95% of the time."""

from __future__ import annotations

import math

import pytest

from bench.shadow import binomial_caught, caught_share, smallest


def test_a_window_is_caught_when_its_disagreement_beyond_the_noise_exceeds_the_budget() -> None:
    # One disagreement in every 50: 2%. Windows of 100 hold exactly 2: above 1%, caught.
    outcomes = [(i % 50 == 0, False) for i in range(1000)]
    assert caught_share(outcomes, 100, 0.99) == 1.0
    # ... and not at a 2% budget (2 of 100 is not above 2%).
    assert caught_share(outcomes, 100, 0.98) == 0.0
    # Noise as often as the candidate's disagreements: nothing beyond it.
    noisy = [(i % 50 == 0, i % 50 == 1) for i in range(1000)]
    assert caught_share(noisy, 100, 0.99) == 0.0
    assert math.isnan(caught_share(outcomes[:10], 100, 0.99))


def test_the_binomial_figure_and_the_smallest_size() -> None:
    # P(Bin(100, 0.02) > 1) = 1 - 0.98^100 - 100 * 0.02 * 0.98^99
    expected = 1 - 0.98**100 - 100 * 0.02 * 0.98**99
    assert binomial_caught(0.02, 100, 0.99) == pytest.approx(expected)
    assert binomial_caught(0.0, 500, 0.99) == pytest.approx(0.0)
    assert smallest({100: 0.5, 300: 0.94, 500: 0.96, 800: 0.99}) == 500
    assert smallest({100: 0.5}) is None
