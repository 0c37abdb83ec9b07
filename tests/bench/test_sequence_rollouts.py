"""bench/sequence_rollouts.py's judgement of the share of new sequences at a canary weight:
periods strictly between 0 and 100%, counted from a settling moment after the change, held to
max(3 standard errors, 2 points) of the weight."""

from __future__ import annotations

from bench.sequence_rollouts import SETTLE, weight_shares
from testkit.sequences import Sequence


def started(at: float, scales: list[int]) -> list[Sequence]:
    return [Sequence(i, 2, at + i * 0.01, scale) for i, scale in enumerate(scales)]


def test_a_share_near_the_weight_passes_and_one_far_from_it_fails() -> None:
    changes = [(0.0, 0), (10.0, 1_000), (20.0, 5_000), (30.0, 10_000)]
    near = started(10.0 + SETTLE, [2] * 10 + [1] * 90)  # 10% at 10%
    far = started(20.0 + SETTLE, [2] * 20 + [1] * 80)  # 20% at 50%
    rest = started(30.0 + SETTLE, [2] * 50)  # 100%: not judged
    before = started(1.0, [1] * 50)  # 0%: not judged
    periods = weight_shares(before + near + far + rest, changes, 2, 0.0, 40.0)
    assert [(p["weight"], p["sequences"], p["share"], p["within"]) for p in periods] == [
        (0.1, 100, 0.1, True),
        (0.5, 100, 0.2, False),
    ], periods
    assert periods[1]["bound"] == 0.15  # 3 x sqrt(0.25 / 100)


def test_sequences_started_while_the_weight_settles_or_too_few_are_not_judged() -> None:
    changes = [(0.0, 1_000), (10.0, 5_000)]
    settling = started(10.0, [1] * 19)  # within SETTLE of the change
    few = started(11.0, [1] * 19)
    assert weight_shares(settling + few, changes, 2, 0.0, 20.0) == []
