"""apply: executing plans against the fake, with time injected so nothing really sleeps."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from reconciler.core.plan.planner import plan
from reconciler.core.records import alerts_from, holds_from
from reconciler.engine.apply import apply
from reconciler.engine.change import ANSWER_AGAIN_WITHIN
from reconciler.engine.context import Timing
from reconciler.loop.records import expected_serving
from reconciler.model.errors import LoadFailed
from reconciler.model.history import History
from reconciler.model.plan import Action, Plan
from reconciler.model.results import ApplyResult, ChangeResult, FailureKind, Outcome
from reconciler.model.serving import ModelState, VersionState
from reconciler.model.spec import DesiredState, Expectation, SmokeCase, Tensor
from tests.core.fakes import (
    FakeClock,
    FakeTriton,
    StuckUnloading,
    deploy,
    desired_state,
    observe,
)


def times(factor: float) -> SmokeCase:
    """Passes only on a version that multiplies by ``factor`` (the fake's version number)."""
    return SmokeCase(
        f"times-{factor:g}",
        (Tensor("INPUT0", "FP32", (2,), (1.0, -3.0)),),
        (Expectation("OUTPUT0", (1.0 * factor, -3.0 * factor)),),
    )


def plan_for(
    desired: DesiredState, fakes: Mapping[str, FakeTriton], **observe_options: bool
) -> Plan:
    serving = {name: observe(fake, **observe_options) for name, fake in fakes.items()}
    return plan(desired, serving, History(), "rev-1")


def run(p: Plan, fakes: Mapping[str, FakeTriton], clock: FakeClock, **timing: float) -> ApplyResult:
    return apply(p, fakes, timing=Timing(clock=clock.clock, sleep=clock.sleep, **timing))


def serving(versions: list[int], **options: Any) -> FakeTriton:
    fake = FakeTriton("s1", {"m": range(1, 7)}, **options)
    if versions:
        fake.serve("m", versions)
    return fake


def only(result: ApplyResult) -> ChangeResult:
    (change,) = result.changes
    return change


def test_verify_polls_a_loading_version_until_ready() -> None:
    fake = serving([1], loading_polls={("m", 2): 3})
    clock = FakeClock()
    p = plan_for(desired_state(deploy("m", [2], smoke=[times(2)])), {"s1": fake})

    result = run(p, {"s1": fake}, clock, poll_interval=0.25)

    change = only(result)
    assert change.outcome is Outcome.CONVERGED and result.ok
    assert clock.sleeps == [0.25, 0.25, 0.25]
    verify = change.steps[1]
    assert verify.step.action is Action.VERIFY
    assert verify.seconds == pytest.approx(0.75)  # measured on the injected clock
    assert fake.ready("m") == {2}


def test_verify_times_out_on_the_injected_clock_and_reverts() -> None:
    fake = serving([1], loading_polls={("m", 2): None})  # 2 never leaves LOADING
    clock = FakeClock()
    desired = desired_state(deploy("m", [2], verify_timeout=5.0))
    p = plan_for(desired, {"s1": fake})

    result = run(p, {"s1": fake}, clock, poll_interval=0.5)

    change = only(result)
    assert change.outcome is Outcome.REVERTED and not result.ok
    assert change.error == "timed out after 5s"
    assert [(r.step.action, r.ok) for r in change.steps] == [
        (Action.LOAD, True),
        (Action.VERIFY, False),
    ]
    assert change.steps[1].seconds == pytest.approx(5.0)
    assert set(clock.sleeps) == {0.5}
    assert clock.elapsed == pytest.approx(5.0)  # the whole timeout, and no more
    assert [(r.step.action, r.ok) for r in change.revert] == [
        (Action.LOAD, True),
        (Action.VERIFY, True),
    ]
    assert fake.ready("m") == {1}
    assert all(fake.history("m")[1:])
    state = fake.model_state("m")
    assert state.reason(2) == "UNAVAILABLE: unloaded"  # the revert dropped the loading one


def test_a_version_that_will_not_come_fails_verify_at_once() -> None:
    # The repository cannot be read, so the planner cannot know 3 is missing; Triton
    # silently loads nothing for it.
    fake = FakeTriton("s1", {"m": [1, 2]})
    fake.serve("m", [1])
    clock = FakeClock()
    p = plan_for(desired_state(deploy("m", [3])), {"s1": fake}, readable_repository=False)
    assert p.changes and not p.problems

    change = only(run(p, {"s1": fake}, clock))

    assert change.outcome is Outcome.REVERTED
    assert change.error == "version 3 is not READY (not loaded)"
    assert clock.sleeps == []
    assert fake.ready("m") == {1}


def test_a_failed_smoke_case_reverts_to_the_old_version() -> None:
    fake = serving([1], wrong_answers={("m", 2)})
    p = plan_for(desired_state(deploy("m", [2], smoke=[times(2)])), {"s1": fake})

    change = only(run(p, {"s1": fake}, FakeClock()))

    assert change.outcome is Outcome.REVERTED
    assert change.error is not None
    assert change.error.startswith("smoke times-2 on version 2: output OUTPUT0[")
    assert fake.ready("m") == {1}
    assert "infer m 2" in fake.calls


def test_a_refused_load_reverts_and_keeps_tritons_message() -> None:
    fake = serving([1, 2], failing={("m", 3)})
    p = plan_for(desired_state(deploy("m", [3])), {"s1": fake})

    change = only(run(p, {"s1": fake}, FakeClock()))

    assert change.outcome is Outcome.REVERTED
    assert change.error == "server s1: failed to load 'm' version 3: initialize failed"
    assert [r.step.action for r in change.steps] == [Action.LOAD]
    assert fake.ready("m") == {1, 2}
    assert all(fake.history("m")[1:])


def test_a_failed_first_deploy_reverts_to_nothing() -> None:
    fake = serving([], wrong_answers={("m", 1)})
    p = plan_for(desired_state(deploy("m", [1], smoke=[times(1)])), {"s1": fake})

    change = only(run(p, {"s1": fake}, FakeClock()))

    assert change.outcome is Outcome.REVERTED
    assert [r.step.action for r in change.revert] == [Action.UNLOAD]
    assert fake.ready("m") == frozenset()
    assert "unload m" in fake.calls


def test_an_unload_that_never_finishes_fails_after_unload_wait_without_revert() -> None:
    fake = StuckUnloading("s1", {"m": range(1, 7)})
    fake.serve("m", [1])
    clock = FakeClock()
    p = plan_for(desired_state(deploy("m", [2])), {"s1": fake})

    change = only(run(p, {"s1": fake}, clock, poll_interval=1.0, unload_wait=3.0))

    # The new version is verified and serving: nothing to put back; the next pass retries.
    assert change.outcome is Outcome.FAILED
    assert change.revert == ()
    assert change.steps[-1].step.action is Action.UNLOAD
    assert change.error == "timed out after 3s"
    assert clock.elapsed == pytest.approx(3.0)
    assert fake.ready("m") == {2}


class RevertRefused(FakeTriton):
    """Refuses every load after the first."""

    def load(self, model: str, config: Mapping[str, Any]) -> None:
        if "load m" in self.calls:
            self.calls.append(f"load {model}")
            raise LoadFailed("server s1: out of memory")
        super().load(model, config)


def test_a_revert_that_fails_is_failed_not_reverted() -> None:
    fake = RevertRefused("s1", {"m": range(1, 7)}, wrong_answers={("m", 2)})
    fake.serve("m", [1])
    p = plan_for(desired_state(deploy("m", [2], smoke=[times(2)])), {"s1": fake})

    change = only(run(p, {"s1": fake}, FakeClock()))

    assert change.outcome is Outcome.FAILED
    assert [(r.step.action, r.ok) for r in change.revert] == [(Action.LOAD, False)]
    assert change.revert[0].error == "server s1: out of memory"
    assert change.error is not None and change.error.startswith("smoke times-2")


def test_an_unreachable_server_skips_its_other_changes_and_others_carry_on() -> None:
    s1 = FakeTriton("s1", {"a": [1, 2], "b": [1, 2]})
    s2 = FakeTriton("s2", {"a": [1, 2], "b": [1, 2]})
    desired = desired_state(
        deploy("a", [1], servers=["s1", "s2"]),
        deploy("b", [2], servers=["s1", "s2"]),
        servers=["s1", "s2"],
    )
    fakes = {"s1": s1, "s2": s2}
    p = plan_for(desired, fakes)
    s1.unreachable = True  # goes away between observe and apply

    result = run(p, fakes, FakeClock())

    outcomes = {(c.change.server, c.change.model): c.outcome for c in result.changes}
    assert outcomes == {
        ("s1", "a"): Outcome.FAILED,
        ("s1", "b"): Outcome.SKIPPED,
        ("s2", "a"): Outcome.CONVERGED,
        ("s2", "b"): Outcome.CONVERGED,
    }
    failed = result.changes[0]
    assert failed.steps[0].unreachable and failed.revert == ()
    assert s1.calls == ["load a"]  # nothing more was tried there
    assert (s2.ready("a"), s2.ready("b")) == ({1}, {2})


def test_each_servers_changes_run_in_plan_order() -> None:
    fake = FakeTriton("s1", {"a": [1], "b": [1], "c": [1]})
    desired = desired_state(deploy("c", [1]), deploy("a", [1]), deploy("b", [1]))
    p = plan_for(desired, {"s1": fake})

    result = run(p, {"s1": fake}, FakeClock())

    assert [c.change.model for c in result.changes] == ["a", "b", "c"]
    assert [c for c in fake.calls if c.startswith("load")] == ["load a", "load b", "load c"]


def test_an_empty_plan_does_nothing() -> None:
    fake = serving([1])
    result = run(Plan("rev-1"), {"s1": fake}, FakeClock())
    assert result.changes == () and result.ok and result.revision == "rev-1"
    assert fake.calls == []


def test_a_smoke_case_that_cannot_be_compared_reverts() -> None:
    fake = serving([1])
    text = SmokeCase(
        "text", (Tensor("INPUT0", "FP32", (1,), (1.0,)),), (Expectation("OUTPUT0", ("abc",)),)
    )
    p = plan_for(desired_state(deploy("m", [2], smoke=[text])), {"s1": fake})

    change = only(run(p, {"s1": fake}, FakeClock()))

    assert change.outcome is Outcome.REVERTED
    assert fake.ready("m") == {1}


class MeddledBeforeVerify(FakeTriton):
    """Serves ``m`` 1. Once, between the pass's forward load and its verify, something else
    happens to the server (``meddle``): the verify's first call (``model_state``) returns
    what ``meddle`` returns."""

    def __init__(self) -> None:
        super().__init__("s1", {"m": range(1, 7)})
        self.serve("m", [1])
        self._due = False

    def load(self, model: str, config: Mapping[str, Any]) -> None:
        super().load(model, config)
        self._due = self.calls.count(f"load {model}") == 1  # the forward load, not the revert's

    def model_state(self, model: str) -> ModelState:
        if self._due:
            self._due = False
            return self.meddle(model)
        return super().model_state(model)

    def meddle(self, model: str) -> ModelState:
        raise NotImplementedError


class TouchedBetweenLoadAndVerify(MeddledBeforeVerify):
    """Another caller leaves every version of ``m`` ``state`` with ``reason``, as a hand
    unload leaves them (UNLOADING while its requests finish, then UNAVAILABLE "unloaded"),
    or as a version that failed would be."""

    def __init__(self, state: str, reason: str) -> None:
        super().__init__()
        self.touch = VersionState(0, state, reason)

    def meddle(self, model: str) -> ModelState:
        versions = self._models[model].versions
        for v in versions:
            versions[v] = replace(self.touch, version=v)
        return super().model_state(model)


@pytest.mark.parametrize(
    ("state", "reason", "kind"),
    [
        ("UNLOADING", "", FailureKind.UNLOADED_MEANWHILE),
        ("UNAVAILABLE", "unloaded", FailureKind.UNLOADED_MEANWHILE),
        # Not an unload: a version that failed says why, and counts against the versions.
        ("UNAVAILABLE", "stub process exited", FailureKind.AGAINST_VERSIONS),
    ],
)
def test_a_version_unloaded_by_another_caller_during_its_verify_is_put_back_not_held(
    state: str, reason: str, kind: FailureKind
) -> None:
    # Seen on a CI run: a hand unload between the load and the verify held the spec with a
    # critical alert, and the model stayed unloaded until someone released it.
    fake = TouchedBetweenLoadAndVerify(state, reason)
    desired = desired_state(deploy("m", [2]))
    p = plan_for(desired, {"s1": fake})

    result = run(p, {"s1": fake}, FakeClock())

    change = only(result)
    taken = kind is FailureKind.UNLOADED_MEANWHILE
    assert (change.outcome, change.failure) == (Outcome.REVERTED, kind), change.error
    assert fake.ready("m") == {1}  # put back either way
    assert change.error is not None and change.error.startswith("version 2 is not READY")
    assert ("was unloaded meanwhile" in change.error) is taken, change.error
    assert (holds_from(result, desired, History()) == ()) is taken
    (alert,) = alerts_from(result, "hold")
    assert alert.severity == ("warning" if taken else "critical"), alert
    # Expected as planned: the service's watch finds it not serving and passes again at once.
    expected = expected_serving(desired, p, result).get("s1", {})
    assert expected.get("m") == ((2,) if taken else None), expected


class DropsTheVerifysFirstCall(MeddledBeforeVerify):
    """A connection that drops on the verify's first call; the server keeps what it loaded.
    The next ``down_for`` calls fail too (a gRPC channel reconnecting after its backoff),
    then it answers again; ``None``: it stays unreachable."""

    def __init__(self, down_for: int | None) -> None:
        super().__init__()
        self.down_for = down_for
        self._failing: float = 0

    def meddle(self, model: str) -> ModelState:
        self.unreachable = True
        self._failing = math.inf if self.down_for is None else self.down_for
        return super().model_state(model)  # the verify's call: raises

    def model_state(self, model: str) -> ModelState:
        if self.unreachable and not self._due:
            if self._failing == 0:
                self.unreachable = False
            else:
                self._failing -= 1
        return super().model_state(model)


@pytest.mark.parametrize("down_for", [0, 3, None], ids=["answers-at-once", "after-3", "gone"])
def test_a_verify_that_lost_the_server_puts_back_once_it_answers_again(
    down_for: int | None,
) -> None:
    fake = DropsTheVerifysFirstCall(down_for)
    desired = desired_state(deploy("m", [2]))
    p = plan_for(desired, {"s1": fake})
    clock = FakeClock()

    result = run(p, {"s1": fake}, clock)

    change = only(result)
    assert change.failure is FailureKind.SERVER_LOST, change.error
    assert holds_from(result, desired, History()) == ()  # transient either way
    (alert,) = alerts_from(result, "hold")
    assert alert.severity == "warning", alert
    if down_for is None:
        # Nothing can be put back; the next pass verifies 2 first (test_loop.py). It was
        # asked for ANSWER_AGAIN_WITHIN, a quarter second apart.
        assert (change.outcome, change.revert) == (Outcome.FAILED, ())
        assert clock.now - clock.start == pytest.approx(ANSWER_AGAIN_WITHIN), clock.sleeps
        fake.unreachable = False
        assert fake.ready("m") == {1, 2}
    else:
        # Answers again: 2 is not left to serve unverified until the next pass.
        assert change.outcome is Outcome.REVERTED, change.error
        assert fake.ready("m") == {1}
        assert alert.summary.endswith("; 1 serves again"), alert.summary
