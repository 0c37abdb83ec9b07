"""What ``GET /v1/passes/last`` answers (``views/passes.py``'s ``pass_outcome``) about a pass
that leaves a ModelDeployment held: the pass that held it, and a later one with nothing to
do, both list the held model (what ``reconcile --service`` fails on, as ``flux reconcile``
fails on a stalled object), and a pass with no hold lists none."""

from __future__ import annotations

from pathlib import Path

from reconciler.loop.reconcile import reconcile
from reconciler.model.settings import Settings
from reconciler.model.source import Source
from reconciler.views.passes import pass_outcome
from tests.core.pass_fakes import FakeClient, World, deployment_yaml, server_yaml

SOURCE = Source("fake://manifests")


def deploy(world: World, *versions: int) -> str:
    return world.manifests.commit(
        {
            "servers/s1.yaml": server_yaml("s1"),
            "models/echo.yaml": deployment_yaml("echo", versions, ["s1"]),
        }
    )


def test_the_last_pass_lists_each_held_model_until_the_hold_is_lifted(tmp_path: Path) -> None:
    world = World()
    world.servers["s1"] = FakeClient("s1", {"echo": [1, 2, 3]})
    settings = Settings(cache_dir=tmp_path / "cache", state_path=tmp_path / "state.db")
    deploy(world, 1)
    first = reconcile(SOURCE, settings, world.ports(), apply_changes=True)
    assert pass_outcome(1, "schedule", "ok", 0.1, first, 0.0)["held"] == []

    world.servers["s1"].failing.add(("echo", 2))
    bad = deploy(world, 2)
    failed = pass_outcome(
        2,
        "operator",
        "partial",
        0.1,
        reconcile(SOURCE, settings, world.ports(), apply_changes=True),
        0.0,
    )
    expected = [
        {
            "deployment": "echo",
            "server": "s1",
            "model": "echo",
            "revision": bad,
            "reason": "server s1: failed to load 'echo' version 2: initialize failed",
        }
    ]
    assert not failed["ok"] and failed["held"] == expected

    # Nothing to do while held: the pass succeeds, and the hold is still listed.
    quiet = reconcile(SOURCE, settings, world.ports(), apply_changes=True)
    assert quiet.ok
    assert pass_outcome(3, "operator", "ok", 0.1, quiet, 0.0)["held"] == expected

    deploy(world, 3)  # a commit that changes the spec lifts the hold
    fixed = reconcile(SOURCE, settings, world.ports(), apply_changes=True)
    assert fixed.ok and pass_outcome(4, "operator", "ok", 0.1, fixed, 0.0)["held"] == []
    assert pass_outcome(5, "operator", "error", 0.1, None, 0.0)["held"] == []
