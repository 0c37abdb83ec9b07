"""The planner's short-cut for settled servers (``settle_key``, ``plan(settled=...)``) and
the service's ``PassMemory`` that drives it: a server is skipped only when planning it again
would give the same answer."""

from __future__ import annotations

import hashlib
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.core.plan.planner import plan
from reconciler.core.plan.settle import settle_key
from reconciler.engine.apply import apply
from reconciler.loop.memory import PassMemory
from reconciler.model.history import History, Hold
from reconciler.model.spec import DesiredState
from tests.core.fakes import deploy, desired_state
from tests.core.test_plan import MODELS, Scenario, fake_timing, observe_all, scenarios, server


def fingerprinted(desired: DesiredState) -> DesiredState:
    """``desired`` with each deployment's fingerprint set, as the manifest loader sets it."""
    return DesiredState.build(
        list(desired.servers.values()),
        [
            replace(d, fingerprint=hashlib.sha256(repr(d).encode()).hexdigest()[:16])
            for d in desired.deployments.values()
        ],
    )


def test_an_in_sync_server_settles_on_the_second_pass_and_drift_unsettles_it() -> None:
    fake = server(models=("m", "n"))
    fake.serve("m", {1})
    fake.serve("n", {2})
    desired = fingerprinted(desired_state(deploy("m", [1]), deploy("n", [2])))
    memory = PassMemory()

    def one_pass() -> frozenset[str]:
        serving = observe_all({"s1": fake})
        settled, keys = memory.settled(desired, serving, History())
        p = plan(desired, serving, History(), "rev", settled=settled)
        memory.remember_plan(keys, p)
        assert p == plan(desired, serving, History(), "rev")
        return settled

    assert one_pass() == frozenset()  # nothing remembered yet
    assert one_pass() == {"s1"}
    fake.unload("n")  # by hand: the index changes, so does the key
    assert one_pass() == frozenset()
    p = plan(desired, observe_all({"s1": fake}), History(), "rev")
    assert [(c.server, c.model) for c in p.changes] == [("s1", "n")]


def test_no_key_without_a_token_or_a_fingerprint() -> None:
    fake = server()
    fake.serve("m", {1})
    observed = observe_all({"s1": fake})["s1"]
    unprinted = desired_state(deploy("m", [1]))
    printed = fingerprinted(unprinted)

    assert settle_key("s1", unprinted, observed, History()) is None
    assert settle_key("s1", printed, replace(observed, token=None), History()) is None
    assert settle_key("s1", printed, observed, History()) is not None


def test_a_hold_a_backend_or_a_managed_model_changes_the_key() -> None:
    fake = server()
    fake.serve("m", {1})
    desired = fingerprinted(desired_state(deploy("m", [1])))
    observed = observe_all({"s1": fake})["s1"]
    fingerprint = desired.deployments["m"].fingerprint
    base = settle_key("s1", desired, observed, History())
    others = [
        History(holds={"m": Hold("m", fingerprint, "rev", "failed", {"s1": (1,)})}),
        History(backends={"m": "abc"}),
        History(managed={"s1": frozenset({"m", "old"})}),
    ]
    for history in others:
        assert settle_key("s1", desired, observed, history) != base, history


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.lists(st.sampled_from(["apply", "unload", "bump", "forget", "none"])))
def test_a_settled_server_plans_as_a_full_plan_would(scenario: Scenario, events: list[str]) -> None:
    """Over passes with changes in between (an apply, a hand unload, a new spec, a model no
    longer ours, nothing), the plan with the memory's short-cut is the full plan."""
    fakes = scenario.fakes()
    desired = fingerprinted(scenario.desired())
    history = scenario.history()
    memory = PassMemory()
    for event in ["none", *events, "none"]:
        serving = observe_all(fakes)
        settled, keys = memory.settled(desired, serving, history)
        full = plan(desired, serving, history, "rev")
        assert plan(desired, serving, history, "rev", settled=settled) == full
        memory.remember_plan(keys, full)
        if event == "apply":
            apply(full, fakes, timing=fake_timing())
        elif event == "unload":
            for fake in fakes.values():
                for m in MODELS:
                    if fake.ready(m):
                        fake.unload(m)
                        break
        elif event == "bump" and desired.deployments:
            first = next(iter(desired.deployments.values()))
            bumped = replace(first, versions=(*first.versions, 6), fingerprint="")
            others = [d for d in desired.deployments.values() if d is not first]
            desired = fingerprinted(
                DesiredState.build(list(desired.servers.values()), [bumped, *others])
            )
        elif event == "forget":
            history = History(history.revision, {s: frozenset() for s in history.managed})
