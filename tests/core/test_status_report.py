"""``status --model/--server``: the report narrowed to the rows asked for (model/reports.py)."""

from __future__ import annotations

from reconciler.model.reports import Condition, ModelStatus, StatusReport


def _row(server: str, model: str) -> ModelStatus:
    return ModelStatus(server, model, model, (2,), (1,), "pending")


REPORT = StatusReport(
    revision="abc",
    last_applied=None,
    models=(
        _row("edge-a", "echo"),
        _row("edge-a", "other"),
        _row("fleet/10.0.0.7", "echo"),
        _row("fleet-2/10.0.0.8", "echo"),
    ),
    unreachable={"fleet/10.0.0.7": "refused", "edge-b": "refused"},
    last_pass=None,
    conditions={
        "echo": (Condition("Ready", "False", "Progressing", "", "t"),),
        "other": (Condition("Ready", "False", "Progressing", "", "t"),),
    },
)


def test_a_fleet_by_its_name_is_its_instances_and_not_a_longer_name() -> None:
    narrowed = REPORT.narrowed(None, "fleet")
    assert [(m.server, m.model) for m in narrowed.models] == [("fleet/10.0.0.7", "echo")]
    assert dict(narrowed.unreachable) == {"fleet/10.0.0.7": "refused"}
    assert list(narrowed.conditions) == ["echo"]


def test_a_model_keeps_its_rows_and_its_deployments_conditions_only() -> None:
    narrowed = REPORT.narrowed("other", None)
    assert [(m.server, m.model) for m in narrowed.models] == [("edge-a", "other")]
    assert list(narrowed.conditions) == ["other"]
    assert dict(narrowed.unreachable) == dict(REPORT.unreachable)  # no server asked for
    assert REPORT.narrowed(None, None) == REPORT
