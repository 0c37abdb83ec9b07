"""Bounded history: each pass forgets passes, rollouts and on-call actions older than
``history_days``, and never the present (holds, open alerts, in-flight records) nor what the
next pass, ``status`` or ``undo`` start from."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.adapters import state_tables
from reconciler.adapters.state import StateStore
from reconciler.core.records import rfc3339
from reconciler.model.history import Hold, PassRecord, Rollout

DAY = 86400.0
START = 1.7e9


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def rollout(deployment: str, server: str, to: int, outcome: str, at: float) -> Rollout:
    return Rollout(
        revision=f"{to:040d}",
        deployment=deployment,
        server=server,
        model=deployment,
        from_versions=(to - 1,),
        to_versions=(to,),
        outcome=outcome,
        verdict=None,
        checks=(),
        error=None,
        rollback_seconds=None,
        finished_at=at,
    )


def count(store: StateStore, table: str) -> int:
    return int(store._db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


def test_history_older_than_the_retention_is_forgotten_and_the_present_kept(
    tmp_path: Path,
) -> None:
    clock = Clock()
    store = StateStore(tmp_path / "state.db", history_days=30, clock=clock)
    # Day 0: a good pass, echo converged to 2 on two servers, then 3 on edge-a; the scaler's
    # rollout failed (held, alert open) and other's is in flight; an operator suspended other.
    store.record_pass(
        PassRecord(
            "1" * 40,
            {"edge-a": frozenset({"echo"})},
            True,
            {},
            rollouts=(
                rollout("echo", "edge-a", 2, "converged", START),
                rollout("echo", "edge-b", 2, "converged", START),
                rollout("echo", "edge-a", 3, "converged", START + 1),
                rollout("scaler", "edge-a", 5, "reverted", START),
            ),
            holds=(Hold("scaler", "f", "1" * 40, "analysis failed", {"edge-a": (4,)}),),
            alerts_opened=(("scaler", "edge-a", "analysis-failed"),),
        )
    )
    store.record_stage("other", "g", "1" * 40, (), {"edge-a": (1,)})
    store.suspend("other", "alice")
    # Then a pass an hour for 40 days, the last one failing: nothing else happens.
    for hour in range(1, 40 * 24 + 1):
        clock.now = START + hour * 3600
        store.record_pass(PassRecord(f"{hour:040d}", {}, hour < 40 * 24, {}))
    store.record_action("reconcile", "echo", "bob")  # today's action

    # Passes: the last 30 days, and the latest that succeeded (the next pass starts from it).
    kept = [row[0] for row in store._db.execute("SELECT finished_at FROM passes")]
    assert min(kept) >= clock.now - 30 * DAY
    assert len(kept) == 30 * 24 + 1
    assert store.history().revision == f"{40 * 24 - 1:040d}"
    # Rollouts: each server's latest of each ModelDeployment (what status shows, what undo
    # goes back to), whatever its age; echo 2 on edge-a was superseded and is forgotten.
    assert sorted((r.deployment, r.server, r.to_versions) for r in store.rollouts()) == [
        ("echo", "edge-a", (3,)),
        ("echo", "edge-b", (2,)),
        ("scaler", "edge-a", (5,)),
    ]
    # The present is never history: the hold, the open alert, the in-flight record, the
    # suspension. The on-call action of 40 days ago is forgotten, today's kept.
    history = store.history()
    assert set(history.holds) == {"scaler"} and set(history.staged) == {"other"}
    assert store.open_alerts() == {("scaler", "edge-a", "analysis-failed")}
    assert [s.target for s in store.suspensions()] == ["other"]
    assert [(a.verb, a.target) for a in store.operator_actions()] == [("reconcile", "echo")]
    assert rfc3339(START) not in {a.at for a in store.operator_actions()}
    store.close()


def test_the_latest_converged_rollout_outlives_a_newer_failed_one(tmp_path: Path) -> None:
    clock = Clock()
    store = StateStore(tmp_path / "state.db", history_days=1, clock=clock)
    store.record_pass(
        PassRecord(
            "1" * 40,
            {},
            True,
            {},
            rollouts=(
                rollout("echo", "edge-a", 2, "converged", START),
                rollout("echo", "edge-a", 3, "converged", START + 1),
                rollout("echo", "edge-a", 4, "reverted", START + 2),
            ),
        )
    )
    clock.now = START + 10 * DAY
    store.record_pass(PassRecord("2" * 40, {}, True, {}))
    # undo goes back to the last converged spec: 3 stays beside the failed 4.
    assert [(r.to_versions, r.outcome) for r in store.rollouts("echo")] == [
        ((4,), "reverted"),
        ((3,), "converged"),
    ]
    store.close()


def test_zero_days_keeps_everything(tmp_path: Path) -> None:
    clock = Clock()
    store = StateStore(tmp_path / "state.db", history_days=0, clock=clock)
    for day in range(400):
        clock.now = START + day * DAY
        store.record_pass(PassRecord("1" * 40, {}, True, {}))
    assert count(store, "passes") == 400
    store.close()


def test_a_long_backlog_is_pruned_over_several_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A store from before retention: its first passes forget a batch each, never all at once.
    clock = Clock()
    store = StateStore(tmp_path / "state.db", history_days=0, clock=clock)
    for day in range(30):
        clock.now = START + day * DAY
        store.record_pass(PassRecord("1" * 40, {}, True, {}))
    store.close()
    monkeypatch.setattr(state_tables, "PRUNE_BATCH", 10)
    store = StateStore(tmp_path / "state.db", history_days=1, clock=clock)
    left = []
    for _ in range(4):
        store.record_pass(PassRecord("1" * 40, {}, True, {}))
        left.append(count(store, "passes"))
    # 31, 22, 13, 6 rows before each pass's prune: ten forgotten, ten, the eight left older
    # than a day, none (days 28 and 29 and the four passes of today are kept).
    assert left == [21, 12, 5, 6]
    store.close()
