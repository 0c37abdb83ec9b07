"""The live view ``status --watch`` prints (``views/live.py``): a pass in progress, and one
that a killed reconciler left behind (``abandoned``)."""

from __future__ import annotations

from typing import Any

from reconciler.loop.live import LiveStatus
from reconciler.model.plan import Action, Plan, Step
from reconciler.model.results import Draining
from reconciler.views.live import live_text

NOW = 1_000.0


def _snapshot(**extra: Any) -> dict[str, Any]:
    return {
        "revision": "0123456789abcdef",
        "pass_started_at": "2026-12-02T05:00:00Z",
        "updated_at": "2026-12-02T05:00:40Z",
        "rollouts": [
            {
                "deployment": "echo",
                "model": "echo",
                "servers": {
                    "edge-a": {
                        "state": "analyzing",
                        "versions": [2],
                        "since_epoch": NOW - 30.0,
                        "analysis_ends_epoch": NOW + 30.0,
                    }
                },
            }
        ],
        **extra,
    }


def test_a_pass_in_progress_shows_how_long_each_step_has_run_and_what_is_left() -> None:
    assert live_text(_snapshot(), NOW).splitlines() == [
        "pass at 0123456789ab, started 2026-12-02T05:00:00Z, updated 2026-12-02T05:00:40Z",
        "echo (model echo)",
        "  edge-a: analyzing [2] for 30s, 30s left",
    ]


def test_a_snapshot_left_by_a_killed_reconciler_says_nothing_runs_and_where_it_stopped() -> None:
    # An hour later: no duration goes on growing, no analysis time is "left".
    assert live_text(_snapshot(abandoned=True), NOW + 3600).splitlines() == [
        "pass at 0123456789ab, started 2026-12-02T05:00:00Z, updated 2026-12-02T05:00:40Z",
        "not running: the reconciler that wrote this stopped mid-pass (nobody holds the "
        "reconciler lock); the next pass resumes these rollouts",
        "echo (model echo)",
        "  edge-a: last seen analyzing [2]",
    ]


def test_no_rollout_in_progress() -> None:
    assert live_text(None, NOW) == "no rollout in progress"
    assert live_text({"rollouts": []}, NOW) == "no rollout in progress"


def test_a_drain_says_what_still_reaches_the_model_and_the_next_step_forgets_it() -> None:
    """Issue 44, point 2: ``LiveStatus`` keeps a drain's latest reading for the live view
    (``status --watch``, ``GET /status``) while the drain runs, and drops it when the
    server's next step starts."""
    written: list[Any] = []
    plan = Plan("rev-2")
    live = LiveStatus(plan, written.append, wall=lambda: NOW)
    drain = Step("edge-a", "counter", Action.DRAIN, (1,), "wait until counter is idle here")
    live.started(drain, False)
    live.draining(drain, Draining(6.5, 0.0, 0.0, 5.0, 281.4))
    entry = written[-1]["rollouts"][0]["servers"]["edge-a"]
    assert entry["draining"] == {
        "requests_per_second": 6.5,
        "pending": 0.0,
        "quiet_seconds": 0.0,
        "idle_seconds": 5.0,
        "seconds_left": 281.4,
    }
    assert live_text(written[-1], NOW + 12).splitlines()[-2:] == [
        "  edge-a: draining [1] for 12s",
        "    draining: 6.5 request(s)/s still arriving (the sequences in flight); quiet 0s of "
        "the 5s that end it; at most 281s more",
    ]
    live.started(Step("edge-a", "counter", Action.LOAD, (1, 2), "load"), False)
    assert "draining" not in written[-1]["rollouts"][0]["servers"]["edge-a"]
