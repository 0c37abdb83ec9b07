"""The service's backoff of failing servers (service/backoff.py), on an injected clock."""

from __future__ import annotations

import random

from reconciler.service.backoff import BACKOFF, ServerBackoff, backoff_delay


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_delays_grow_to_the_last_step_and_stay_in_its_upper_half() -> None:
    rng = random.Random(7)
    for failures, base in [(0, 1.0), (1, 1.0), (2, 2.0), (9, 300.0), (50, 300.0)]:
        delay = backoff_delay(failures, rng)
        assert base / 2 <= delay <= base
    assert BACKOFF[-1] == 300.0


def test_a_failing_server_is_skipped_until_its_next_try() -> None:
    clock = Clock()
    backoff = ServerBackoff(random.Random(1), clock)
    delay = backoff.server_failed("edge-a")
    assert 0.5 <= delay <= 1.0
    assert list(backoff.skip_list()) == ["edge-a"]
    assert backoff.skip_list()["edge-a"].startswith("backing off after 1 failed pass(es)")
    clock.now += delay
    assert backoff.skip_list() == {}
    assert backoff.retrying("edge-a")  # due again, but no pass has reached it yet
    second = backoff.server_failed("edge-a")
    assert 1.0 <= second <= 2.0
    assert backoff.failed_passes("edge-a") == 2 and backoff.failed_passes("edge-b") == 0
    backoff.server_answered("edge-a")
    assert backoff.skip_list() == {} and not backoff.retrying("edge-a")
    assert backoff.failed_passes("edge-a") == 0


def test_a_server_answering_the_watch_keeps_its_failure_count() -> None:
    backoff = ServerBackoff(random.Random(1), Clock())
    backoff.server_failed("edge-a")
    backoff.server_failed("edge-a")
    backoff.stop_waiting("edge-a")
    assert not backoff.retrying("edge-a") and backoff.skip_list() == {}
    assert 2.0 <= backoff.server_failed("edge-a") <= 4.0  # the third failure
