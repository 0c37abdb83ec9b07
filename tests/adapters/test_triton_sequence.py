"""A probe sequence's START waits in the sequence batcher's backlog as a client's does
(``adapters/triton_sequence.start_deadline``); its later requests keep the probe's deadline."""

from __future__ import annotations

from reconciler.adapters.triton_sequence import start_deadline


def test_a_start_may_wait_for_a_slot_as_long_as_the_idle_window() -> None:
    # As Triton's config answer gives it (a uint64 is a JSON string).
    config = {"sequence_batching": {"max_sequence_idle_microseconds": "5000000"}}
    assert start_deadline(config, 1.0) == 6.0
    assert start_deadline({"sequence_batching": {}}, 1.0) == 2.0  # Triton's default: 1 s


def test_no_deadline_stays_none() -> None:
    assert start_deadline({"sequence_batching": {}}, None) is None
