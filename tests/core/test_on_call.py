"""The on-call verbs as ``loop.on_call`` carries them out for the command line and the service
alike: what each records, and why it refuses, on a real state store (SQLite, in tmp_path)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.adapters.state import StateStore
from reconciler.loop.on_call import give, never_applied
from reconciler.model.history import ALL_DEPLOYMENTS, Hold, OperatorOrder, OrderKind, Suspension


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StateStore]:
    opened = StateStore(tmp_path / "state.db")
    try:
        yield opened
    finally:
        opened.close()


def test_suspend_then_resume_records_both_and_says_what_is_still_suspended(
    store: StateStore,
) -> None:
    everything = give(store, "suspend", None, "alice", "incident 42")
    one = give(store, "suspend", "echo", "bob")
    resumed = give(store, "resume", "echo", "bob")

    assert isinstance(everything.record, Suspension), everything
    assert (everything.target, everything.what) == (ALL_DEPLOYMENTS, "every ModelDeployment")
    assert (one.target, one.what, one.asks_for_a_pass) == ("echo", "ModelDeployment echo", False)
    assert not resumed.refused and resumed.asks_for_a_pass, resumed
    assert resumed.record == one.record
    assert [s.target for s in resumed.still_suspended] == [ALL_DEPLOYMENTS]
    assert [(a.verb, a.target) for a in store.operator_actions()][:3] == [
        ("resume", "echo"),
        ("suspend", "echo"),
        ("suspend", ALL_DEPLOYMENTS),
    ]


def test_resume_of_what_is_not_suspended_is_refused_and_records_nothing(
    store: StateStore,
) -> None:
    done = give(store, "resume", "echo", "bob")

    assert (done.refused, done.record, done.asks_for_a_pass) == ("not suspended", None, False)
    assert store.operator_actions() == []


def test_retry_lifts_the_hold_or_names_those_held(store: StateStore) -> None:
    store.record_hold(Hold("held-one", "fp", "a" * 40, "latency p99 4.1 ms > 2 ms", {}))

    refused = give(store, "retry", "echo", "bob")
    lifted = give(store, "retry", "held-one", "bob")

    assert (refused.refused, refused.held) == ("not held", ("held-one",)), refused
    assert isinstance(lifted.record, Hold) and lifted.asks_for_a_pass, lifted
    assert store.history().holds == {}


def test_an_order_needs_a_rollout_in_progress(store: StateStore) -> None:
    refused = give(store, "abort", "echo", "carol", "pager")
    store.record_stage("echo", "fp", "b" * 40, [], {"s1": (2,)})
    given = give(store, str(OrderKind.PROMOTE_FULL), "echo", "carol")

    assert (refused.refused, refused.in_progress) == ("no rollout in progress", ()), refused
    assert isinstance(given.record, OperatorOrder), given
    assert (given.record.kind, given.asks_for_a_pass) == (OrderKind.PROMOTE_FULL, False)
    assert [o.kind for o in store.orders("echo", 0.0)] == [OrderKind.PROMOTE_FULL]


def test_reconcile_is_recorded_for_everything_and_asks_for_a_pass(store: StateStore) -> None:
    done = give(store, "reconcile", None, "token:ci", "after the fix")

    assert (done.target, done.asks_for_a_pass) == (ALL_DEPLOYMENTS, True)
    assert [(a.verb, a.detail) for a in store.operator_actions()] == [
        ("reconcile", "after the fix")
    ]


def test_a_name_no_pass_or_verb_has_met_is_told_apart(store: StateStore) -> None:
    give(store, "suspend", "echo", "bob")

    assert never_applied(store, "ecoh")
    assert not never_applied(store, "echo")


def test_a_verb_that_is_not_on_the_record_is_an_error(store: StateStore) -> None:
    with pytest.raises(ValueError, match="undo"):
        give(store, "undo", "echo", "bob")
