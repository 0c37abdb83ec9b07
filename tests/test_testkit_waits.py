"""The suite's waits say why when they give up: ``testkit.service_process.wait_until`` puts
what its ``explain`` reports of the state into the timeout's message, and an explanation
that fails does not hide the timeout."""

from __future__ import annotations

import pytest

from testkit.service_process import ServiceProcessError, wait_until


def test_a_wait_that_gives_up_carries_the_explanation() -> None:
    with pytest.raises(ServiceProcessError) as failure:
        wait_until(lambda: False, 0.05, "the rollout", poll=0.01, explain=lambda: "step: load")
    assert str(failure.value) == "not within 0.05 s: the rollout\nstep: load"


def test_an_explanation_that_fails_still_reports_the_timeout() -> None:
    def broken() -> str:
        raise OSError("service gone")

    with pytest.raises(ServiceProcessError) as failure:
        wait_until(lambda: False, 0.05, "the rollout", poll=0.01, explain=broken)
    assert str(failure.value) == (
        "not within 0.05 s: the rollout\n(could not explain: OSError('service gone'))"
    )


def test_a_wait_that_holds_does_not_ask_for_an_explanation() -> None:
    asked: list[bool] = []
    wait_until(lambda: True, 0.05, "the rollout", explain=lambda: str(asked.append(True)))
    assert asked == []
