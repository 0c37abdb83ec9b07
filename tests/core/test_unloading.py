"""Versions stuck UNLOADING past a deadline (core/unloading.py)."""

from __future__ import annotations

from reconciler.core.unloading import Unloads, after_reading

A1 = ("edge-a", "echo", 4)
B2 = ("edge-b", "ranker", 2)


def test_a_version_unloading_past_the_deadline_is_stuck_once_and_ends_when_gone() -> None:
    record, stuck, gone = after_reading(Unloads({}), [A1, B2], 0.0, 60.0)
    assert (stuck, gone) == (frozenset(), frozenset())
    record, stuck, gone = after_reading(record, [A1, B2], 59.0, 60.0)
    assert stuck == frozenset()
    record, stuck, gone = after_reading(record, [A1], 60.0, 60.0)  # B2 unloaded in time
    assert (stuck, gone) == (frozenset({A1}), frozenset())
    record, stuck, gone = after_reading(record, [A1], 120.0, 60.0)
    assert (stuck, gone) == (frozenset(), frozenset())  # told once
    record, stuck, gone = after_reading(record, [], 130.0, 60.0)
    assert (stuck, gone, record) == (frozenset(), frozenset({A1}), Unloads({}))


def test_a_version_that_left_unloading_starts_again_from_zero() -> None:
    record, _, _ = after_reading(Unloads({}), [A1], 0.0, 60.0)
    record, _, _ = after_reading(record, [], 30.0, 60.0)
    record, stuck, _ = after_reading(record, [A1], 40.0, 60.0)
    record, stuck, _ = after_reading(record, [A1], 80.0, 60.0)
    assert stuck == frozenset()  # 40 s, not 80
    assert record.since == {A1: 40.0}
