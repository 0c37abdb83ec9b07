"""One decision of a model's state on a server (``core/placement.py``): ``status``, the
conditions a pass records and the service's ``triton_gitops_model_state`` metric say the same
after the same pass; a rollout held by a pass reads ``held`` in each from that pass (the
shipped ModelHeld alert fires then, not one interval later)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reconciler.core.placement import held_after, model_states, pass_states, placement_state
from reconciler.loop.reconcile import reconcile
from reconciler.loop.status import status
from reconciler.model.results import Outcome
from reconciler.model.settings import Settings
from reconciler.model.source import Source
from tests.core.pass_fakes import FakeClient, World, deployment_yaml, server_yaml

SOURCE = Source("fake://manifests")


def deploy(world: World, *versions: int) -> str:
    return world.manifests.commit(
        {
            "servers/s1.yaml": server_yaml("s1"),
            "models/echo.yaml": deployment_yaml("echo", versions, ["s1"]),
            "models/other.yaml": deployment_yaml("other", [1], ["s1"]),
        }
    )


def shown(world: World, settings: Settings) -> dict[tuple[str, str], str]:
    """What ``status`` says of each model, run now."""
    return {(m.server, m.model): m.state for m in status(SOURCE, settings, world.ports()).models}


def test_a_rollout_held_by_a_pass_is_held_in_the_metric_and_status_from_that_pass(
    tmp_path: Path,
) -> None:
    world = World()
    world.servers["s1"] = FakeClient("s1", {"echo": [1, 2], "other": [1]})
    settings = Settings(cache_dir=tmp_path / "cache", state_path=tmp_path / "state.db")
    deploy(world, 1)
    assert reconcile(SOURCE, settings, world.ports(), apply_changes=True).ok
    world.servers["s1"].failing.add(("echo", 2))
    bad = deploy(world, 2)

    report = reconcile(SOURCE, settings, world.ports(), apply_changes=True)  # fails, holds

    assert report.result is not None
    assert [c.outcome for c in report.result.changes] == [Outcome.REVERTED]
    held = {("s1", "echo"): "held", ("s1", "other"): "in-sync"}
    assert shown(world, settings) == held
    assert pass_states(report) == held
    assert model_states(report) == held
    assert world.state.transitions[("echo", "Stalled")][0] == "True"
    (placement,) = held_after(report)
    assert (placement.deployment, placement.server, placement.revision) == ("echo", "s1", bad)
    assert placement.versions == (1,) and "failed to load 'echo' version 2" in placement.reason

    # The pass after plans from the hold: nothing to do, and still held everywhere.
    again = reconcile(SOURCE, settings, world.ports(), apply_changes=True)
    assert again.ok and again.held == ()
    assert model_states(again) == held == shown(world, settings)
    assert held_after(again) == (placement,)


@pytest.mark.parametrize(
    ("facts", "state"),
    [
        ({"unreachable": True, "problem": True, "held": True}, "unreachable"),
        ({"problem": True, "suspended": True, "held": True}, "problem"),
        ({"suspended": True, "held": True, "outcome": Outcome.REVERTED}, "suspended"),
        ({"held": True, "outcome": Outcome.REVERTED, "planned": True}, "held"),
        ({"outcome": Outcome.REVERTED, "planned": True}, "failed"),
        ({"outcome": Outcome.FAILED}, "failed"),
        ({"outcome": Outcome.INTERRUPTED, "planned": True}, "pending"),
        ({"outcome": Outcome.SKIPPED, "planned": True}, "pending"),
        ({"outcome": Outcome.CONVERGED, "planned": True}, "in-sync"),
        ({"planned": True}, "pending"),
        ({}, "in-sync"),
    ],
)
def test_the_first_state_that_applies_is_the_placements(facts: dict[str, Any], state: str) -> None:
    assert placement_state(**facts) == state
