"""A ModelDeployment's Ready, Reconciling and Stalled conditions (``core/conditions.py``):
each state's statuses and reasons, a fleet's worst placement speaking for it, the transition
time kept while a status holds, and the pass and ``status`` agreeing through the fakes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from reconciler.core.conditions import (
    CONDITION_TYPES,
    PlacementState,
    conditions,
)
from reconciler.core.records import rfc3339
from reconciler.loop.reconcile import reconcile
from reconciler.loop.status import status
from reconciler.model.errors import ValidationError
from reconciler.model.settings import Settings
from reconciler.model.source import Source
from reconciler.views.render import status_json, status_text
from tests.core.pass_fakes import FakeClient, World, deployment_yaml, server_yaml

NOW = "2026-12-01T22:13:05Z"
EARLIER = "2026-11-30T08:00:00Z"
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def statuses(found: tuple[Any, ...]) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in found}


@pytest.mark.parametrize(
    ("state", "verdict", "expected"),
    [
        ("in-sync", None, {"Ready": ("True", "RolloutSucceeded"),
                           "Reconciling": ("False", "RolloutSucceeded"),
                           "Stalled": ("False", "RolloutSucceeded")}),
        ("pending", None, {"Ready": ("False", "Progressing"),
                           "Reconciling": ("True", "Progressing"),
                           "Stalled": ("False", "Progressing")}),
        ("failed", None, {"Ready": ("False", "RetryingFailedStep"),
                          "Reconciling": ("True", "RetryingFailedStep"),
                          "Stalled": ("False", "RetryingFailedStep")}),
        ("held", "failed", {"Ready": ("False", "Held"),
                            "Reconciling": ("False", "Held"),
                            "Stalled": ("True", "AnalysisFailed")}),
        ("held", "aborted", {"Ready": ("False", "Held"),  # an operator's abort
                             "Reconciling": ("False", "Held"),
                             "Stalled": ("True", "Aborted")}),
        ("held", None, {"Ready": ("False", "Held"),
                        "Reconciling": ("False", "Held"),
                        "Stalled": ("True", "RolloutFailed")}),
        ("problem", None, {"Ready": ("False", "PlanFailed"),
                           "Reconciling": ("False", "PlanFailed"),
                           "Stalled": ("True", "PlanFailed")}),
        ("suspended", None, {"Ready": ("Unknown", "Suspended"),
                             "Reconciling": ("False", "Suspended"),
                             "Stalled": ("False", "Suspended")}),
        ("unreachable", None, {"Ready": ("Unknown", "ServerUnreachable"),
                               "Reconciling": ("False", "ServerUnreachable"),
                               "Stalled": ("False", "ServerUnreachable")}),
    ],
)  # fmt: skip
def test_each_state_gives_its_statuses_and_reasons(
    state: str, verdict: str | None, expected: dict[str, tuple[str, str]]
) -> None:
    found = conditions("echo", [PlacementState("s1", state, "why", verdict)], {}, NOW)

    assert [c.type for c in found] == list(CONDITION_TYPES)
    assert statuses(found) == expected
    assert all(c.last_transition_time == NOW for c in found)  # nothing remembered
    assert all(c.message.startswith("s1: ") for c in found)


def test_the_worst_server_speaks_for_a_fleet() -> None:
    found = conditions(
        "echo",
        [
            PlacementState("s1", "in-sync"),
            PlacementState("s2", "held", "revision abc failed: p99 too high", "failed"),
            PlacementState("s3", "pending", "load [2]"),
        ],
        {},
        NOW,
    )

    assert statuses(found) == {
        "Ready": ("False", "Held"),
        "Reconciling": ("True", "Progressing"),
        "Stalled": ("True", "AnalysisFailed"),
    }
    by_type = {c.type: c for c in found}
    # Ready=False is about both servers that are not ready, the held one first.
    assert by_type["Ready"].message == "s2: revision abc failed: p99 too high; s3: load [2]"
    assert by_type["Reconciling"].message == "s3: load [2]"


def test_a_fleet_is_ready_only_when_every_server_is() -> None:
    ready = conditions("echo", [PlacementState(f"s{i}", "in-sync") for i in range(5)], {}, NOW)
    assert statuses(ready)["Ready"] == ("True", "RolloutSucceeded")
    assert ready[0].message.endswith("; and 2 more server(s)")

    unseen = [PlacementState("s1", "in-sync"), PlacementState("s2", "unreachable", "refused")]
    assert statuses(conditions("echo", unseen, {}, NOW))["Ready"] == (
        "Unknown",
        "ServerUnreachable",
    )


def test_the_transition_time_moves_only_when_the_status_does() -> None:
    remembered = {
        ("echo", "Ready"): ("True", EARLIER),
        ("echo", "Reconciling"): ("True", EARLIER),  # it was progressing; now it is not
    }
    found = {
        c.type: c for c in conditions("echo", [PlacementState("s1", "in-sync")], remembered, NOW)
    }

    assert found["Ready"].last_transition_time == EARLIER
    assert found["Reconciling"].last_transition_time == NOW
    assert found["Stalled"].last_transition_time == NOW  # never remembered
    # Another deployment's memory is not this one's.
    other = conditions("other", [PlacementState("s1", "in-sync")], remembered, NOW)
    assert {c.last_transition_time for c in other} == {NOW}


def test_rfc3339_is_utc_to_the_second() -> None:
    assert rfc3339(1_700_000_000.75) == "2023-11-14T22:13:20Z"


SOURCE = Source("fake://manifests")


def one_server(tmp_path: Path) -> tuple[World, Settings]:
    world = World()
    world.servers["s1"] = FakeClient("s1", {"echo": [1, 2]})
    return world, Settings(cache_dir=tmp_path / "cache", state_path=tmp_path / "state.db")


def deploy(world: World, *versions: int) -> None:
    world.manifests.commit(
        {
            "servers/s1.yaml": server_yaml("s1"),
            "models/echo.yaml": deployment_yaml("echo", versions, ["s1"]),
        }
    )


def shown_conditions(world: World, settings: Settings) -> list[tuple[str, str, str, str]]:
    shown = json.loads(status_json(status(SOURCE, settings, world.ports())))
    (deployment,) = shown["deployments"]
    assert deployment["name"] == "echo"
    return [
        (c["type"], c["status"], c["reason"], c["lastTransitionTime"])
        for c in deployment["conditions"]
    ]


def test_a_pass_remembers_the_transitions_and_status_shows_them(tmp_path: Path) -> None:
    world, settings = one_server(tmp_path)
    deploy(world, 1)
    # What an earlier pass left: echo was Ready=True since EARLIER, and reconciling.
    world.state.transitions = {
        ("echo", "Ready"): ("True", EARLIER),
        ("echo", "Reconciling"): ("True", EARLIER),
        ("gone", "Ready"): ("False", EARLIER),
    }
    reconcile(SOURCE, settings, world.ports(), apply_changes=True)

    remembered = world.state.transitions
    assert remembered[("echo", "Ready")] == ("True", EARLIER)  # still ready: time kept
    status_now, since = remembered[("echo", "Reconciling")]
    assert status_now == "False" and since != EARLIER and RFC3339.match(since)
    assert remembered[("echo", "Stalled")][0] == "False"
    assert ("gone", "Ready") not in remembered  # no longer declared: forgotten

    assert shown_conditions(world, settings) == [
        ("Ready", "True", "RolloutSucceeded", EARLIER),
        ("Reconciling", "False", "RolloutSucceeded", since),
        ("Stalled", "False", "RolloutSucceeded", remembered[("echo", "Stalled")][1]),
    ]


def test_a_rollout_held_by_this_pass_is_stalled_from_this_pass(tmp_path: Path) -> None:
    world, settings = one_server(tmp_path)
    deploy(world, 1)
    reconcile(SOURCE, settings, world.ports(), apply_changes=True)
    world.state.transitions = {k: (v[0], EARLIER) for k, v in world.state.transitions.items()}
    world.servers["s1"].failing.add(("echo", 2))
    deploy(world, 2)
    reconcile(SOURCE, settings, world.ports(), apply_changes=True)  # fails, reverts, holds

    remembered = world.state.transitions
    assert remembered[("echo", "Stalled")][0] == "True"  # the plan did not know the hold yet
    stalled_since = remembered[("echo", "Stalled")][1]
    assert stalled_since != EARLIER
    assert remembered[("echo", "Ready")] == ("False", stalled_since)
    assert remembered[("echo", "Reconciling")] == ("False", EARLIER)  # False before and after
    # status, planning from the hold, agrees: no transition it has not recorded.
    assert shown_conditions(world, settings) == [
        ("Ready", "False", "Held", stalled_since),
        ("Reconciling", "False", "Held", EARLIER),
        ("Stalled", "True", "RolloutFailed", stalled_since),
    ]


def test_status_with_invalid_manifests_at_the_head_still_shows_what_serves(
    tmp_path: Path,
) -> None:
    """Issue 45, point 5: a broken commit at the tracked head left `status` with the errors
    alone. It shows the rows as the last applied revision declares them, with the head's
    problems beside them as one condition of the source (Argo CD's ComparisonError); with
    nothing applied yet, the problems alone, as before."""
    world, settings = one_server(tmp_path)
    deploy(world, 1)
    applied = world.manifests.head
    reconcile(SOURCE, settings, world.ports(), apply_changes=True)
    broken = world.manifests.commit(
        {
            "servers/s1.yaml": server_yaml("s1"),
            "models/echo.yaml": deployment_yaml("echo", (2,), ["s1"]).replace(
                "versions:", "version:"
            ),
        }
    )

    report = status(SOURCE, settings, world.ports())
    shown = json.loads(status_json(report))
    assert shown["revision"] == broken and shown["manifests"]["declared_at"] == applied, shown
    assert shown["manifests"]["valid"] is False
    assert [p["message"] for p in shown["manifests"]["problems"]] == [
        "spec: unknown key 'version'; did you mean 'versions'?"
    ], shown["manifests"]
    rows = [(m["model"], m["desired"], m["serving"], m["state"]) for m in shown["models"]]
    assert rows == [("echo", [1], [1], "in-sync")], rows
    text = status_text(report)
    assert f"MANIFESTS INVALID at {broken[:12]}: 1 problem(s)" in text, text
    assert "models/echo.yaml:" in text and "did you mean 'versions'" in text, text

    fresh, settings = one_server(tmp_path / "fresh")
    typo = deployment_yaml("echo", (1,), ["s1"]).replace("ModelDeployment", "ModelDeploymnet")
    fresh.manifests.commit({"servers/s1.yaml": server_yaml("s1"), "models/echo.yaml": typo})
    with pytest.raises(ValidationError):
        status(SOURCE, settings, fresh.ports())
