"""Operators' orders to a rollout in progress (issue 15): ``abort`` and ``promote`` as the
engine obeys them, on the Triton fake with a fake clock, and the rule that decides which
order applies (``core.orders.standing``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from reconciler.core.orders import resumed_since, standing
from reconciler.core.records import holds_from, rollouts_from
from reconciler.engine.apply import apply
from reconciler.engine.context import Timing
from reconciler.model.analysis import RolloutVerdict
from reconciler.model.history import History, OperatorOrder, OrderKind, StagedRecord
from reconciler.model.plan import Action
from reconciler.model.results import ApplyResult, FailureKind, Outcome
from tests.core.fakes import FakeClock, FakeTriton, desired_state
from tests.core.test_analyze_step import (
    HEALTHY,
    ScriptedFigures,
    analysis,
    only,
    plan_for,
    serving_one,
    watched,
)

START = 5_000.0  # the wall clock when the apply begins


def order(kind: OrderKind, at: float, by: str = "token:alice") -> OperatorOrder:
    return OperatorOrder(kind, "m", by, "2026-12-01T22:00:00Z", at, "paged")


class Orders:
    """The state store's orders, each becoming visible at its time on the fake clock."""

    def __init__(self, clock: FakeClock, given: Sequence[tuple[float, OperatorOrder]]) -> None:
        self.clock, self.given = clock, list(given)
        self.reads = 0

    def orders(self, deployment: str, since: float) -> list[OperatorOrder]:
        self.reads += 1
        return [
            o
            for shown, o in self.given
            if self.clock.elapsed >= shown and o.deployment == deployment and o.at_epoch >= since
        ]


def wall(clock: FakeClock) -> float:
    return START + clock.elapsed


def run_with(
    clock: FakeClock,
    given: Sequence[tuple[float, OperatorOrder]],
    load: float = 0.0,
    resumed: Mapping[str, float] | None = None,
) -> tuple[ApplyResult, FakeTriton, Orders]:
    fake = serving_one(clock, load)
    source = ScriptedFigures(fake, clock, HEALTHY)
    p = plan_for(desired_state(watched([2], analysis(interval=5.0, duration=20.0))), fake)
    orders = Orders(clock, given)
    result = apply(
        p,
        {"s1": fake},
        timing=Timing(clock=clock.clock, sleep=clock.sleep, wall=lambda: wall(clock)),
        metrics={"s1": source},
        orders=orders,
        resumed=resumed,
    )
    return result, fake, orders


def test_an_abort_during_the_analysis_puts_the_old_versions_back_within_a_fraction_of_a_second():
    clock = FakeClock()
    # Given 7 s into the analysis (after one evaluation, before the second at 10 s).
    result, fake, _ = run_with(clock, [(7.0, order(OrderKind.ABORT, START + 7.0))])

    change = only(result)
    assert change.outcome is Outcome.REVERTED and not result.ok
    analyze = change.analysis
    assert analyze is not None and not analyze.ok
    assert analyze.failure is FailureKind.AGAINST_VERSIONS  # held, like a failed analysis
    assert analyze.verdict == "aborted"
    assert len(analyze.evaluations) == 1  # the one made before the abort is kept
    assert analyze.error is not None and "aborted by token:alice" in analyze.error
    assert 7.0 <= analyze.seconds <= 7.0 + 0.35  # seen within ORDERS_EVERY plus a gap
    assert fake.ready("m") == {1}
    (hold,) = holds_from(result, desired_state(watched([2])), History())
    assert hold.deployment == "m" and "aborted by token:alice" in hold.reason


def test_an_abort_given_during_a_load_stops_the_rollout_before_its_verify_and_analysis():
    clock = FakeClock()
    result, fake, _ = run_with(clock, [(1.0, order(OrderKind.ABORT, START + 1.0))], load=3.0)

    change = only(result)
    assert change.outcome is Outcome.REVERTED
    failed = change.steps[-1]
    assert failed.step.action is Action.VERIFY and not failed.ok
    assert failed.failure is FailureKind.AGAINST_VERSIONS
    assert not any(s.step.action is Action.ANALYZE for s in change.steps)
    assert fake.ready("m") == {1}
    # History says it was aborted, though no analysis ran.
    (row,) = rollouts_from(result, 0.0)
    assert (row.outcome, row.verdict) == ("reverted", "aborted")


def test_a_promote_ends_the_running_analysis_as_promoted_and_the_rollout_converges():
    clock = FakeClock()
    result, fake, _ = run_with(clock, [(7.0, order(OrderKind.PROMOTE, START + 7.0))])

    change = only(result)
    assert change.outcome is Outcome.CONVERGED and result.ok
    analyze = change.analysis
    assert analyze is not None and analyze.ok and analyze.verdict is RolloutVerdict.PROMOTED
    assert analyze.seconds == pytest.approx(7.0, abs=0.35)  # not the 20 s duration
    assert fake.ready("m") == {2}  # the old version went after it


def test_an_order_given_before_the_apply_began_is_stale_and_ignored():
    clock = FakeClock()
    result, _, orders = run_with(clock, [(0.0, order(OrderKind.ABORT, START - 60.0))])

    change = only(result)
    assert change.outcome is Outcome.CONVERGED
    analyze = change.analysis
    assert analyze is not None and analyze.verdict is RolloutVerdict.PASSED
    assert analyze.seconds == pytest.approx(20.0)
    # Read often enough to see an order within ORDERS_EVERY, not on every wake.
    assert 20 / 0.25 * 0.8 <= orders.reads <= 20 / 0.25 * 1.5


def test_an_abort_given_while_no_reconciler_ran_is_obeyed_by_the_apply_that_resumes_it():
    # The pass that began the rollout was killed; the abort came 60 s before this apply,
    # after the last pass on record ended: it was meant for the rollout this apply resumes.
    clock = FakeClock()
    abort = order(OrderKind.ABORT, START - 60.0)
    result, fake, _ = run_with(clock, [(0.0, abort)], resumed={"m": START - 100.0})

    change = only(result)
    assert change.outcome is Outcome.REVERTED
    assert not any(s.step.action is Action.ANALYZE for s in change.steps)  # stopped at once
    assert fake.ready("m") == {1}
    # One given before the last pass on record ended stays stale, resumed or not.
    result, fake, _ = run_with(
        clock, [(0.0, order(OrderKind.ABORT, START - 200.0))], resumed={"m": START - 100.0}
    )
    assert only(result).outcome is Outcome.CONVERGED and fake.ready("m") == {2}


def test_a_rollout_is_resumed_for_its_orders_only_from_a_record_of_its_current_spec():
    desired = desired_state(watched([2]))
    current = desired.deployments["m"].fingerprint
    record = StagedRecord(current, frozenset(), {"s1": (1,)}, "rev-1")

    assert resumed_since(History(staged={"m": record}, last_pass_at=900.0), desired) == {"m": 900.0}
    # No pass ever recorded: every order given while the record exists counts.
    assert resumed_since(History(staged={"m": record}), desired) == {"m": 0.0}
    # A record of an earlier spec, or of a ModelDeployment no longer declared: not resumed.
    other = StagedRecord("an-earlier-spec", frozenset(), {"s1": (1,)}, "rev-1")
    assert resumed_since(History(staged={"m": other}, last_pass_at=900.0), desired) == {}
    assert resumed_since(History(staged={"gone": record}, last_pass_at=900.0), desired) == {}
    assert resumed_since(History(last_pass_at=900.0), desired) == {}


def test_which_order_applies():
    rollout, analysis_began = 100.0, 150.0
    promote_now = order(OrderKind.PROMOTE, 160.0)
    promote_before = order(OrderKind.PROMOTE, 120.0)  # during an earlier step
    full = order(OrderKind.PROMOTE_FULL, 120.0)
    abort = order(OrderKind.ABORT, 170.0)
    stale = order(OrderKind.ABORT, 90.0)

    assert standing([promote_now], rollout, analysis_began) is promote_now
    # A promote is for the analyses running when it was given, not a later one...
    assert standing([promote_before], rollout, analysis_began) is None
    # ... unless --full: every analysis left in the rollout.
    assert standing([full], rollout, analysis_began) is full
    # Between steps only an abort applies; an abort wins over a promote.
    assert standing([promote_now], rollout, None) is None
    assert standing([promote_now, abort], rollout, analysis_began) is abort
    assert standing([abort], rollout, None) is abort
    assert standing([stale], rollout, analysis_began) is None
