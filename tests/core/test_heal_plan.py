"""The reload in place of versions that stopped answering (core/plan/heal.py), planned from
what the service's probes found (``ModelState.stopped_answering``) and run on the in-memory
Triton fake: the same versions, a config one reload marker higher, nothing put back."""

from __future__ import annotations

from dataclasses import replace

from reconciler.core.plan.planner import plan
from reconciler.core.records import alerts_from, holds_from
from reconciler.core.triton_config import HEAL_MARKER, heal_generation, without_heal_marker
from reconciler.engine.apply import apply
from reconciler.engine.context import Timing
from reconciler.model.history import History
from reconciler.model.plan import Action, OnFailure
from reconciler.model.results import Outcome
from reconciler.model.serving import ServerState
from reconciler.model.spec import DesiredState, RolloutSpec
from tests.core.fakes import FakeClock, FakeTriton, deploy, desired_state, observe

DEAD = "Stub process 'm_0_0' is not healthy."


def stopped(state: ServerState, versions: dict[int, str]) -> ServerState:
    model = state.model("m")
    return replace(state, models={**state.models, "m": replace(model, stopped_answering=versions)})


def serving_m(versions: list[int]) -> tuple[FakeTriton, DesiredState]:
    fake = FakeTriton("s1", {"m": range(1, 4)})
    desired = desired_state(deploy("m", versions, config={"max_batch_size": 8}))
    first = plan(desired, {"s1": observe(fake)}, History(), "rev-1")
    clock = FakeClock()
    assert apply(first, {"s1": fake}, timing=Timing(clock=clock.clock, sleep=clock.sleep)).ok
    return fake, desired


def test_versions_that_stopped_answering_are_reloaded_in_place_with_the_marker_raised() -> None:
    fake, desired = serving_m([1, 2])
    healthy = plan(desired, {"s1": observe(fake)}, History(), "rev-1")
    assert not healthy.has_changes

    marked = stopped(observe(fake), {2: DEAD})
    p = plan(desired, {"s1": marked}, History(), "rev-1")
    (change,) = p.changes
    assert (change.serving, change.desired, change.heals, change.revert) == (
        (1, 2),
        (1, 2),
        (2,),
        (),
    )
    load, verify = change.steps
    assert (load.action, load.versions, verify.action) == (Action.LOAD, (1, 2), Action.VERIFY)
    assert load.on_failure is OnFailure.STOP and verify.on_failure is OnFailure.STOP
    assert f"version 2 stopped answering: {DEAD}" in load.reason
    assert load.config is not None and heal_generation(load.config) == 1
    assert load.config["max_batch_size"] == 8
    assert load.config["parameters"] == {HEAL_MARKER: {"string_value": "1"}}

    clock = FakeClock()
    result = apply(p, {"s1": fake}, timing=Timing(clock=clock.clock, sleep=clock.sleep))
    assert result.ok and fake.ready("m") == {1, 2}
    # The marker is the reconciler's: not drift, and the next reload goes one higher.
    after = observe(fake)
    assert heal_generation(after.model("m").loaded_config) == 1
    assert not plan(desired, {"s1": after}, History(), "rev-1").has_changes
    again = plan(desired, {"s1": stopped(after, {1: DEAD})}, History(), "rev-1")
    assert heal_generation(again.changes[0].steps[0].config) == 2
    # What it tells: a warning naming the versions, and no hold (the spec is not at fault).
    (event,) = alerts_from(result, "hold")
    assert (event.kind, event.severity, event.resolved) == ("stopped-answering", "warning", False)
    assert event.summary == "m 2 on s1 stopped answering; reloaded in place, READY"
    assert not holds_from(result, desired, History())


def test_a_reload_in_place_that_fails_is_critical_and_holds_nothing() -> None:
    fake, desired = serving_m([1])
    p = plan(desired, {"s1": stopped(observe(fake), {1: DEAD})}, History(), "rev-1")
    fake.repository = {}  # the reload fails: the folder is gone from the repository
    clock = FakeClock()
    result = apply(p, {"s1": fake}, timing=Timing(clock=clock.clock, sleep=clock.sleep))
    (change,) = result.changes
    assert change.outcome is not Outcome.CONVERGED
    (event,) = alerts_from(result, "hold")
    assert (event.kind, event.severity) == ("stopped-answering", "critical")
    assert not holds_from(result, desired, History())


def test_a_version_not_ready_is_left_to_the_ordinary_change() -> None:
    fake, desired = serving_m([1])
    # The probes marked version 3, which is not READY (nor declared): nothing to reload.
    p = plan(desired, {"s1": stopped(observe(fake), {3: DEAD})}, History(), "rev-1")
    assert not p.has_changes


def test_the_marker_is_left_out_of_a_config_built_on() -> None:
    marked = {"backend": "python", "parameters": {HEAL_MARKER: {"string_value": "4"}}}
    assert without_heal_marker(marked) == {"backend": "python"}
    both = {"parameters": {HEAL_MARKER: {"string_value": "4"}, "k": {"string_value": "v"}}}
    assert without_heal_marker(both) == {"parameters": {"k": {"string_value": "v"}}}
    assert heal_generation(marked) == 4 and heal_generation({}) == 0
    assert heal_generation({"parameters": {HEAL_MARKER: {"string_value": "x"}}}) == 0


def test_a_reload_in_place_is_no_staged_rollout() -> None:
    # A deployment rolled out in stages (one server, then the rest): a version that stopped
    # answering on one server is reloaded there alone, with no stage and no webhook.
    fake_a, fake_b = FakeTriton("s1", {"m": range(1, 4)}), FakeTriton("s2", {"m": range(1, 4)})
    for fake in (fake_a, fake_b):
        fake.serve("m", [1])
    staged = replace(
        deploy("m", [1], servers=("s1", "s2")),
        rollout=RolloutSpec(steps=(1, "100%"), pre_step="http://127.0.0.1:9/before"),
    )
    desired = desired_state(staged, servers=("s1", "s2"))
    observed = {"s1": stopped(observe(fake_a), {1: DEAD}), "s2": observe(fake_b)}
    p = plan(desired, observed, History(), "rev-1")
    assert p.rollouts == ()
    (change,) = p.changes
    assert (change.server, change.heals) == ("s1", (1,))
