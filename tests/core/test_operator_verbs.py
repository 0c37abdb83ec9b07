"""On-call verbs in the plan and the service's metric (issue 15): a suspension from the state
store leaves models as they are until resumed; the per-model state each pass reports."""

from __future__ import annotations

from dataclasses import replace

from reconciler.core.placement import model_states
from reconciler.core.plan.planner import plan
from reconciler.core.plan.settle import settle_key
from reconciler.loop.records import next_managed
from reconciler.model.history import ALL_DEPLOYMENTS, History, Hold, Suspension
from reconciler.model.reports import PassReport
from tests.core.fakes import FakeTriton, deploy, desired_state, observe
from tests.core.test_settled import fingerprinted

NOW = "2026-12-01T03:00:00Z"


def _fake() -> FakeTriton:
    fake = FakeTriton("s1", {"m": range(1, 4), "n": range(1, 4), "gone": [1]})
    fake.serve("m", [1])
    fake.serve("n", [1])
    fake.serve("gone", [1])
    return fake


def _history(*targets: str) -> History:
    return History(
        managed={"s1": frozenset({"m", "n", "gone"})},
        suspended={t: Suspension(t, "alice@host", NOW, "incident 42") for t in targets},
    )


def test_a_suspended_deployment_is_left_as_it_is_and_the_others_go_on() -> None:
    desired = desired_state(deploy("m", [2]), deploy("n", [2]))
    found = plan(desired, {"s1": observe(_fake())}, _history("m"), "rev")
    assert found.suspended == (("s1", "m"),)
    assert {(c.model, c.desired) for c in found.changes} == {("n", (2,)), ("gone", ())}


def test_suspending_everything_plans_no_load_no_unload_and_no_route() -> None:
    desired = desired_state(deploy("m", [2]), deploy("n", [2]))
    found = plan(desired, {"s1": observe(_fake())}, _history(ALL_DEPLOYMENTS), "rev")
    assert found.suspended == (("s1", "m"), ("s1", "n"))
    assert not found.has_changes  # "gone" is not removed either
    # Resumed: the same inputs plan every change again.
    resumed = plan(desired, {"s1": observe(_fake())}, _history(), "rev")
    assert {c.model for c in resumed.changes} == {"m", "n", "gone"}


def test_a_suspend_or_resume_plans_the_server_anew() -> None:
    desired = fingerprinted(desired_state(deploy("m", [1]), deploy("n", [1])))
    observed = replace(observe(_fake()), token=("observed",))
    keys = {
        name: settle_key("s1", desired, observed, history)
        for name, history in (
            ("none", _history()),
            ("m", _history("m")),
            ("all", _history(ALL_DEPLOYMENTS)),
            ("other", _history("unrelated")),
        )
    }
    assert keys["none"] is not None
    assert len({keys["none"], keys["m"], keys["all"]}) == 3
    assert keys["other"] == keys["none"]  # another deployment's suspension changes nothing here


def test_the_suspension_says_who_when_and_why() -> None:
    history = _history(ALL_DEPLOYMENTS)
    assert str(history.suspension_of("m")) == (
        "every ModelDeployment suspended by alice@host at 2026-12-01T03:00:00Z: incident 42"
    )
    assert _history().suspension_of("m") is None


def test_each_model_reports_one_state_after_a_pass() -> None:
    fake = _fake()
    desired = desired_state(deploy("m", [2]), deploy("n", [1]), deploy("o", [1]))
    hold = Hold("o", desired.deployments["o"].fingerprint, "bad", "analysis failed", {"s1": ()})
    history = History(
        managed={"s1": frozenset({"m", "n", "gone"})},
        holds={"o": hold},
        suspended={"n": Suspension("n", "bob", NOW)},
    )
    found = plan(desired, {"s1": observe(fake)}, history, "rev")
    states = model_states(PassReport("rev", found))
    assert states == {("s1", "m"): "progressing", ("s1", "n"): "suspended", ("s1", "o"): "held"}


def test_while_everything_is_suspended_no_model_is_forgotten() -> None:
    """A model the manifests drop while everything is suspended stays ours, so the pass after
    the resume removes it (and a server dropped meanwhile keeps its models too)."""
    desired = desired_state(deploy("m", [1]))
    before = History(managed={"s1": frozenset({"m", "gone"}), "old": frozenset({"x"})})
    for history, expected in (
        # Not suspended: "gone" stays ours only until its planned removal goes through, and
        # the dropped server "old" is forgotten.
        (before, {"s1": frozenset({"m", "gone"}), "old": frozenset()}),
        (
            replace(before, suspended={ALL_DEPLOYMENTS: Suspension(ALL_DEPLOYMENTS, "a", NOW)}),
            {"s1": frozenset({"m", "gone"}), "old": frozenset({"x"})},
        ),
    ):
        found = plan(desired, {"s1": observe(_fake())}, history, "rev")
        assert next_managed(desired, history, found, None) == expected
