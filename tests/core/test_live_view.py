"""The live view ``status --watch`` prints (``views/live.py``): a pass in progress, and one
that a killed reconciler left behind (``abandoned``)."""

from __future__ import annotations

from typing import Any

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
