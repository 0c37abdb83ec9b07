"""Refusals that say what to do, with plain fakes for every port (``pass_fakes.py``): a
state store of another repository, a last applied commit the mirror lacks, and a refusal
alerted once by the service (its PassMemory), not every pass."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reconciler.loop.memory import PassMemory
from reconciler.loop.reconcile import reconcile
from reconciler.model.errors import ForeignState, HistoryRewritten
from reconciler.model.reports import PassReport
from reconciler.model.settings import ApprovalSettings, Settings
from reconciler.model.source import Source
from tests.core.pass_fakes import World, deployment_yaml, server_yaml

SOURCE = Source("fake://manifests", path="models")


def deploy(world: World, *versions: int) -> str:
    return world.manifests.commit(
        {
            "models/s1.yaml": server_yaml("s1"),
            "models/echo.yaml": deployment_yaml("echo", versions, ["s1"]),
        }
    )


def run(
    world: World,
    settings: Settings,
    *,
    source: Source = SOURCE,
    apply_changes: bool = True,
    memory: PassMemory | None = None,
) -> PassReport:
    return reconcile(source, settings, world.ports(), apply_changes=apply_changes, memory=memory)


def test_the_first_recorded_pass_binds_the_store_and_a_plan_does_not(
    world: World, settings: Settings
) -> None:
    deploy(world, 1)
    run(world, settings, apply_changes=False)
    assert world.state.bound is None  # a plan writes nothing
    run(world, settings)
    assert world.state.bound == ("fake://manifests", "models")
    run(world, settings, source=replace(SOURCE, path="/models/"))  # the same folder


@pytest.mark.parametrize(
    ("recorded", "named"),
    [
        (("fake://other", "models"), "fake://other (folder 'models')"),
        (("fake://manifests", ""), "fake://manifests (the whole repository)"),
    ],
)
def test_a_store_bound_elsewhere_is_refused_naming_both_and_the_fix(
    world: World, settings: Settings, recorded: tuple[str, str], named: str
) -> None:
    world.state.bound = recorded
    deploy(world, 1)
    for apply_changes in (False, True):
        with pytest.raises(ForeignState) as raised:
            run(world, settings, apply_changes=apply_changes)
        said = str(raised.value)
        assert f"state file {settings.state_path} was made for {named}" in said
        assert "not for fake://manifests (folder 'models')" in said
        assert "--state" in said and "new state file" in said
    assert world.state.passes == []
    assert world.servers["s1"].ready("echo") == set()  # nothing applied
    assert world.alerts.kinds() == ["state-mismatch"]  # applying only


def test_a_repository_spelled_with_git_suffix_is_the_same(world: World, settings: Settings) -> None:
    world.state.bound = ("fake://manifests.git/", "models")
    deploy(world, 1)
    run(world, settings)
    assert world.servers["s1"].ready("echo") == {1}


def test_a_last_applied_commit_the_mirror_lacks_names_accept_rewrite(
    world: World, settings: Settings
) -> None:
    deploy(world, 1)
    run(world, settings)
    applied = world.state.passes[-1]["revision"]
    del world.manifests.revisions[applied]  # a fresh cache after a force-push
    head = deploy(world, 2)
    with pytest.raises(HistoryRewritten) as raised:
        run(world, settings)
    said = str(raised.value)
    assert f"the last applied revision {applied} is not in fake://manifests" in said
    assert f"--accept-rewrite {head[:12]}" in said
    assert world.servers["s1"].ready("echo") == {1}

    accepted = replace(settings, approval=ApprovalSettings(accept_rewrite=head[:12]))
    run(world, accepted)
    assert world.servers["s1"].ready("echo") == {2}


def test_every_rewrite_refusal_names_accept_rewrite() -> None:
    old, new = "a" * 40, "b" * 40
    for refusal in (HistoryRewritten(old, new), HistoryRewritten(old, new, missing_from="r")):
        assert f"--accept-rewrite {new[:12]}" in str(refusal)


def test_the_service_alerts_a_refusal_once_and_resolves_it(
    world: World, settings: Settings
) -> None:
    memory = PassMemory()
    deploy(world, 1)
    run(world, settings, memory=memory)
    head = deploy(world, 2)
    world.manifests.fast_forward = False  # a force-push
    for _ in range(3):
        with pytest.raises(HistoryRewritten):
            run(world, settings, memory=memory)
    refused = [e for e in world.alerts.sent if e.kind == "revision-refused"]
    assert len(refused) == 1 and not refused[0].resolved
    assert f"--accept-rewrite {head[:12]}" in refused[0].details["reason"]

    newer = deploy(world, 1)  # another head, still not a fast-forward: a new refusal
    with pytest.raises(HistoryRewritten):
        run(world, settings, memory=memory)
    assert [e.revision for e in world.alerts.sent if e.kind == "revision-refused"] == [
        head,
        newer,
    ]

    accepted = replace(settings, approval=ApprovalSettings(accept_rewrite=newer))
    run(world, accepted, memory=memory)
    last = [e for e in world.alerts.sent if e.kind == "revision-refused"][-1]
    assert last.resolved and last.revision == newer


def test_a_one_shot_apply_alerts_each_refusal(world: World, settings: Settings) -> None:
    deploy(world, 1)
    run(world, settings)
    deploy(world, 2)
    world.manifests.fast_forward = False
    for _ in range(2):
        with pytest.raises(HistoryRewritten):
            run(world, settings)
    assert world.alerts.kinds().count("revision-refused") == 2
